"""Run under torchrun by tests/cli/test_cli_ranks.py: join as `train` does, then a check that
rank 1 alone fails (argv[1] == "one") or that every rank fails alike ("all")."""

import sys

from layerslide.cli.launch import joined, on_every_rank
from layerslide.cli.rank_output import errors
from layerslide.training.distributed import leave
from layerslide.training.run import RunConfig, RunError


def main(which: str) -> int:
    undone = []

    def say_error(message: str) -> None:
        print(f"refused: {message} (rank 0 undid {undone})", file=errors(), flush=True)
    ranks = joined(RunConfig(device="cpu", collective_timeout=60), say_error)

    def check() -> str:
        if which == "all" or ranks.rank == 1:
            raise RunError(f"--data missing-{which}.jsonl: no such file")
        return "checked"
    on_every_rank(ranks, check, say_error, undo=undone.append)
    leave(ranks)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
