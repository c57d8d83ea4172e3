"""StepReporter: each step's line on stdout and its JSONL record reach their files at once,
whatever stdout is (a terminal is line-buffered; a file or pipe is not)."""

from __future__ import annotations

import json
import sys

from tqdm import tqdm

from layerslide.cli.step_logs import StepReporter
from layerslide.training.trainer import StepLog


def a_step(step: int) -> StepLog:
    return StepLog(step=step, loss=2.5, lr=1e-5, grad_norm=0.5, skipped=False, skipped_blocks=(),
                   step_s=0.1, tokens_per_s=1000.0, model_tflops=1.0, gpu_peak_bytes=0,
                   host_rss_bytes=2**30)


def test_each_step_reaches_a_redirected_stdout_and_the_jsonl_before_the_next(tmp_path,
                                                                           monkeypatch):
    stdout_file = tmp_path / "stdout.txt"
    with open(stdout_file, "w", buffering=1 << 16) as redirected:  # as `train > log` has it
        monkeypatch.setattr(sys, "stdout", redirected)
        bar = tqdm(total=3, disable=True)  # no bar outside a terminal
        reporter = StepReporter(3, bar, jsonl_path=str(tmp_path / "log.jsonl"))
        for step in range(2):
            reporter(a_step(step))
            # read through another handle, as `tail -f` would, while the run goes on
            assert f"step {step + 1}/3 | loss 2.5000" in stdout_file.read_text()
            records = (tmp_path / "log.jsonl").read_text().splitlines()
            assert [json.loads(r)["step"] for r in records] == list(range(1, step + 2))
        reporter.close()


def test_a_log_file_that_cannot_be_written_is_said_once_and_the_steps_go_on(capsys):
    """/dev/full fails every write for space, as a full disk does."""
    reporter = StepReporter(3, tqdm(total=3, disable=True), jsonl_path="/dev/full")
    for step in range(3):
        reporter(a_step(step))
    reporter.close()
    captured = capsys.readouterr()
    assert captured.err.count("--log-jsonl /dev/full: writing failed (No space left on "
                              "device); the run goes on without it") == 1
    assert [line.split(" |")[0] for line in captured.out.splitlines()] == \
        ["step 1/3", "step 2/3", "step 3/3"]


def test_a_disk_filling_mid_record_leaves_only_whole_records(tmp_path, monkeypatch, capsys):
    """The disk takes part of the third record, then refuses: the file is cut back to the two
    whole ones and stays so once the log is closed (nothing buffered is written again)."""
    import errno
    import os

    from layerslide.cli import step_logs

    path = tmp_path / "log.jsonl"
    reporter = StepReporter(4, tqdm(total=4, disable=True), jsonl_path=str(path))
    for step in range(2):
        reporter(a_step(step))
    room = [40]  # bytes the disk takes before it is full
    real_write = os.write

    def filling(fd, data):
        if room[0] == 0:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        taken = real_write(fd, data[:room[0]])
        room[0] -= taken
        return taken
    monkeypatch.setattr(step_logs.os, "write", filling)
    for step in range(2, 4):
        reporter(a_step(step))
    reporter.close()
    assert [json.loads(r)["step"] for r in path.read_text().splitlines()] == [1, 2]
    assert "its last whole record is of step 2" in capsys.readouterr().err
