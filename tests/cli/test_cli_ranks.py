"""`layerslide train` as several ranks on the CPU (gloo): under torchrun, on two "hosts"
meeting at a rendezvous on 127.0.0.1, through `--gpus N`; what each rank says, refusals every
rank makes together, and a rank killed or stopped mid-run."""

from __future__ import annotations

import json
import signal
import sys
from pathlib import Path

import pytest
import torch
from helpers import tiny_model_folder, tiny_text_data
from ranks_helpers import Launched, children, env, hosts, torchrun

from layerslide.cli.launch import refusals_said, relaunch_command
from layerslide.cli.main import main

PROBE = str(Path(__file__).with_name("launch_probe.py"))


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return tiny_model_folder(tmp_path_factory.mktemp("tiny-llama"))


@pytest.fixture
def data_file(tmp_path):
    return tiny_text_data(tmp_path / "data.jsonl")


def train_args(model_dir, data_file, *extra: str) -> list[str]:
    return ["-m", "layerslide", "train", "--model", str(model_dir), "--data", str(data_file),
            "--device", "cpu", "--seq-len", "16", "--micro-batch", "2", "--lr", "1e-3", *extra]


# refusals said once for every rank that refuses
REFUSED = "--warmup-steps 1 is not below --steps 1"


def test_one_ranks_refusal_stops_every_rank_and_rank_0_says_whose():
    launched = Launched(torchrun("--standalone", "--nproc-per-node", "2", PROBE, "one"))
    status, _, err = launched.finish()
    assert status != 0
    assert ("refused: rank 1: --data missing-one.jsonl: no such file (rank 0 undid "
            "['checked'])") in err
    assert "rank 1: refused" not in err  # rank 1 leaves it to rank 0


def test_refusals_of_several_ranks_are_said_with_their_ranks():
    assert refusals_said({0: "no room", 1: "no room"}, 2) == "no room"
    assert refusals_said({1: "no room", 3: "no room", 2: "no data"}, 4) == \
        "rank 1, 3: no room; rank 2: no data"


def test_two_hosts_meet_at_a_rendezvous_and_agree_on_their_ranks(model_dir, data_file):
    launched = hosts(2, *train_args(model_dir, data_file, "--steps", "1", "--warmup-steps", "1"))
    (status0, out0, err0), (status1, out1, err1) = (host.finish() for host in launched)
    assert "2 ranks (1 per host x 2 host(s)) joined through gloo" in out0
    assert f"layerslide train: error: {REFUSED}" in err0  # rank 0's, for both
    assert REFUSED not in err1 and "joined" not in out1  # rank 1 on the other host: silent
    assert status0 != 0 and status1 != 0


def test_a_rank_killed_on_another_host_is_named_by_the_rank_left(model_dir, data_file):
    first, second = hosts(2, *train_args(model_dir, data_file, "--steps", "200"))
    first.wait_for("joined through gloo")  # rank 0's line: the first host holds rank 0
    for pid in second.ranks():
        Launched.signal(pid, signal.SIGKILL)
    status, _, err = first.finish()
    second.finish()
    assert status != 0
    assert ("layerslide train: training stopped: a collective with the other ranks failed" in
            err)
    assert "rank 1 did not answer within 10 s: died, was killed, or stopped on an error of " \
           "its own" in err


def test_a_rank_stuck_past_the_collective_timeout_is_named(model_dir, data_file):
    first, second = hosts(2, *train_args(model_dir, data_file, "--steps", "200",
                                         "--collective-timeout", "5"))
    first.wait_for("joined through gloo")
    stuck = second.ranks()
    for pid in stuck:
        Launched.signal(pid, signal.SIGSTOP)
    try:
        status, out, err = first.finish()
    finally:
        for pid in stuck:
            Launched.signal(pid, signal.SIGKILL)
        second.finish()
    assert "a collective waits 5 s for the others (--collective-timeout)" in out
    assert status != 0
    assert "rank 1 did not answer within 5 s" in err


