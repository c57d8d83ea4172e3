"""One module per suite, each defining `SUITE = Suite(...)` (benchmarks.registry). A new suite
is a new module here: `python -m benchmarks --list` finds it; nothing else lists suites.
Modules whose name starts with `_` are helpers, not suites."""
