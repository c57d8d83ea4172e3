"""The layerslide command: every subcommand runs, --json parses, bad input exits 2 with a message."""

import argparse
import json

import pytest

from layerslide.cli.main import main
from layerslide.cli.options import profile_list
from layerslide.hwprofiles import load_profile
from layerslide.planner import Plan, sizes


def run(capsys, *argv):
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def test_profiles_and_models_tables_and_json(capsys):
    code, out, _ = run(capsys, "profiles")
    assert code == 0 and "h200-bench" in out and "GiB" in out
    code, out, _ = run(capsys, "profiles", "--json")
    assert {p["name"] for p in json.loads(out)} >= {"h200-bench", "rtx4090-256gb", "mi300x"}
    code, out, _ = run(capsys, "models", "--json")
    by_name = {m["name"]: m for m in json.loads(out)}
    assert by_name["llama-3.1-8b"]["total_params"] == 8_030_261_248


def test_plan_writes_a_plan_that_simulate_reads(capsys, tmp_path):
    path = tmp_path / "plan.json"
    code, out, _ = run(capsys, "plan", "--model", "llama-3.2-1b", "--micro-batch", "2",
                       "--window", "3", "-o", str(path))
    assert code == 0 and "static memory" in out
    plan = Plan.load(path)
    assert plan.policy.residency.window == 3 and plan.train.micro_batch == 2
    code, out, _ = run(capsys, "simulate", "--plan", str(path), "--profile", "rtx4090-256gb",
                       "--json")
    summary = json.loads(out)
    assert code == 0 and summary["feasible"] and summary["step_s"] > 0
    assert summary["tokens_per_step"] == 2 * 1024


def test_simulate_report_dir_and_gpu_cap(capsys, tmp_path):
    code, out, _ = run(capsys, "simulate", "--model", "llama-3.2-1b", "--micro-batch", "2",
                       "--report-dir", str(tmp_path), "--trace-out", str(tmp_path / "t.json"))
    assert code == 0 and "tokens/s" in out and "bottleneck" in out
    # h200-bench's GPU idles most of this step, so it clocks at its table's top speedup
    assert "GPU computing at 1.18x its efficiency tables' rate" in out
    for name in ("timeline.png", "memory.png", "trace.json", "trace.layerslide.json", "t.json"):
        assert (tmp_path / name).stat().st_size > 0
    plan = tmp_path / "plan.json"
    assert run(capsys, "plan", "--model", "llama-3.2-1b", "--micro-batch", "2", "-o",
               str(plan))[0] == 0
    code, _, err = run(capsys, "simulate", "--plan", str(plan), "--window", "4", "--steps", "7")
    assert code == 2 and "--window 4 (the plan has 2)" in err and "--steps 7 (the plan has 3)" in err
    assert run(capsys, "simulate", "--plan", str(plan), "--micro-batch", "2")[0] == 0
    code, out, _ = run(capsys, "simulate", "--model", "llama-3.2-1b", "--gpu-memory", "1GiB")
    assert code == 1 and "INFEASIBLE" in out and "gpu needs" in out
    assert "to fit gpu: lower --micro-batch or --window" in out  # what to change
    code, out, _ = run(capsys, "simulate", "--model", "llama-3.1-70b", "--profile",
                       "rtx4090-256gb")
    assert code == 1 and "host needs" in out and "to fit host: keep part of the state on NVMe" in out
    assert "to fit gpu" not in out  # only the tiers that overflow


def test_tune_prints_best_and_rejections_and_writes_plan(capsys, tmp_path):
    path = tmp_path / "tuned.json"
    code, out, _ = run(capsys, "tune", "--model", "llama-3.2-1b", "--profile", "rtx4090-256gb",
                       "--gpu-memory", "8GiB", "--windows", "1,2", "--micro-batches", "1,64",
                       "--activations", "gpu", "--casts", "cpu_once", "-o", str(path),
                       "--exhaustive")  # every accumulation's best: every candidate simulated
    assert code == 0
    assert "over gpu memory" in out  # micro-batch 64 with activations on an 8 GiB GPU
    assert "best by accumulation: x1 " in out and "x16 layer-major" in out
    assert Plan.load(path).meta["tuned_for_profile"] == "rtx4090-256gb"


