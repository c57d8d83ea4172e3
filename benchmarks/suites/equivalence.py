"""Predictions of 27 fixed configurations, compared exactly against a stored run: what a
refactor that should change no prediction must leave alone (benchmarks/plan_equivalence.py).
CPU only."""

from benchmarks.registry import Case, Suite, step

SUITE = Suite(
    name="equivalence",
    what="27 fixed configurations' step, peaks and trace digests against the stored run (CPU)",
    current="benchmarks/results/plan_equivalence/after_session19.json",
    reproduce="any machine; ~2 min. Compare two runs with "
              "`python benchmarks/plan_equivalence.py --compare A.json B.json`",
    cases=(
        Case("predict", "predict the fixed configurations into predictions.json",
             (step("{python} benchmarks/plan_equivalence.py --out {out}/predictions.json",
                   timeout_s=600),),
             needs="cpu"),
    ),
)