def test_gpus_outside_torchrun_launches_ranks_that_refuse_together(model_dir, data_file):
    assert relaunch_command(["train", "--gpus", "2"], 2) == [
        sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2",
        "-m", "layerslide", "train", "--gpus", "2"]
    launched = Launched([sys.executable, *train_args(model_dir, data_file, "--gpus", "2",
                                                     "--steps", "1", "--warmup-steps", "1")],
                        env=env())
    status, out, err = launched.finish()
    assert "launching 2 ranks on this host: " in err
    assert "2 ranks (2 per host x 1 host(s)) joined through gloo; a collective waits 600 s" \
        in out
    assert out.count("joined through") == 1  # rank 1 says nothing
    # a refusal every rank makes: said once, by rank 0, and every rank stops
    assert err.count(REFUSED) == 1 and f"layerslide train: error: {REFUSED}" in err
    assert status != 0


def test_more_gpus_than_torch_sees_are_refused_before_any_launch(model_dir, monkeypatch,
                                                                 capsys):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    assert main(["train", "--model", str(model_dir), "--gpus", "4", "--device", "cuda"]) == 2
    assert "4 ranks on this host need a GPU each, and torch sees 2 CUDA GPU(s)" in \
        capsys.readouterr().err


def test_several_hosts_outside_torchrun_say_how_to_launch_them(model_dir, capsys):
    assert main(["train", "--model", str(model_dir), "--hosts", "2", "--device", "cpu"]) == 2
    assert "--hosts 2: start `torchrun --nnodes M --node-rank I --rdzv-backend c10d " \
           "--rdzv-endpoint HOST:PORT --nproc-per-node N -m layerslide train ...` on each of " \
           "the M hosts" in capsys.readouterr().err


def losses(path: Path) -> list[float]:
    return [json.loads(line)["loss"] for line in path.read_text().splitlines()]


def test_two_hosts_train_to_the_losses_of_one_process_accumulating(model_dir, data_file,
                                                                   tmp_path):
    one = tmp_path / "one.jsonl"  # one process accumulating 2 micro-batches of 2
    _, _, *command = train_args(model_dir, data_file, "--steps", "3", "--grad-accum", "2",
                                "--log-jsonl", str(one))
    assert main(command) == 0
    two = tmp_path / "two.jsonl"  # two hosts of a rank each, micro-batches of 2
    launched = hosts(2, *train_args(model_dir, data_file, "--steps", "3", "--log-jsonl", str(two)))
    assert [host.finish()[0] for host in launched] == [0, 0]
    assert losses(two) == pytest.approx(losses(one), rel=1e-3)


def test_a_rank_killed_mid_run_stops_the_other_naming_it(model_dir, data_file, tmp_path):
    launched = Launched(torchrun("--standalone", "--nproc-per-node", "2",
                                 *train_args(model_dir, data_file, "--steps", "500",
                                             "--segment-steps", "1",
                                             "--log-jsonl", str(tmp_path / "log.jsonl"))))
    launched.wait_for("step 2/500")
    rank1 = [pid for pid in launched.ranks() if _rank_of(pid) == 1]
    Launched.signal(rank1[0], signal.SIGKILL)
    status, _, err = launched.finish()
    assert status != 0
    assert "rank 1 did not answer" in err  # ours, from rank 0
    assert len(losses(tmp_path / "log.jsonl")) >= 2  # rank 0 alone logged, before the kill


def _rank_of(pid: int) -> int:
    environ = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    return int(next(v for v in environ if v.startswith(b"RANK=")).split(b"=")[1])


def test_a_signal_to_the_gpus_launcher_reaches_its_ranks_and_none_is_left(model_dir, data_file):
    launcher = Launched([sys.executable, *train_args(model_dir, data_file, "--gpus", "2",
                                                     "--steps", "200")], env=env())
    launcher.wait_for("joined through gloo")
    torchrun_pid, = launcher.ranks()  # the launcher's child: torch.distributed.run
    ranks = children(torchrun_pid)
    Launched.signal(max(ranks), signal.SIGSTOP)  # a rank that holds the other at a collective
    Launched.signal(launcher.proc.pid, signal.SIGINT)  # as a Ctrl-C reaches the launcher
    status, _, _ = launcher.finish()
    left = [pid for pid in (torchrun_pid, *ranks) if _running(pid)]
    for pid in left:  # (a failed test leaves nothing running either)
        Launched.signal(pid, signal.SIGKILL)
    assert status != 0 and left == []


def _running(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False
