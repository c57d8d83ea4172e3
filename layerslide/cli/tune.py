"""`layerslide tune`: the best plan for a model on a profile, found by simulating the search
space best-bound first; prints the pick (or JSON) and writes it with -o."""

from __future__ import annotations

import sys

import pandas as pd

from layerslide.cli.options import (
    UsageError,
    gib,
    model_of,
    profile_of,
    progress_printer,
    tolerance_of,
    with_env_overrides,
)
from layerslide.cli.printing import gib_columns, print_json, records
from layerslide.cli.refusals import (
    check_gpu_cap,
)
from layerslide.cli.tune_data import data_capped
from layerslide.outputs import writable_file
from layerslide.planner import Policy, TrainSpec
from layerslide.reports import (
    format_table,
)
from layerslide.simulator.ranks import check_ranks
from layerslide.tuner import SearchSpace, tune
from layerslide.tuner.lanes_first import chosen_in_environment


def _rejection_lines(result) -> list[str]:
    lines = []
    for tier, count in sorted(result.rejections().items()):
        worst = [c for c in result.candidates
                 if any(o.tier == tier for o in c.prediction.overflows)]
        example = worst[0].row()
        lines.append(f"  {count} over {tier} memory, e.g. micro_batch={example['micro_batch']} "
                     f"window={example['window']} activations={example['activations']}: "
                     f"{worst[0].prediction.reason}")
    return lines


def space_of(args) -> SearchSpace:
    defaults = SearchSpace()
    return SearchSpace(
        windows=args.windows or defaults.windows,
        micro_batches=args.micro_batches or defaults.micro_batches,
        grad_accums=args.grad_accums or defaults.grad_accums,
        accumulations=args.accumulations or defaults.accumulations,
        # schedules named on the command line are each tried at every accumulation
        step_major_max_accum=(max(args.grad_accums or defaults.grad_accums)
                              if args.accumulations else defaults.step_major_max_accum),
        max_tokens_per_step=(defaults.max_tokens_per_step if args.max_tokens_per_step is None
                             else args.max_tokens_per_step or None),
        activations=args.activations_list or defaults.activations,
        casts=args.casts or defaults.casts,
        optimizer_orders=args.optimizer_orders or defaults.optimizer_orders,
        moment_precisions=args.moment_precisions or defaults.moment_precisions,
        allow_nvme=not args.no_nvme, fill_gpu_updates=not args.no_gpu_updates,
        lanes_first=not chosen_in_environment())  # else the niceness set stays


def _by_accumulation(result) -> list[str]:
    """The fastest fitting candidate of each (accumulation, schedule), with what bounds it."""
    best: dict[tuple[int, str], object] = {}
    for c in result.feasible:  # best first
        key = (c.train.grad_accum, c.policy.schedule.accumulation)
        best.setdefault(key, c)
    return [f"x{ga}{'' if ga == 1 else ' ' + acc.replace('_major', '-major')} "
            f"{c.prediction.tokens_per_s:,.0f} tokens/s ({c.prediction.bottleneck}-bound)"
            for (ga, acc), c in sorted(best.items())]


def cmd_tune(args) -> int:
    model, profile = model_of(args), profile_of(args.profile, args.nvme_drives)
    tolerance = tolerance_of(args)
    check_gpu_cap(args.gpu_memory, profile)
    writable_file("-o", args.output)
    ranks = {"gpus": args.gpus, "hosts": args.hosts}
    TrainSpec(seq_len=args.seq_len, max_grad_norm=args.max_grad_norm, **ranks)  # before the sweep
    try:
        check_ranks(profile, **ranks)
    except ValueError as err:
        raise UsageError(str(err).replace("plan with", "tune with")) from None
    if args.tokenizer and not args.data:
        raise UsageError("--tokenizer counts --data's tokens: give --data FILE too")
    space = data_capped(space_of(args), args, model) if args.data else space_of(args)
    result = tune(model, profile, seq_len=args.seq_len, max_grad_norm=args.max_grad_norm,
                  space=space, gpu_memory_bytes=args.gpu_memory,
                  base_policy=with_env_overrides(Policy.of()), exhaustive=args.exhaustive,
                  tolerance=tolerance, progress=progress_printer("tune: candidates"), **ranks)
    if result.interrupted:
        print(f"interrupted (Ctrl-C): the best of the {len(result.candidates)} candidates "
              "simulated so far", file=sys.stderr)
    if args.output and result.best_plan is not None:
        result.best_plan.save(args.output)
    table = pd.DataFrame([c.row() for c in result.candidates])
    if args.json:
        rows = records(table)
        print_json({"best": rows[0] if result.best else None, "candidates": rows,
                     "pruned": result.pruned, "not_simulated": result.bounded,
                     "interrupted": result.interrupted,
                     "plan_file": args.output if result.best_plan is not None else None})
        return 130 if result.interrupted else 0 if result.best else 1
    _print_tune_table(args, model, profile, result, table)
    lines = _rejection_lines(result)
    if lines:
        print("rejected:")
        print("\n".join(lines))
    if result.best_plan is None:
        print("nothing fits: see the rejections above")
        return 1
    if args.output:
        print(f"best plan written to {args.output} (for `layerslide simulate --plan` and train)")
    return 130 if result.interrupted else 0


def _print_tune_table(args, model, profile, result, table: pd.DataFrame) -> None:
    """tune's headline, its best candidates and the best of each accumulation."""
    pruned = (f", {result.pruned} more not tried (a smaller micro-batch of the same settings "
              "overflowed the GPU)") if result.pruned else ""
    if result.bounded:
        pruned += (f", {result.bounded} not simulated (their bound could not beat the best; "
                   "--exhaustive simulates them all)")
    on = (f"{args.gpus} GPUs x {args.hosts} hosts of {profile.name} (one rank tuned on its "
          "share of the host; tokens/s are every rank's, memory one rank's)"
          if args.gpus * args.hosts > 1 else profile.name)
    print(f"tune {model.name} on {on}: {len(result.candidates)} candidates{pruned}, "
          f"{len(result.feasible)} fit"
          + (f" (GPU capped at {gib(args.gpu_memory):.1f} GiB)" if args.gpu_memory else ""))
    shown = ["micro_batch", "grad_accum", *(["tokens_per_step"] if args.gpus * args.hosts > 1
                                            else []),
             "accumulation", "window", "activations", "cast",
             "gpu_updated_blocks",
             "gpu_updated_order", "moments_on_nvme", "master_on_nvme", "weights_on_nvme",
             "step_s", "floor_s", "tokens_per_s", "mfu", "bottleneck", "gpu_need_bytes",
             "peak_host_bytes"]
    if len(set(table["moment_precision"])) > 1:  # asked for: which one each row has
        shown.insert(shown.index("step_s"), "moment_precision")
    if len(set(table["cpu_nice"])) > 1:  # the GPU-bound leaders niced (tuner.lanes_first)
        shown.insert(shown.index("step_s"), "cpu_nice")
    if result.feasible:
        print(format_table(gib_columns(table[table.feasible].head(args.top)[shown])))
        print("best by accumulation" + (" (of those simulated)" if result.bounded else "")
              + ": " + "; ".join(_by_accumulation(result)))