def test_whatif_both_axes(capsys):
    code, out, _ = run(capsys, "whatif", "--model", "llama-3.2-1b",
                       "--profiles", "h200-bench,rtx4090-256gb", "--json")
    rows = json.loads(out)["rows"]
    assert code == 0 and [r["profile"] for r in rows] == ["h200-bench", "rtx4090-256gb"]
    code, out, _ = run(capsys, "whatif", "--on-profile", "rtx4090-256gb",
                       "--models", "llama-3.2-1b,llama-3.1-70b", "--ram", "64GiB", "--json")
    data = json.loads(out)
    (largest,) = data["largest"]
    assert largest["ram_bytes"] == 64 * 1024**3 and largest["nvme_bytes"] == 2 * 10**12
    # 70B fits 64 GiB of RAM with all its state, bf16 weights included, on the drive
    assert largest["largest_fitting_model"] == "llama-3.1-70b"
    assert data["rows"][1]["feasible"] and "w=" in data["rows"][1]["config"]
    # state-only bound: (64 GiB - the OS's reserve - the process's runtime) / 14 B per param
    reserve = load_profile("rtx4090-256gb").host.reserve_bytes
    assert largest["all_in_ram_params"] == pytest.approx(
        (64 * 1024**3 - reserve - sizes.HOST_RUNTIME_BYTES) / 14)


@pytest.mark.parametrize("argv, message", [
    (["simulate", "--model", "no-such-model"], "unknown model"),
    (["simulate", "--model", "llama-3.2-1b", "--profile", "no-such-profile"], "built-ins"),
    (["plan", "--model", "llama-3.2-1b", "--window", "0"], "window"),
    (["plan", "--model", "llama-3.2-1b", "--seq-len", "1000000"], "max_position_embeddings"),
    (["simulate"], "--model"),
    (["whatif"], "--model"),
])
def test_bad_input_exits_2_with_what_to_change(capsys, argv, message):
    code, _, err = run(capsys, *argv)
    assert code == 2 and message in err


def test_bad_size_is_an_argparse_error(capsys):
    with pytest.raises(SystemExit) as exc:
        main(["simulate", "--model", "llama-3.2-1b", "--gpu-memory", "24 bananas"])
    assert exc.value.code == 2
    assert "gpu-memory" in capsys.readouterr().err


def test_every_help_states_units(capsys):
    for command in ("profiles", "models", "plan", "simulate", "tune", "whatif", "demo"):
        with pytest.raises(SystemExit):
            main([command, "--help"])
        assert "Units:" in capsys.readouterr().out


def test_simulate_a_tuned_plan_defaults_to_its_profile_and_cap(capsys, tmp_path):
    path = tmp_path / "tuned.json"
    code, _, _ = run(capsys, "tune", "--model", "llama-3.2-1b", "--profile", "rtx4090-256gb",
                     "--gpu-memory", "20GiB", "--windows", "2", "--micro-batches", "2",
                     "--activations", "host", "--casts", "cpu_once", "-o", str(path))
    assert code == 0
    code, out, _ = run(capsys, "simulate", "--plan", str(path), "--json")
    summary = json.loads(out)
    assert summary["limit_gpu_bytes"] == 20 * 1024**3
    code, out, _ = run(capsys, "simulate", "--plan", str(path))
    assert "on rtx4090-256gb (GPU capped at 20.0 GiB)" in out


def test_unreadable_plan_file_is_a_usage_error(capsys, tmp_path):
    bad = tmp_path / "plan.json"
    bad.write_text("not json")
    code, _, err = run(capsys, "simulate", "--plan", str(bad))
    assert code == 2 and "plan.json" in err


