"""The simulator's scoreboard (benchmarks/validation_scoreboard.py): every committed H200
validation row since 2026-12-03 predicted again by this checkout on its own call's calibration,
judged by regime. CPU only: the measurements are the committed ones."""

from benchmarks.registry import Case, Suite, step
from benchmarks.suites._summaries import validation

SUITE = Suite(
    name="scoreboard",
    what="today's simulator against the 46 committed H200 runs of 3B-14B (CPU, no training)",
    current="benchmarks/results/scoreboard_2026-12-04d/validation_summary.json",
    reproduce="any machine; under 2 minutes on 2 cores",
    cases=(
        Case("default", "every committed call of issue 26 predicted again",
             (step("{python} benchmarks/validation_scoreboard.py --out {out}", timeout_s=600),),
             needs="cpu", summarize=validation),
    ),
)
