"""Run under torchrun by tests/training/test_distributed.py: join, then do what argv[1] says,
printing one JSON line per rank (on stdout) of what it saw."""

import json
import os
import signal
import sys

import torch
import torch.distributed as dist

from layerslide.training.distributed import (
    cores_per_rank,
    failures,
    join,
    leave,
    rank_folders,
    unanswered,
)


def main(what: str) -> int:
    ranks = join("cpu", timeout_s=float(os.environ.get("PROBE_TIMEOUT_S", "60")))
    seen = {"rank": ranks.rank, "gpus": ranks.gpus, "hosts": ranks.hosts}
    if what == "join":
        failed = failures(ranks, "no data here" if ranks.rank == 1 else None)
        seen.update(failures=failed, cores=cores_per_rank(ranks),
                    nvme=rank_folders("/a,/b", ranks), affinity=len(os.sched_getaffinity(0)))
    elif what == "die":  # rank 1 is killed; the others fail a collective and call the roll
        signal.signal(signal.SIGTERM, signal.SIG_IGN)  # as train's first-signal handler does
        if ranks.rank == 1:
            os.kill(os.getpid(), signal.SIGKILL)
        try:
            dist.all_reduce(torch.ones(1))
        except RuntimeError:
            seen["unanswered"] = unanswered(ranks, window_s=5)
    elif what == "leave":  # the OS threads while the groups live, and once left
        failures(ranks, None)  # an all-gather, as a run's last collectives are
        seen["threads_joined"] = len(os.listdir("/proc/self/task"))
        leave(ranks)
        seen["threads_left"] = len(os.listdir("/proc/self/task"))
    # one write of the whole line: the ranks share torchrun's stdout, and print's separate
    # write of the newline let two ranks' lines run together
    os.write(sys.stdout.fileno(), (json.dumps(seen) + "\n").encode())
    leave(ranks)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