@pytest.mark.parametrize("argv, message", [
    (["tune", "--model", "llama-3.2-1b", "--seq-len", "0"], "--seq-len 0: must be a positive"),
    (["tune", "--model", "llama-3.2-1b", "--seq-len", "10000000"], "max_position_embeddings"),
    (["tune", "--model", "llama-3.2-1b", "--casts", "foo"], "casts"),
    (["tune", "--model", "llama-3.2-1b", "--max-grad-norm", "-1"], "--max-grad-norm -1.0: must be"),
    (["tune", "--model", "llama-3.2-1b", "-o", "/no/such/folder/x.json"], "does not exist"),
    (["plan", "--model", "llama-3.2-1b", "-o", "/no/such/folder/x.json"], "does not exist"),
    (["whatif", "--on-profile", "h200-bench", "--model", "llama-3.2-1b"], "--models"),
    (["whatif", "--model", "llama-3.2-1b", "--ram", "64GiB"], "--on-profile"),
    # outputs checked before the work (these raised a traceback, some after the work)
    (["simulate", "--model", "llama-3.2-1b", "--trace-out", "/proc/trace.json"],
     "--trace-out /proc/trace.json: cannot write in /proc"),
    (["simulate", "--model", "llama-3.2-1b", "--report-dir", "/proc/report"],
     "--report-dir /proc/report: cannot write in /proc"),
    (["calibrate", "--out", "/proc/p.toml"], "--out /proc/p.toml: cannot write in /proc"),
    (["calibrate", "--out", "p.toml", "--disk-dir", "/no/such/disk"],
     "--disk-dir /no/such/disk does not exist"),
    (["demo", "--out", "/proc/report"], "--out /proc/report: cannot write in /proc"),
    (["demo", "--out", "/etc/hostname"], "is a file: give a folder path"),
])
def test_more_bad_input_exits_2(capsys, argv, message):
    code, _, err = run(capsys, *argv)
    assert code == 2 and message in err


@pytest.mark.parametrize("content", ['{"format_version": 1}', "[1, 2]", '{"tasks": 3}'])
def test_json_that_is_not_a_plan_is_a_usage_error(capsys, tmp_path, content):
    path = tmp_path / "plan.json"
    path.write_text(content)
    code, _, err = run(capsys, "simulate", "--plan", str(path))
    assert code == 2 and "plan" in err


def test_zero_sizes_are_refused(capsys):
    with pytest.raises(SystemExit):
        main(["whatif", "--model", "llama-3.2-1b", "--gpu-memory", "0B"])
    assert "more than 0 bytes" in capsys.readouterr().err


def test_json_output_has_no_nan(capsys):
    code, out, _ = run(capsys, "tune", "--model", "llama-3.2-1b", "--windows", "1",
                       "--micro-batches", "1,64", "--activations", "gpu", "--casts", "cpu_once",
                       "--gpu-memory", "1GiB", "--json")
    assert code == 1 and "NaN" not in out  # nothing fits 1 GiB
    data = json.loads(out)
    assert data["best"] is None
    assert all(r["step_s"] is None for r in data["candidates"])  # rejected: null, not NaN


def test_the_environment_sets_a_loaded_plans_executor_knobs_even_to_their_defaults(monkeypatch):
    from layerslide.cli.options import with_env_overrides
    from layerslide.planner import Policy

    recorded = Policy.of(cpu_chunk_elements=0, stream_run_ahead=5)
    monkeypatch.delenv("LAYERSLIDE_CPU_THREADS", raising=False)
    monkeypatch.delenv("LAYERSLIDE_RUN_AHEAD", raising=False)
    assert with_env_overrides(recorded) == recorded  # nothing set: the file's own
    monkeypatch.setenv("LAYERSLIDE_CPU_CHUNK", str(1 << 20))  # the default, given explicitly
    monkeypatch.setenv("LAYERSLIDE_RUN_AHEAD", "3")
    run = with_env_overrides(recorded)
    assert run.executor.cpu_chunk_elements == 1 << 20 and run.schedule.stream_run_ahead == 3


