"""`layerslide tune --gpus N --hosts M` and `whatif --gpu-counts`: one GPU or several, each
answered with tokens/s over every rank and what bounds it; refusals before any work."""

import json

from layerslide.cli.main import main

# a 1B model in a space of a few candidates: seconds a tune
SMALL = ("--model", "llama-3.2-1b", "--windows", "2", "--micro-batches", "4",
         "--grad-accums", "1,4", "--accumulations", "layer_major", "--casts", "cpu_once")


def run(capsys, *argv):
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def test_tune_on_two_gpus_tunes_one_rank_and_counts_every_ranks_tokens(capsys, tmp_path):
    plan = tmp_path / "plan.json"
    code, out, _ = run(capsys, "tune", *SMALL, "--profile", "h100-sxm-x2", "--gpus", "2",
                       "--json", "-o", str(plan))
    assert code == 0, out
    best = json.loads(out)["best"]
    assert (best["gpus"], best["hosts"]) == (2, 1)
    assert best["tokens_per_step"] == 2 * best["micro_batch"] * best["grad_accum"] * 1024
    assert best["gpu_updated_blocks"] == 0
    saved = json.loads(plan.read_text())
    assert saved["train"]["gpus"] == 2


def test_tune_text_names_the_ranks(capsys):
    code, out, _ = run(capsys, "tune", *SMALL, "--profile", "h100-sxm-x8", "--gpus", "4",
                       "--hosts", "2")
    assert code == 0, out
    assert "4 GPUs x 2 hosts of h100-sxm-x8" in out and "tokens_per_step" in out


def test_tune_refuses_more_gpus_than_the_profile_holds(capsys):
    code, _, err = run(capsys, "tune", *SMALL, "--profile", "h200-bench", "--gpus", "2")
    assert code == 2
    assert "holds 1" in err and "tune with --gpus 1 or fewer" in err


def test_whatif_answers_one_gpu_or_several_with_the_speedup_and_the_bound(capsys):
    code, out, err = run(capsys, "whatif", "--model", "llama-3.2-1b", "--gpu-counts", "1,2,4",
                         "--profiles", "h100-sxm-x2", "--json")
    assert code == 0, out
    rows = json.loads(out)["rows"]
    assert [(r["gpus"], r["hosts"]) for r in rows] == [(1, 1), (2, 1)]
    assert all(r["feasible"] and r["bound"] for r in rows)
    # one GPU holds some blocks' updates (a fill several ranks do not take): less than 2x
    assert rows[0]["speedup"] == 1.0
    assert rows[1]["speedup"] == rows[1]["tokens_per_s"] / rows[0]["tokens_per_s"] > 1.1
    assert "h100-sxm-x2 holds 2 GPUs: 4 not tried" in err


def test_whatif_text_has_the_speedup_column(capsys):
    code, out, _ = run(capsys, "whatif", "--model", "llama-3.2-1b", "--gpu-counts", "1,2",
                       "--host-counts", "1,2", "--profiles", "h100-sxm-x2")
    assert code == 0, out
    assert "speedup" in out and "on 1 to 2 GPUs" in out
    assert out.count("h100-sxm-x2") == 4


def test_whatif_host_counts_need_gpu_counts(capsys):
    code, _, err = run(capsys, "whatif", "--model", "llama-3.2-1b", "--host-counts", "2")
    assert code == 2 and "--host-counts goes with --gpu-counts" in err


def test_whatif_gpu_counts_no_profile_holds_is_refused(capsys):
    code, _, err = run(capsys, "whatif", "--model", "llama-3.2-1b", "--gpu-counts", "2",
                       "--profiles", "h200-bench")
    assert code == 2 and "no profile holds any of --gpu-counts 2" in err
