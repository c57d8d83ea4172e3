"""How fast the planner and simulator are (benchmarks/sim_speed.py): one step of
Mistral-Large-123B, and a tuning sweep of 504 Llama-3.1-8B configurations. CPU only."""

from benchmarks.registry import Case, Suite, step

SUITE = Suite(
    name="sim-speed",
    what="build_plan + simulate of a 123B step and a 504-configuration tune sweep (CPU)",
    current="benchmarks/results/sim_speed.md",
    reproduce="any machine (the targets are for 2 cores); ~4 min",
    cases=(
        Case("default", "the 123B step and the 504-configuration sweep",
             (step("{python} benchmarks/sim_speed.py --out {out}/sim_speed.md", timeout_s=600),),
             needs="cpu"),
    ),
)
