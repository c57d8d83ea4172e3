"""Signals during `layerslide train`: the first SIGINT/SIGTERM ends the run after the step in
flight (or the save under way), a second exits at once; what a stopped run then says."""

from __future__ import annotations

import os
import signal
import sys
import threading


class GracefulStop:
    """SIGINT/SIGTERM during training: the first ends the run after the step in flight (and
    checkpoints it), a second exits at once (a checkpoint is written whole or not at all)."""

    SIGNALS = (signal.SIGINT, signal.SIGTERM)

    def __init__(self, bar):
        self.event, self.signum, self._bar = threading.Event(), None, bar
        self.doing = "the step in flight"  # what a first signal lets finish
        self._previous = {sig: signal.signal(sig, self._first) for sig in self.SIGNALS}

    def _first(self, signum, _frame) -> None:
        self.signum = signum
        self.event.set()
        for sig in self.SIGNALS:
            signal.signal(sig, self._second)
        self._bar.write(f"{signal.Signals(signum).name}: stopping after {self.doing}; "
                        "send it again to exit at once", file=sys.stderr)

    @staticmethod
    def _second(signum, _frame) -> None:
        print(f"{signal.Signals(signum).name} again: exiting now", file=sys.stderr, flush=True)
        os._exit(128 + signum)

    def restore(self) -> None:
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)


def stopped_status(trainer, schedule, signum: int | None) -> int:
    """What a stopped run says: where to resume from, or that nothing was kept; 128 + the
    signal's number, as a shell reports a run a signal ended."""
    from layerslide.training.rank_checkpoints import newest_checkpoint

    print(f"stopped after step {trainer.step}; the model is not saved to --out", file=sys.stderr)
    latest = None if schedule is None else newest_checkpoint(schedule.store)
    if latest is not None:
        print(f"checkpoint {latest.path} holds it: continue with "
              f"`layerslide train --resume {schedule.store.root}`", file=sys.stderr)
    else:
        print("no checkpoint is kept (no --checkpoint-dir): these steps are lost",
              file=sys.stderr)
    return 128 + (signum or signal.SIGINT)