def test_schedules_named_on_the_command_line_are_each_tried_at_every_accumulation():
    from layerslide.cli.main import build_parser
    from layerslide.cli.tune import space_of

    def space(*flags):
        return space_of(build_parser().parse_args(["tune", "--model", "llama-3.2-1b", *flags]))

    default = space("--grad-accums", "1,16")
    assert default.step_major_max_accum == 4  # step-major x16 is left to layer-major
    named = space("--grad-accums", "1,16", "--accumulations", "step_major,layer_major")
    assert named.step_major_max_accum == 16
    assert space("--max-tokens-per-step", "0").max_tokens_per_step is None


def test_simulate_refuses_a_model_beside_a_plan(capsys, tmp_path):
    """--plan holds its model: a --model beside it was ignored without a word."""
    path = tmp_path / "plan.json"
    assert run(capsys, "plan", "--model", "llama-3.2-1b", "-o", str(path))[0] == 0
    code, _, err = run(capsys, "simulate", "--plan", str(path), "--model", "llama-3.2-3b")
    assert code == 2 and "drop --model llama-3.2-3b" in err


def test_whatif_and_tune_take_moment_precisions(capsys, tmp_path):
    code, out, _ = run(capsys, "whatif", "--on-profile", "rtx4090-256gb", "--models",
                       "llama-3.2-1b", "--ram", "64GiB", "--moment-precision", "bf16", "--json")
    (largest,) = json.loads(out)["largest"]
    by_moments = largest["all_in_ram_params_by_moments"]
    assert code == 0 and by_moments["fp32"] < by_moments["bf16"] < by_moments["int8"]
    assert largest["all_in_ram_params"] == by_moments["bf16"]
    path = tmp_path / "tuned.json"
    code, out, _ = run(capsys, "tune", "--model", "llama-3.2-1b", "--profile", "rtx4090-256gb",
                       "--gpu-memory", "8GiB", "--windows", "2", "--micro-batches", "4",
                       "--activations", "host", "--casts", "cpu_once",
                       "--moment-precisions", "fp32,int8", "-o", str(path))
    assert code == 0
    # the CPU bounds a 1B step on this profile: fewer moment bytes make it faster
    assert Plan.load(path).policy.residency.moment_precision == "int8"


def test_compact_moments_with_torchs_adamw_are_refused(capsys):
    code, _, err = run(capsys, "plan", "--model", "llama-3.2-1b", "--moment-precision", "bf16",
                       "--cpu-optimizer", "torch")
    assert code == 2 and "cpu_optimizer=native" in err


@pytest.mark.parametrize(("argv", "words"), [
    # a spec's refusal said as the flag that set it
    (["simulate", "--model", "llama-3.2-1b", "--moments-on-nvme", "2"],
     "error: --moments-on-nvme 2.0: must be a fraction"),
    (["plan", "--model", "llama-3.2-1b", "--max-grad-norm", "inf"],
     "error: --max-grad-norm inf: must be a finite threshold"),
    # a cap above the card, a drive count given twice
    (["simulate", "--model", "llama-3.2-1b", "--profile", "rtx5090", "--gpu-memory", "1000GiB"],
     "a cap can only lower it"),
    (["whatif", "--model", "llama-3.2-1b", "--profiles", "h200-bench", "--gpu-memory",
      "1000GiB"], "a cap can only lower it"),
    (["simulate", "--model", "llama-3.2-1b", "--profile", "workstation-8ch,drives=4",
      "--nvme-drives", "2"], "names 4 drives, and --nvme-drives 2 another count: give it once"),
    # policy flags the rest of the plan leaves nothing to change
    (["simulate", "--model", "llama-3.2-1b", "--cast-worker"],
     "--cast-worker would change nothing here: there are no CPU cast tasks"),
    (["plan", "--model", "llama-3.2-1b", "--sweep-groups", "3"],
     "--sweep-groups would change nothing here"),
    (["simulate", "--model", "llama-3.2-1b", "--accumulation", "layer_major"],
     "--accumulation would change nothing here: it schedules --grad-accum above 1"),
    (["simulate", "--model", "llama-3.2-1b", "--gpu-updated-order", "layers_first"],
     "--gpu-updated-order would change nothing here"),
    (["demo", "--out", ""], "--out is empty"),
])
def test_input_that_would_mislead_is_refused_in_flag_words(capsys, argv, words):
    code, _, err = run(capsys, *argv)
    assert code == 2 and words in err


