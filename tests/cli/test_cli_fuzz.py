"""No traceback escapes the planning commands, whatever their arguments: exit 0 or 1 (an
infeasible plan), or exit 2 with a message (argparse's or layerslide's)."""

from __future__ import annotations

import json

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from layerslide.cli.main import main

NUMBERS = ["0", "1", "2", "-1", "0.5", "1.5", "1e9", "nan", "x", ""]
SIZES = ["24GiB", "1MiB", "0", "-5GB", "lots", "1e30B"]
FLAGS = {
    "--micro-batch": NUMBERS, "--seq-len": NUMBERS + ["1024"], "--grad-accum": NUMBERS,
    "--window": NUMBERS, "--prefetch-depth": NUMBERS, "--grad-buffers": NUMBERS,
    "--moments-on-nvme": NUMBERS, "--master-on-nvme": NUMBERS, "--weights-on-nvme": NUMBERS,
    "--resident-layers": NUMBERS, "--gpu-updated-blocks": NUMBERS,
    "--max-grad-norm": NUMBERS, "--sweep-groups": NUMBERS, "--nvme-drives": NUMBERS,
    "--gpu-memory": SIZES, "--activations": ["gpu", "host", "nvme", "disk"],
    "--cast": ["cpu_once", "gpu", "tpu"], "--accumulation": ["layer_major", "sideways"],
    "--cpu-optimizer": ["native", "torch", "adam"], "--profile": ["h200-bench", "rtx4090-256gb",
                                                                  "no-such-box"],
}
MODELS = ["llama-3.2-1b", "qwen3-4b", "no-such-model", "/no/such/folder"]


def arguments():
    pairs = st.lists(st.sampled_from(sorted(FLAGS)).flatmap(
        lambda flag: st.tuples(st.just(flag), st.sampled_from(FLAGS[flag]))), max_size=4)
    return st.tuples(st.sampled_from(["plan", "simulate"]), st.sampled_from(MODELS), pairs)


def exit_code(argv: list[str]) -> int:
    try:
        return main(argv)
    except SystemExit as stop:  # argparse refuses with exit 2 and its usage message
        return stop.code


# capsys is read out per example, so what one prints never reaches the next
@settings(max_examples=80, deadline=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
@given(arguments())
def test_planning_commands_exit_cleanly_whatever_the_flags(capsys, case):
    command, model, pairs = case
    argv = [command, "--model", model, *[part for pair in pairs for part in pair]]
    if command == "plan":
        argv = [a for a in argv if a not in ("--profile", "--nvme-drives")]
    code = exit_code(argv)
    err = capsys.readouterr().err
    assert code in (0, 1, 2), (argv, code)
    assert "Traceback" not in err
    if code == 2:
        assert "error" in err, argv  # says what is wrong


@pytest.mark.parametrize("content", ["", "not json", "[]", json.dumps({"format": 99}),
                                     json.dumps({"model": {}, "train": {}}), "\x00\xff"])
def test_a_damaged_plan_file_is_refused_with_a_message(tmp_path, capsys, content):
    path = tmp_path / "plan.json"
    path.write_bytes(content.encode("utf-8", "surrogateescape") if isinstance(content, str)
                     else content)
    assert exit_code(["simulate", "--plan", str(path)]) == 2
    err = capsys.readouterr().err
    assert "plan.json" in err and "Traceback" not in err
