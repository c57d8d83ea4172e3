"""benchmarks/planning_speed.py: both searches of a case in one process, their picks compared,
the record and its table written."""

import json
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from benchmarks import planning_commands, planning_speed
from layerslide.tuner import SearchSpace

# two candidates of 1B: a case that runs both searches in seconds
TINY = SearchSpace(windows=(2,), micro_batches=(2, 8), grad_accums=(1,),
                   activations=("host",), casts=("cpu_once",), fill_gpu_updates=False)


def test_a_case_runs_both_searches_and_compares_their_picks(monkeypatch, tmp_path):
    monkeypatch.setitem(planning_speed.SPACES, "tiny", TINY)
    row = planning_speed.run_case(("llama-3.2-1b", "rtx4090-256gb", 24, "tiny"), 1, 0.0)
    assert row["identical"] and row["tokens_per_s_ratio"] == 1.0
    assert row["exhaustive"]["simulated"] == row["exhaustive"]["searched"] == 2
    assert row["fast"]["simulated"] + row["fast"]["not_simulated"] == 2
    assert row["exhaustive"]["pick"]["micro_batch"] in (2, 8)
    total = planning_speed.summary([row])
    assert total["identical_fraction"] == 1.0 and total["min_tokens_per_s_ratio"] == 1.0
    table = planning_speed.markdown([row], total, "python benchmarks/planning_speed.py", "x")
    assert "| llama-3.2-1b | rtx4090-256gb | 24 | tiny |" in table
    assert "1 of 1 picks identical" in table
    json.dumps(row)  # the record is plain JSON


def test_the_quality_set_has_at_least_30_cases_over_every_profile():
    cases = planning_speed.quality_cases()
    assert len(cases) >= 30
    from layerslide.hwprofiles import builtin_profiles
    assert {c[1] for c in cases} == {p.name for p in builtin_profiles()}
    assert all(c[3] in planning_speed.SPACES for c in cases)


def test_a_command_runs_as_a_user_runs_it_both_ways_and_its_answers_compare(monkeypatch):
    tiny = (["tune", "--model", "llama-3.2-1b", "--profile", "rtx4090-256gb", "--windows", "2",
             "--micro-batches", "2,8", "--grad-accums", "1", "--activations", "host",
             "--casts", "cpu_once", "--no-gpu-updates", "--json"], "tune", 20)
    monkeypatch.setitem(planning_commands.COMMANDS, "tiny", tiny)
    row = planning_commands.run_command("tiny", None)
    runs = row["runs"]
    assert set(runs) == {"exhaustive", "fast"} and runs["exhaustive"]["argv"][-1] == "--exhaustive"
    assert all(r["rc"] == 0 and r["wall_s"] > 0 for r in runs.values())
    assert runs["fast"]["answer"]["micro_batch"] in (2, 8)
    assert row["same_answer"] == {"exhaustive": True}
    table = planning_commands.markdown([row], "python benchmarks/planning_commands.py", "x")
    assert "| `tune --model llama-3.2-1b" in table and "exhaustive: yes" in table
