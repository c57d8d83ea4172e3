"""How `layerslide train` runs as several ranks: `--gpus N` outside torchrun launches N ranks on
this host through torch's own launcher (torch.distributed.run), each of which joins the run
torchrun made (training.distributed.join); every rank checks its inputs and all go on or stop
together; a run stopped by a collective names the ranks that did not answer."""

from __future__ import annotations

import os
import shlex
import signal
import subprocess
import sys
from collections.abc import Callable
from typing import TypeVar

from layerslide.cli.options import UsageError
from layerslide.cli.rank_output import errors, speak_only_on_first
from layerslide.executor.ranks import SINGLE, Ranks
from layerslide.training import distributed
from layerslide.training.inputs import SEVERAL_HOSTS, check_gpu_count, device_of
from layerslide.training.run import RunConfig

T = TypeVar("T")
FORWARDED_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


def relaunched(config: RunConfig, argv: list[str]) -> int | None:
    """Outside torchrun, `--gpus N` (N > 1) runs these arguments as N ranks on this host and
    returns torchrun's exit status; None where this process is the run (or one of its ranks)."""
    if distributed.under_torchrun():
        return None
    if "hosts" in config.given and config.train.hosts > 1:
        raise UsageError(f"{config.flag('hosts')} {config.train.hosts}: {SEVERAL_HOSTS}")
    gpus = config.train.gpus
    if "gpus" not in config.given or gpus == 1:
        return None
    import torch

    if device_of(config.device, torch).startswith("cuda"):
        check_gpu_count(gpus, torch)
    return relaunch(argv, gpus)


def relaunch_command(argv: list[str], gpus: int) -> list[str]:
    """torch.distributed.run on this host alone (a standalone rendezvous on a free port)."""
    return [sys.executable, "-m", "torch.distributed.run", "--standalone",
            f"--nproc-per-node={gpus}", "-m", "layerslide", *argv]


def relaunch(argv: list[str], gpus: int) -> int:
    """Run argv as `gpus` ranks and wait for them. The launcher gets a process group of its
    own, so that a Ctrl-C reaches it once, from here (it hands it to every rank); torch's CPU
    ops get each rank's share of the cores unless OMP_NUM_THREADS says otherwise."""
    command = relaunch_command(argv, gpus)
    env = dict(os.environ)
    env.setdefault("OMP_NUM_THREADS", str(max(1, len(os.sched_getaffinity(0)) // gpus)))
    print(f"launching {gpus} ranks on this host: {shlex.join(command)}", file=sys.stderr,
          flush=True)
    child = subprocess.Popen(command, env=env, process_group=0)

    def forward(signum, _frame) -> None:
        child.send_signal(signum)
    previous = {sig: signal.signal(sig, forward) for sig in FORWARDED_SIGNALS}
    try:
        status = child.wait()
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    return status if status >= 0 else 128 - status


def joined(config: RunConfig, say_error: Callable[[str], None]) -> Ranks:
    """This process's ranks: SINGLE outside torchrun; under it, the run joined (the process
    groups made) with only rank 0 speaking from here on, and said by rank 0. say_error: how
    rank 0 says a refusal that every rank makes (a launch whose hosts differ)."""
    if not distributed.under_torchrun():
        return SINGLE
    import torch

    rank = int(os.environ["RANK"])
    speak_only_on_first(rank)
    device = device_of(config.device, torch)
    local = int(os.environ.get("LOCAL_RANK", "0"))
    if device.startswith("cuda") and local < torch.cuda.device_count():  # (else refused later)
        torch.cuda.set_device(local)  # before NCCL sees a collective: one GPU per rank
    try:
        ranks = distributed.join("cuda" if device.startswith("cuda") else "cpu",
                                 timeout_s=config.collective_timeout)
    except ValueError as err:
        if not distributed.joined():
            raise
        _stop_together(rank, str(err), say_error)
    speak_only_on_first(rank)  # torch's hook, set on joining, would print into the silence
    print(f"{ranks.world} ranks ({ranks.gpus} per host x {ranks.hosts} host(s)) joined through "
          f"{distributed.backend(device.split(':')[0])}; a collective waits "
          f"{config.collective_timeout:g} s for the others (--collective-timeout)", flush=True)
    return ranks


def _stop_together(rank: int, message: str, say_error: Callable[[str], None],
                   own: BaseException | None = None):
    """Every rank stops, once rank 0 has said why (torchrun stops the rest as soon as one
    exits, so none leaves before it): exit status 2, or this rank's own error raised."""
    if rank == 0:
        say_error(message)
    distributed.gathered(None)
    if own is not None:
        raise own
    raise SystemExit(2)


def on_every_rank(ranks: Ranks, step: Callable[[], T], say_error: Callable[[str], None],
                  undo: Callable[[T], None] | None = None) -> T:
    """step() on every rank, which then all go on together or all stop: each learns the
    others' failures before any collective could wait for a rank that stopped. Rank 0 says
    every refusal (once where the ranks agree) through say_error; a rank's own bug raises
    there. undo: what a rank whose step succeeded does with its result when another's failed."""
    if ranks.world == 1:
        return step()
    own: BaseException | None = None
    try:
        result, failure = step(), None
    except (UsageError, ValueError) as err:
        failure = str(err)
    except Exception as err:  # noqa: BLE001 (raised below, once the others know)
        own, failure = err, f"{type(err).__name__}: {err}"
    failed = distributed.failures(ranks, failure)
    if not failed:
        return result
    if failure is None and undo is not None:
        undo(result)
    return _stop_together(ranks.rank, refusals_said(failed, ranks.world), say_error, own)


def refusals_said(failed: dict[int, str], world: int) -> str:
    """The ranks' refusals as one message: once where every rank said the same, else each
    distinct one with its ranks."""
    by_message: dict[str, list[int]] = {}
    for rank, message in sorted(failed.items()):
        by_message.setdefault(message, []).append(rank)
    if len(by_message) == 1 and len(failed) == world:
        return next(iter(by_message))
    return "; ".join(f"rank {', '.join(map(str, ranks))}: {message}"
                     for message, ranks in by_message.items())


def lost_ranks_said(ranks: Ranks) -> str:
    """After a collective failed: which ranks did not answer the roll call, said for a user."""
    window = distributed.roll_call_s()
    try:
        silent = distributed.unanswered(ranks, window)
    except RuntimeError as err:  # the store is gone: its host (torchrun's rendezvous) is
        return (f"the ranks' rendezvous store cannot be reached ({err}): the host of rank 0's "
                "torchrun is down or unreachable")
    if not silent:
        return ("every rank answered the roll call after it: the network between them failed, "
                "or a collective outlasted --collective-timeout")
    named = ", ".join(map(str, silent))
    return (f"rank {named} did not answer within {window:g} s: died, was killed, or stopped on "
            "an error of its own (its lines are prefixed with its rank; torchrun's summary "
            "gives its exit)")


def say_stopped(ranks: Ranks, err: BaseException) -> None:
    """A run of several ranks stopped by a failed collective: the failure and who is gone."""
    print(f"layerslide train: training stopped: a collective with the other ranks failed "
          f"({err}); {lost_ranks_said(ranks)}", file=errors(), flush=True)
