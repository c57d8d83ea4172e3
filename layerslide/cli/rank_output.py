"""What each rank of a run of several says: the first rank (0) speaks for the run; the others
print nothing but their own errors, each line prefixed with the rank, so that N ranks make one
run's output and an error still says where it happened."""

from __future__ import annotations

import os
import sys
import traceback
from typing import TextIO


class _Prefixed:
    """A text stream that writes each line to `to` with `prefix` before it."""

    def __init__(self, to: TextIO, prefix: str):
        self.to, self.prefix, self._at_line_start = to, prefix, True

    def write(self, text: str) -> int:
        for piece in text.splitlines(keepends=True):
            self.to.write((self.prefix if self._at_line_start else "") + piece)
            self._at_line_start = piece.endswith("\n")
        return len(text)

    def flush(self) -> None:
        self.to.flush()


_errors: _Prefixed | None = None  # this rank's errors, where it is not the first


def errors() -> TextIO:
    """Where an error goes: stderr, prefixed with the rank on ranks but the first."""
    return _errors if _errors is not None else sys.stderr


def speak_only_on_first(rank: int) -> None:
    """For the rest of this process: on a rank but the first, stdout and stderr (logs, notes,
    warnings, the progress bar) go nowhere; errors() and uncaught exceptions' tracebacks go to
    the real stderr, prefixed `rank R: `. Called again after joining: torch's own prefixing
    hook then writes to the silenced stderr."""
    global _errors
    if rank == 0:
        return
    if _errors is None:
        _errors = _Prefixed(sys.stderr, f"rank {rank}: ")
        sys.stdout = sys.stderr = open(os.devnull, "w")  # noqa: SIM115 (the process's life)
    sys.excepthook = _to_errors


def _to_errors(kind, error, trace) -> None:
    traceback.print_exception(kind, error, trace, file=errors())
    errors().flush()