def test_a_rejected_plan_says_its_trace_was_not_written_and_flags_that_act_pass(capsys,
                                                                               tmp_path):
    trace = tmp_path / "t.json"
    code, out, _ = run(capsys, "simulate", "--model", "llama-3.1-70b", "--profile",
                       "desktop-ddr5", "--trace-out", str(trace))
    assert code == 1 and f"no trace written to {trace}" in out and not trace.exists()
    assert run(capsys, "simulate", "--model", "llama-3.2-1b", "--cast", "cpu_per_load",
               "--cast-worker")[0] == 0  # a cast worker with casts to run
    with pytest.raises(SystemExit):  # argparse's own refusal
        main(["tune", "--model", "llama-3.2-1b", "--top", "0"])


def test_profile_lists_keep_a_variants_parts_with_it():
    assert profile_list("workstation-8ch+rtx5090,ram=512GiB,drives=4,h200-bench") == (
        "workstation-8ch+rtx5090,ram=512GiB,drives=4", "h200-bench")
    with pytest.raises(argparse.ArgumentTypeError, match="follows no profile"):
        profile_list("ram=512GiB,h200-bench")


def test_refusals_say_the_flag_only_for_a_specs_field_the_user_gave():
    from layerslide.cli.main import _subcommand_parser, build_parser
    from layerslide.cli.options import in_flag_words

    simulate = _subcommand_parser(build_parser(), "simulate")
    given = {"moments_on_nvme", "steps", "nvme_drives"}
    assert in_flag_words("Policy.moments_on_nvme=2.0: must be a fraction", simulate, given) == (
        "--moments-on-nvme 2.0: must be a fraction")
    assert in_flag_words("num_steps=1: plan at least 2", simulate, given) == "--steps 1: plan at least 2"
    # a value from a plan file, not typed; a variant's own key, mid-message
    assert in_flag_words("p.json: Policy.window=9: too many", simulate, given) == (
        "p.json: Policy.window=9: too many")
    assert in_flag_words("workstation-8ch,nvme_drives=x: not a count", simulate, given) == (
        "workstation-8ch,nvme_drives=x: not a count")


def test_a_drive_count_is_refused_only_when_the_two_differ():
    from layerslide.cli.options import UsageError, profile_of

    assert profile_of("workstation-8ch,drives=4", 4).storage.drives == 4  # as tune records it
    with pytest.raises(UsageError, match="give it once"):
        profile_of("workstation-8ch,drives=4", 2)


def test_a_runs_resolved_file_leaves_out_how_it_was_resumed():
    from layerslide.cli.main import _subcommand_parser, build_parser
    from layerslide.cli.run_config import file_options

    options = file_options(_subcommand_parser(build_parser(), "train"))
    assert "resume_fallback" not in options and "resume" not in options


def test_a_cap_across_profiles_names_the_cards_it_leaves_whole(capsys):
    code, _, err = run(capsys, "whatif", "--model", "llama-3.2-1b", "--profiles",
                       "h200-bench,rtx4090-256gb", "--gpu-memory", "32GiB")
    assert code == 0
    assert "more than rtx4090-256gb (24 GiB) has: those rows use the whole card" in err
    assert "h200-bench (" not in err
