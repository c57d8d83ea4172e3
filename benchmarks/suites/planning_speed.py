"""How fast tune answers (benchmarks/planning_speed.py): the exhaustive search and the
best-first one side by side in one process on fixed (model, profile, GPU cap, space) cases,
and whether they pick the same; the demo, tune, what-if and the purchase question timed as a
user runs them. CPU only."""

from benchmarks.registry import Case, Suite, step


def _summary(out):
    from benchmarks.suites._summaries import json_file

    data = json_file(out, "planning_speed.json")["summary"]
    return {k: data[k] for k in ("cases", "identical", "min_tokens_per_s_ratio",
                                 "exhaustive_wall_s", "fast_wall_s")}


def _commands_summary(out):
    from benchmarks.suites._summaries import json_file

    data = json_file(out, "planning_commands.json")
    return {row["command"]: {v: round(run["wall_s"], 1) for v, run in row["runs"].items()}
            for row in data["commands"]}


SUITE = Suite(
    name="planning-speed",
    what="tune's exhaustive search against its best-first one: time and picks (CPU)",
    current="benchmarks/results/planning-speed/README.md",
    reproduce="any machine (the targets are for 2 cores); speed ~15 min, quality ~30 min on "
              "2 cores (both searches of every case)",
    cases=(
        Case("speed", "3B, Qwen3-32B and Mistral-Large-123B over tune's default space, 3B "
                      "over what-if's and 70B over the purchase search's: both searches",
             (step("{python} benchmarks/planning_speed.py --set speed --out {out}",
                   timeout_s=3600),),
             needs="cpu", summarize=_summary),
        Case("quality", "48 (model, profile, GPU cap, space) cases, 3B to 123B, every "
                        "built-in profile: the best-first pick against the exhaustive one",
             (step("{python} benchmarks/planning_speed.py --set quality --out {out}",
                   timeout_s=4 * 3600),),
             needs="cpu", summarize=_summary),
        Case("commands", "the demo, tune (3B, 32B, 70B, 123B), what-if of 70B across the "
                         "profiles and the purchase question for 70B as a user runs them, "
                         "exhaustive and best-first (add --baseline DIR: the code before)",
             (step("{python} benchmarks/planning_commands.py --out {out}", timeout_s=4 * 3600),),
             needs="cpu", summarize=_commands_summary),
        Case("smoke", "two small cases of 1B: both searches agree",
             (step("{python} benchmarks/planning_speed.py --set smoke --out {out}",
                   timeout_s=600),),
             needs="cpu", summarize=_summary),
    ),
)
