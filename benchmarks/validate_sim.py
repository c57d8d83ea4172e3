"""The simulator against the executor: each configuration trained in a fresh process and
simulated on a (calibrated) profile; a table, a figure and the summary of errors and ranks.

    layerslide calibrate --out results/h200.toml --disk-dir /tmp/nvme
    python benchmarks/validate_sim.py --profile results/h200.toml --nvme-dir /tmp/nvme \
        --out results/validation

Configurations (CONFIGS): Llama-3.2-1B/3B, Llama-3.1-8B, Mistral-7B and Qwen3-4B/8B/14B, at
micro-batches from CPU-bound (1) to compute-bound (64), windows 1-4, checkpoints on the GPU, the
host and NVMe, step- and layer-major accumulation, moments on NVMe or in 8 bits, and tune's pick
at 3B micro-batch 8 (to see whether it is within 3% of the best measured there).
"""

from __future__ import annotations

import argparse
import json
import math
import multiprocessing
import os
import statistics
import sys
import time
import traceback
from collections.abc import Callable
from pathlib import Path

MAX_STEPS = 16  # per configuration, whatever --min-steady-s asks
CONFIGS = {
    "1b-mb1-w2-host": {"model": "llama-3.2-1b", "micro_batch": 1, "window": 2},
    "1b-mb8-w2-host": {"model": "llama-3.2-1b", "micro_batch": 8, "window": 2},
    "1b-mb8-w1-gpu": {"model": "llama-3.2-1b", "micro_batch": 8, "window": 1,
                      "activations": "gpu"},
    "1b-mb8-w4-host": {"model": "llama-3.2-1b", "micro_batch": 8, "window": 4},
    "1b-mb32-w2-gpu": {"model": "llama-3.2-1b", "micro_batch": 32, "window": 2,
                       "activations": "gpu"},
    "1b-mb8-w2-nvme0.5": {"model": "llama-3.2-1b", "micro_batch": 8, "window": 2,
                          "moments_on_nvme": 0.5},
    "3b-mb1-w2-host": {"model": "llama-3.2-3b", "micro_batch": 1, "window": 2},
    "3b-mb4-w2-gpu": {"model": "llama-3.2-3b", "micro_batch": 4, "window": 2,
                      "activations": "gpu"},
    "3b-mb8-w2-host": {"model": "llama-3.2-3b", "micro_batch": 8, "window": 2},
    "3b-mb8-w4-gpu": {"model": "llama-3.2-3b", "micro_batch": 8, "window": 4,
                      "activations": "gpu"},
    "3b-mb8-tuned": {"model": "llama-3.2-3b", "micro_batch": 8, "tuned": True},
    "3b-mb16-w1-host": {"model": "llama-3.2-3b", "micro_batch": 16, "window": 1},
    "3b-mb32-w2-host": {"model": "llama-3.2-3b", "micro_batch": 32, "window": 2},
    "3b-mb64-w2-host": {"model": "llama-3.2-3b", "micro_batch": 64, "window": 2},
    # beyond the models the profile's figures were fitted on (issue 26): other sizes, vocabularies
    # and families, accumulation step- and layer-major, checkpoints on GPU/host/NVMe, GPU-updated
    # blocks (state on the drive: 1b-mb8-w2-nvme0.5; this machine's disk makes 7B's take ~36 s)
    "8b-mb1-w2-host": {"model": "llama-3.1-8b", "micro_batch": 1, "window": 2},
    "8b-mb8-w2-host": {"model": "llama-3.1-8b", "micro_batch": 8, "window": 2},
    "8b-mb16-w2-host": {"model": "llama-3.1-8b", "micro_batch": 16, "window": 2},
    "8b-mb4x4-w2-host-lm": {"model": "llama-3.1-8b", "micro_batch": 4, "grad_accum": 4,
                            "window": 2, "policy": {"accumulation": "layer_major"}},
    "8b-mb8-w2-host-gpu2": {"model": "llama-3.1-8b", "micro_batch": 8, "window": 2,
                            "policy": {"gpu_updated_blocks": 2}},
    "mistral7b-mb8-w2-host": {"model": "mistral-7b", "micro_batch": 8, "window": 2},
    "mistral7b-mb32-w2-host": {"model": "mistral-7b", "micro_batch": 32, "window": 2},
    "mistral7b-mb16-w2-gpu": {"model": "mistral-7b", "micro_batch": 16, "window": 2,
                              "activations": "gpu"},
    "qwen4b-mb1-w2-host": {"model": "qwen3-4b", "micro_batch": 1, "window": 2},
    "qwen4b-mb4-w2-gpu": {"model": "qwen3-4b", "micro_batch": 4, "window": 2,
                          "activations": "gpu"},
    "qwen4b-mb32-w2-host": {"model": "qwen3-4b", "micro_batch": 32, "window": 2},
    "qwen4b-mb4x4-w2-host": {"model": "qwen3-4b", "micro_batch": 4, "grad_accum": 4,
                             "window": 2},
    "qwen4b-mb4x4-w2-host-lm": {"model": "qwen3-4b", "micro_batch": 4, "grad_accum": 4,
                                "window": 2, "policy": {"accumulation": "layer_major"}},
    "qwen4b-mb8-w2-nvme": {"model": "qwen3-4b", "micro_batch": 8, "window": 2,
                           "activations": "nvme"},
    "qwen8b-mb8-w2-host": {"model": "qwen3-8b", "micro_batch": 8, "window": 2},
    "qwen8b-mb8x4-w2-host-lm": {"model": "qwen3-8b", "micro_batch": 8, "grad_accum": 4,
                                "window": 2, "policy": {"accumulation": "layer_major"}},
    # 14B's fp32 moments do not fit the H200 machine's 128 GiB beside its master weights (tune's
    # pick spills 55% to a 0.6 GB/s disk: 95 s a step, tune_pick_2026-12-02); 8-bit ones do
    "qwen14b-mb8-w2-host-int8": {"model": "qwen3-14b", "micro_batch": 8, "window": 2,
                                 "policy": {"moment_precision": "int8"}},
    # executor variants: the same plan run another way, side by side with it in the same call
    # and reported apart from the validation. Capped at the predicted allocated peak + 3%: does
    # the plan run (as fast) in the memory the simulator says it allocates? (Unpressed, the
    # caching allocator keeps what it once mapped, per stream.)
    "3b-mb32-w2-host-cap": {"model": "llama-3.2-3b", "micro_batch": 32, "window": 2,
                            "cap_over_predicted": 0.03, "variant_of": "3b-mb32-w2-host"},
    "3b-mb8-w2-host-cap": {"model": "llama-3.2-3b", "micro_batch": 8, "window": 2,
                           "cap_over_predicted": 0.03, "variant_of": "3b-mb8-w2-host"},
    # the executor as it was before its stream lanes' run-ahead was bounded (engine.py)
    "3b-mb32-w2-host-unbounded": {"model": "llama-3.2-3b", "micro_batch": 32, "window": 2,
                                  "policy": {"stream_run_ahead": 0},
                                  "variant_of": "3b-mb32-w2-host"},
    # half the head's logits chunk (0.5 GiB): the GPU stream's reserve grew for the head's two
    # large blocks (allocator histories, validation_2026-11-30d/e); a smaller one leaves smaller
    # holes to find
    "3b-mb8-w2-host-head512": {"model": "llama-3.2-3b", "micro_batch": 8, "window": 2,
                               "policy": {"head_chunk_bytes": 512 * 2**20},
                               "variant_of": "3b-mb8-w2-host"},
    "3b-mb32-w2-host-head512": {"model": "llama-3.2-3b", "micro_batch": 32, "window": 2,
                                "policy": {"head_chunk_bytes": 512 * 2**20},
                                "variant_of": "3b-mb32-w2-host"},
    # the caching allocator without expandable segments (the executor turns them on)
    "3b-mb8-w2-host-fixed-segments": {"model": "llama-3.2-3b", "micro_batch": 8, "window": 2,
                                      "env": {"PYTORCH_CUDA_ALLOC_CONF":
                                              "expandable_segments:False"},
                                      "variant_of": "3b-mb8-w2-host"},
    # activation checkpoints through the page cache, as the executor wrote them until session
    # 28 (O_DIRECT since: benchmarks/results/archive/activation_io_2026-12-04)
    "qwen4b-mb8-w2-nvme-buffered": {"model": "qwen3-4b", "micro_batch": 8, "window": 2,
                                    "activations": "nvme",
                                    "env": {"LAYERSLIDE_ACTIVATION_IO": "buffered"},
                                    "variant_of": "qwen4b-mb8-w2-nvme"},
    "3b-mb1-w2-host-unbounded": {"model": "llama-3.2-3b", "micro_batch": 1, "window": 2,
                                 "policy": {"stream_run_ahead": 0},
                                 "variant_of": "3b-mb1-w2-host"},
}
# executor variants of the GPU lane's enqueue, which ran 1.4-1.8x slower beside the CPU AdamW
# than without it (validation_2026-12-04b call1): AdamW on fewer threads than cores, its workers
# niced, the lanes' GIL switch interval at 1 ms, the lanes told of landed GPU work by watchers
for _base in ("qwen4b-mb4x4-w2-host-lm", "mistral7b-mb8-w2-host", "8b-mb4x4-w2-host-lm",
              "qwen4b-mb4-w2-gpu"):
    # (each names its niceness, so that train's lanes-first rule changes nothing but its knob)
    for _suffix, _knobs in (("t12", {"cpu_threads": 12, "cpu_nice": 0}),
                            ("t14", {"cpu_threads": 14, "cpu_nice": 0}),
                            ("nice0", {"cpu_nice": 0}), ("nice10", {"cpu_nice": 10}),
                            ("nice19", {"cpu_nice": 19}),
                            ("switch1ms", {"lane_switch_interval_s": 1e-3, "cpu_nice": 0}),
                            ("watch", {"lane_waits": "watch", "cpu_nice": 0})):
        CONFIGS[f"{_base}-{_suffix}"] = {
            **CONFIGS[_base], "variant_of": _base,
            "policy": {**CONFIGS[_base].get("policy", {}), **_knobs}}


def run_one(label: str, cfg: dict, args) -> dict:
    """Train one configuration here and simulate its plan; the measured and predicted row."""
    os.environ.update(cfg.get("env", {}))  # an executor variant's settings
    phase_s, mark = {}, time.monotonic()

    def phase(name: str) -> None:  # where a configuration's wall time goes
        nonlocal mark
        now = time.monotonic()
        phase_s[name] = round(now - mark, 2)
        mark = now

    import torch

    from layerslide.data.sources import SyntheticTokens
    from layerslide.executor.blocks import hf_config_from_spec
    from layerslide.executor.optim import OptimConfig
    from layerslide.hwprofiles import load_profile
    from layerslide.hwprofiles.units import parse_bytes
    from layerslide.planner.build import build_plan
    from layerslide.planner.model import resolve_model
    from layerslide.planner.settings import Policy, TrainSpec
    from layerslide.reports.validation import adamw_rates_by_company, gpu_dispatch, median_task_s
    from layerslide.training.trainer import Trainer
    from layerslide.tuner import SearchSpace, tune

    spec = resolve_model(args.model_override or cfg["model"])
    train = TrainSpec(micro_batch=cfg["micro_batch"], seq_len=args.seq_len,
                      grad_accum=cfg.get("grad_accum", 1))
    profile = load_profile(args.profile)
    cap = parse_bytes(args.gpu_memory)
    if cfg.get("tuned"):
        space = SearchSpace(micro_batches=(train.micro_batch,), allow_nvme=False,
                            lanes_first=args.device.startswith("cuda"))
        best = tune(spec, profile, seq_len=train.seq_len, space=space, base_policy=Policy.of(),
                    gpu_memory_bytes=int(0.9 * cap)).best
        if best is None:
            raise SystemExit(f"{label}: tune found nothing that fits")
        policy = best.policy
    else:
        policy = Policy.of(window=cfg["window"], activations=cfg.get("activations", "host"),
                        moments_on_nvme=cfg.get("moments_on_nvme", 0.0), **cfg.get("policy", {}))
    config = (hf_config_from_spec(spec) if not args.model_override
              else __import__("transformers").AutoConfig.from_pretrained(args.model_override))
    phase("import_and_plan")
    before = adamw_just_before(profile, args.adamw_before_block) if args.adamw_before_block \
        else None
    prediction = predict(spec, train, policy, profile, cap, keep_trace=True)
    niced = as_train_runs_it(policy, cfg, prediction["predicted_bottleneck"], args.device)
    if niced is not None:
        policy = niced
        prediction = predict(spec, train, policy, profile, cap, keep_trace=True)
    # the allocator's cap (torch's memory fraction: allocations only, no CUDA context)
    allocator_cap = cap
    if cfg.get("cap_over_predicted") is not None:
        allocator_cap = int(prediction["predicted_gpu_allocated_bytes"]
                            * (1 + cfg["cap_over_predicted"]))
    predicted_trace = prediction.pop("trace")
    # the first 2 steps carry compilation and first touches; short steps vary by +-15% one to
    # the next (1B micro-batch 8 on the H200: 0.278, 0.360, 0.305 s), so run enough of them
    predicted_step_s = prediction["predicted_step_s"]
    wanted = (2 + math.ceil(args.min_steady_s / predicted_step_s)
              if args.min_steady_s and predicted_step_s else 0)
    steps = max(args.steps, min(wanted, MAX_STEPS))
    history = (args.traces is not None and args.device.startswith("cuda")
               and label in args.allocator_history.split(","))
    phase("predict")
    with Trainer(config=config, plan=build_plan(spec, train, policy), optim=OptimConfig(lr=1e-5),
                 device=args.device, gpu_memory_bytes=allocator_cap,
                 nvme_dir=args.nvme_dir) as trainer:
        if history:  # from here (the device's allocator settings are in force): every
            # allocation, free and segment change with its stream and time (context=None: no
            # stack traces; `stacks` then has nothing to say)
            torch.cuda.memory._record_memory_history(context=None, stacks="python")
        phase("allocate_state")
        trainer.init_random(0)
        phase("init_weights")
        cuda = args.device.startswith("cuda")
        data = SyntheticTokens(spec.vocab_size, train.seq_len)
        fit_start_s = time.time()
        # Warm-up: the first steps compile kernels and place blocks in an order later steps do
        # not repeat (allocator histories: the reserve grew in steps 0 and 1, then never); what
        # the cache kept from them goes back before the measured steps, so their reserve is
        # the steady state's
        step_ends_s: list[float] = []  # wall clock as each step has run (allocator history)

        def step_done(_step: int) -> None:
            step_ends_s.append(time.time())

        warmup = (trainer.fit(data, args.warmup_steps, on_step_done=step_done)
                  if args.warmup_steps else [])
        first_reserved = torch.cuda.max_memory_reserved() if cuda else 0
        if cuda and warmup:
            torch.cuda.empty_cache()
            torch.cuda.reset_peak_memory_stats()
        logs = trainer.fit(data, steps, on_step_done=step_done)
        fit_end_s = time.time()
        phase("train")
        reserved = torch.cuda.max_memory_reserved() if cuda else 0
        gpu_detail = gpu_memory_detail(trainer.device) if cuda else {}
        trace = trainer.trace(label)
        first_steady = len(warmup) + min(2, steps - 1)
        task_s = median_task_s(trace, spec.num_layers, first_step=first_steady)
        adamw_company = adamw_rates_by_company(trace, layer_params=spec.layer_params,
                                               num_layers=spec.num_layers,
                                               first_step=first_steady)
        dispatch = gpu_dispatch(trace, spec.num_layers, first_step=first_steady)
        land_in_upload = trainer.state.land_in_upload
    if args.traces:
        args.traces.mkdir(parents=True, exist_ok=True)
        save_gz(trace, args.traces / f"{label}.measured.json.gz")
        save_gz(predicted_trace, args.traces / f"{label}.predicted.json.gz")
        if history:
            try:  # a diagnostic: the row stands without it
                save_allocator_history(args.traces / f"{label}.allocator.pickle.gz",
                                       fit_s=(fit_start_s, fit_end_s),
                                       step_s=[log.step_s for log in warmup + logs],
                                       step_ends_s=step_ends_s)
            except Exception as error:  # noqa: BLE001
                print(f"{label}: the allocator history was not saved: {error!r}", flush=True)
    phase("close_and_save")
    steady = logs[2:] or logs[-1:]  # the first steps carry compilation and first touches
    return {
        "label": label, "config": cfg, "policy": policy.to_dict(), "seq_len": train.seq_len,
        "gpu_memory_bytes": cap, "allocator_cap_bytes": allocator_cap,
        "model_override": args.model_override,
        "group": f"{cfg['model']} micro-batch {cfg['micro_batch']}",
        "measured_step_s": statistics.median(log.step_s for log in steady),
        "measured_gpu_allocated_bytes": max(log.gpu_peak_bytes for log in logs),
        "measured_gpu_reserved_bytes": reserved,
        "measured_gpu_reserved_warmup_bytes": first_reserved if warmup else None,
        "warmup_step_times_s": [log.step_s for log in warmup],
        "measured_host_bytes": max(log.host_rss_bytes for log in logs),
        "step_times_s": [log.step_s for log in logs], "measured_task_s": task_s,
        "measured_adamw_by_company": adamw_company, "measured_dispatch": dispatch,
        "grads_land_in_upload": land_in_upload, "embedding_grad_into_tied": True,
        "gpu_memory_detail": gpu_detail, "phase_s": phase_s, **prediction,
        **at_measured_adamw(spec, train, policy, profile, cap, task_s),
        **(at_adamw_before(spec, train, policy, profile, cap, before) if before else {}),
    }


def adamw_just_before(profile, block_params: int) -> float:
    """calibrate's AdamW test (four blocks in turn, their mean rate), run just before a row,
    with the profile's fixed time of a call taken out: the figure the profile holds, as the
    machine gives it now. The lent machines' rate drifted 8-19% between calibration and a row
    minutes later (validation_2026-12-04c), more than the rows' repeat spreads."""
    from layerslide.calibrate import ADAMW_ARRAYS, without_call
    from layerslide.calibrate.host import adamw_throughput

    rate = adamw_throughput(ADAMW_ARRAYS * block_params, repeats=6, arrays=ADAMW_ARRAYS).value
    return without_call(rate, block_params, profile.host.adamw_call_s)


def at_adamw_before(spec, train, policy, profile, cap: int, rate: float) -> dict:
    """The step predicted with AdamW at the rate measured just before the row: a prediction
    (nothing of the run is read), on a figure minutes fresher than the calibration's."""
    found = predict(spec, train, policy, at_adamw_rate(profile, rate), cap)
    return {"adamw_before_params_per_s": rate,
            "predicted_step_s_at_adamw_before": found["predicted_step_s"]}


def at_adamw_rate(profile, rate: float):
    """The profile with AdamW at `rate` (HardwareProfile.with_adamw_rate), a what-if."""
    return profile.with_adamw_rate(rate, "what-if: validate_sim")


def profile_adamw_rate(name: str) -> float:
    from layerslide.hwprofiles import load_profile

    return load_profile(name).host.adamw_params_per_s


# rounds of rescaling the rate by measured / simulated median: the copies beside AdamW could
# slow it differently at the new rate; on call o's rows one rescale already matched to 0.01%
AT_MEASURED_ROUNDS = 3


def at_measured_adamw(spec, train, policy, profile, cap: int, measured_task_s: dict) -> dict:
    """The step predicted with AdamW at the rate the run's own decoder layers kept: the rate
    that makes the predicted layers' optimizer tasks (median, beside the copies as simulated)
    take as long as the measured ones did, found in a few rounds of rescaling. Not a
    prediction (it reads the measurement): it splits a row's step-time error into the AdamW
    rate the machine held during that row and what the model misses with that rate given.
    The lent machine's rate moves by more than the step-time target (benchmarks/results,
    session 11: calibrate's own AdamW test read 4.40, 5.13 and 5.47 Gparam/s within one
    process and a minute)."""
    from layerslide.reports.validation import LAYER_ADAMW

    measured = measured_task_s.get(LAYER_ADAMW)
    if not measured:
        return {}
    rate = profile.host.adamw_params_per_s
    for _ in range(AT_MEASURED_ROUNDS):
        found = predict(spec, train, policy, at_adamw_rate(profile, rate), cap)
        predicted = found["predicted_task_s"].get(LAYER_ADAMW)
        if not predicted:
            return {}
        rate *= predicted / measured
    found = predict(spec, train, policy, at_adamw_rate(profile, rate), cap)
    return {"adamw_in_situ_params_per_s": rate,
            "predicted_step_s_at_measured_adamw": found["predicted_step_s"]}


def preload() -> None:
    """Import what every configuration imports, before forking one process per configuration:
    this took 11-17 s of each configuration's wall time on the H200 machine. CUDA stays
    uninitialised here (a forked child cannot use a parent's CUDA context)."""
    import torch
    import transformers  # noqa: F401

    import layerslide.training.trainer
    import layerslide.tuner  # noqa: F401
    from layerslide.executor.blocks import ModelBlocks, hf_config_from_spec
    from layerslide.planner.model import resolve_model

    for model in sorted({cfg["model"] for cfg in CONFIGS.values()}):
        ModelBlocks(hf_config_from_spec(resolve_model(model)))  # the HF modules it loads
    if torch.cuda.is_initialized():
        raise RuntimeError("preloading initialised CUDA: the forked runs could not use it")


def run_forked(label: str, args, timeout_s: float | None) -> tuple[dict | None, str]:
    """One configuration in a forked process (its own CUDA context, allocator and RSS): its
    row, or None and why it failed."""
    context = multiprocessing.get_context("fork")
    reader, writer = context.Pipe(duplex=False)
    # not a daemon: tune, in the child, starts worker processes of its own
    child = context.Process(target=_forked_child, args=(label, args, writer))
    child.start()
    writer.close()
    answered = False
    try:
        if not reader.poll(timeout_s):
            return None, "timed out at the deadline"
        kind, payload = reader.recv()
        answered = True
    except EOFError:
        kind, payload, answered = "died", "the process died without a row", True
    finally:  # a timeout or Ctrl-C here must not leave a child training on
        if not answered:
            child.kill()
        child.join()
        reader.close()
    if kind == "row":
        return payload, ""
    if kind == "died":
        return None, f"failed (exit {child.exitcode}): {payload}"
    return None, f"failed: {payload[-1500:]}"


def _forked_child(label: str, args, writer) -> None:
    try:
        writer.send(("row", run_one(label, CONFIGS[label], args)))
    except BaseException:  # noqa: BLE001 (reported by the parent)
        writer.send(("error", traceback.format_exc()))
    finally:
        writer.close()
        sys.stdout.flush()  # os._exit drops what is still buffered
        sys.stderr.flush()
        os._exit(0)  # no atexit handlers of the parent's in the child


def gpu_memory_detail(device) -> dict:
    """What the caching allocator held beyond the allocated peak, and on which lane's stream:
    the peak of active bytes (allocated, plus freed blocks another stream still uses), of
    inactive split bytes (free pieces of split blocks: fragmentation), and each stream's
    reserved segments at the end (a stream reuses only its own freed blocks)."""
    import torch

    stats = torch.cuda.memory_stats(device.device)
    lanes = device.lane_of_stream()
    by_lane: dict[str, int] = {}
    segments: dict[str, int] = {}
    expandable = set()
    for segment in torch.cuda.memory_snapshot():
        lane = lanes.get(segment["stream"], f"stream {segment['stream']:#x}")
        by_lane[lane] = by_lane.get(lane, 0) + segment["total_size"]
        segments[lane] = segments.get(lane, 0) + 1
        expandable.add(bool(segment.get("is_expandable", False)))
    return {"active_peak_bytes": stats.get("active_bytes.all.peak", 0),
            "inactive_split_peak_bytes": stats.get("inactive_split_bytes.all.peak", 0),
            "reserved_by_lane_bytes": by_lane, "segments_by_lane": segments,
            "expandable_segments": sorted(expandable)}


def save_allocator_history(path: Path, *, fit_s: tuple[float, float], step_s: list[float],
                           step_ends_s: list[float]) -> None:
    """The caching allocator's recorded history (torch.cuda.memory._snapshot: segments and
    every alloc / free / map event per stream), with the training's wall-clock span, step
    times and each step's wall-clock end (as its host part finished) to place the events in
    steps; gzip'ed pickle."""
    import gzip
    import pickle

    import torch

    snapshot = torch.cuda.memory._snapshot()
    torch.cuda.memory._record_memory_history(enabled=None)
    snapshot["layerslide"] = {"fit_wall_s": fit_s, "step_s": step_s,
                              "step_end_wall_s": step_ends_s}
    with gzip.open(path, "wb") as f:
        pickle.dump(snapshot, f)


def save_gz(trace, path: Path) -> None:
    import gzip

    with gzip.open(path, "wt") as f:
        json.dump(trace.to_dict(), f)


def load_gz(path: Path):
    import gzip

    from layerslide.trace import Trace

    with gzip.open(path, "rt") as f:
        return Trace.from_dict(json.load(f))


def as_train_runs_it(policy, cfg: dict, bottleneck: str | None, device: str):
    """The row's policy as `layerslide train` runs it on a GPU: niced CPU kernels where it is
    GPU-bound (tuner.lanes_first), unless the row names its niceness or runs tune's pick (which
    has its own); None where it runs as given."""
    from layerslide.tuner.lanes_first import lanes_first

    if not device.startswith("cuda") or "cpu_nice" in cfg.get("policy", {}) or cfg.get("tuned"):
        return None
    return lanes_first(policy, bottleneck)


def predict(spec, train, policy, profile, cap: int, keep_trace: bool = False) -> dict:
    """The simulator's predicted_* fields for one configuration."""
    from layerslide.planner.build import build_plan
    from layerslide.reports.validation import (
        adamw_rates_by_company,
        gpu_dispatch,
        median_task_s,
        regime_of,
    )
    from layerslide.simulator.predict import simulate

    predicted = simulate(build_plan(spec, train, policy, num_steps=3), profile,
                         gpu_memory_bytes=cap)
    task_s = (median_task_s(predicted.trace, spec.num_layers, first_step=1)
              if predicted.trace else {})
    company = (adamw_rates_by_company(predicted.trace, layer_params=spec.layer_params,
                                      num_layers=spec.num_layers, first_step=1)
               if predicted.trace else {})
    dispatch = (gpu_dispatch(predicted.trace, spec.num_layers, first_step=1)
                if predicted.trace else {})
    return {"predicted_step_s": predicted.step_s, "predicted_task_s": task_s,
            "predicted_adamw_by_company": company, "predicted_dispatch": dispatch,
            "predicted_gpu_allocated_bytes": predicted.gpu_allocated_peak_bytes,
            # each stream's pool as the caching allocator's model reserves it
            "predicted_gpu_reserved_bytes": predicted.gpu_reserved_bytes,
            "predicted_host_bytes": predicted.peak_bytes["host"],
            "predicted_regime": regime_of(predicted.trace, first_step=1) if predicted.trace
            else None,
            "predicted_bottleneck": predicted.bottleneck,
            **({"trace": predicted.trace} if keep_trace else {})}


def row_settings(row: dict):
    """The model, training settings and policy a measured row ran (ModelSpec, TrainSpec,
    Policy), as its validation.json records them."""
    from layerslide.planner.model import resolve_model
    from layerslide.planner.settings import Policy, TrainSpec

    # rows of 2026-11-29 predate seq_len and grad_accum; they ran at the defaults then
    train = TrainSpec(micro_batch=row["config"]["micro_batch"], seq_len=row.get("seq_len", 1024),
                      grad_accum=row["config"].get("grad_accum", 1))
    policy = Policy.from_dict(row["policy"])
    run_ahead = row["config"].get("env", {}).get("LAYERSLIDE_RUN_AHEAD")
    if run_ahead is not None:  # variants of 2026-11-30 set the bound this way
        policy = policy.with_(stream_run_ahead=int(run_ahead))
    return resolve_model(row["config"]["model"]), train, policy


def repredict(paths: list[Path], profile_name: str, traces: Path | None = None,
              adjust: Callable | None = None) -> list[dict]:
    """Rows measured earlier (validation.json files), predicted again with this code and
    profile (changed by `adjust`, a what-if, where given): the measurements stay, only the
    model's side changes. A row measured before it kept its AdamW rates by company takes them
    from its measured trace in `traces`, if there (the trace of the call's last round)."""
    from layerslide.hwprofiles import load_profile
    from layerslide.planner.settings import grads_land_in_upload

    profile = load_profile(profile_name)
    if adjust is not None:
        profile = adjust(profile)
    rows = []
    for path in paths:
        for row in json.loads(path.read_text()):
            if row.get("model_override"):
                raise SystemExit(f"{path}: {row['label']} was measured on "
                                 f"{row['model_override']} (a smoke test), not its preset")
            spec, train, policy = row_settings(row)
            cap = row.get("gpu_memory_bytes", 24 * 2**30)
            row = {**row, **predict(spec, train, policy, profile, cap)}
            if "measured_adamw_by_company" not in row and traces is not None:
                row.update(company_from_trace(traces, row, spec))
            for key in ("adamw_in_situ_params_per_s", "predicted_step_s_at_measured_adamw"):
                row.pop(key, None)  # from an earlier profile
            row.update(at_measured_adamw(spec, train, policy, profile, cap,
                                         row.get("measured_task_s", {})))
            if row.get("grads_land_in_upload", False) != grads_land_in_upload(policy, train):
                # measured where the grads landed elsewhere than this plan has them (rows from
                # before 2026-11-30 had landing buffers: 2 B/param more RAM): no comparison
                print(f"{row['label']}: host RSS measured with the grads landing elsewhere "
                      "than this plan has them; left out of the host comparison",
                      file=sys.stderr)
                row["measured_host_bytes_other_landing"] = row["measured_host_bytes"]
                row["measured_host_bytes"] = None
            if spec.tie_word_embeddings and not row.get("embedding_grad_into_tied"):
                # measured before 2026-11-30, when a tied model's embedding backward made a
                # second [V, h] grad beside the head's: a GPU peak this plan no longer has
                print(f"{row['label']}: GPU memory measured with the embedding's own [V, h] "
                      "grad; left out of the GPU comparison", file=sys.stderr)
                for key in ("measured_gpu_allocated_bytes", "measured_gpu_reserved_bytes"):
                    row[f"{key}_separate_embedding_grad"] = row[key]
                    row[key] = None
            rows.append(row)
    return rows


def company_from_trace(folder: Path, row: dict, spec) -> dict:
    """measured_adamw_by_company from the row's measured trace in folder, over its steady steps
    (as run_one takes them), where the trace is there and is of this row: its policy and step
    count. A call keeps one trace per row, its last round's."""
    from layerslide.reports.validation import adamw_rates_by_company

    path = folder / f"{row['label']}.measured.json.gz"
    warmup, steps = len(row.get("warmup_step_times_s") or []), len(row.get("step_times_s") or [])
    if not path.exists() or not steps:
        return {}
    trace = load_gz(path)
    if (trace.meta.get("policy") != row["policy"]
            or 1 + max(e.step for e in trace.events) != warmup + steps):
        print(f"{row['label']}: {path} is of another run; no AdamW rates by company",
              file=sys.stderr)
        return {}
    return {"measured_adamw_by_company": adamw_rates_by_company(
        trace, layer_params=spec.layer_params, num_layers=spec.num_layers,
        first_step=warmup + min(2, steps - 1))}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--profile", default="h200-bench", help="profile name or calibrated file")
    ap.add_argument("--configs", default="all", help="comma-separated CONFIGS labels, or all")
    ap.add_argument("--steps", type=int, default=6, help="at least this many steps")
    ap.add_argument("--warmup-steps", type=int, default=0,
                    help="steps trained first and left out of every measurement; the "
                         "allocator's cache is emptied after them")
    ap.add_argument("--min-steady-s", type=float, default=0.0,
                    help="and enough that the steps after the first 2 take about this long "
                         f"(predicted; at most {MAX_STEPS} steps)")
    ap.add_argument("--repeats", type=int, default=1,
                    help="rounds over all configurations; each row then holds the median and "
                         "the report the spread between rounds")
    ap.add_argument("--seq-len", type=int, default=1024)
    ap.add_argument("--gpu-memory", default="24GiB")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--nvme-dir", default="/tmp/layerslide-nvme")
    ap.add_argument("--model-override", help="a config.json folder every configuration uses "
                                             "instead of its model (smoke tests)")
    ap.add_argument("--deadline", type=float, default=0.0,
                    help="seconds for all configurations; those that would start later are "
                         "skipped so that the report is still written (0: none)")
    ap.add_argument("--repredict", type=Path, nargs="+", metavar="JSON",
                    help="train nothing: predict the rows of these validation.json files again "
                         "with --profile and write the report of them to --out")
    ap.add_argument("--traces", type=Path,
                    help="a folder for each configuration's measured and predicted trace "
                         "(gzipped JSON, layerslide.trace.Trace); with --repredict, where "
                         "rows measured earlier find theirs")
    ap.add_argument("--allocator-history", default="", metavar="LABELS",
                    help="with --traces: record the caching allocator's every event for these "
                         "comma-separated labels (LABEL.allocator.pickle.gz)")
    ap.add_argument("--one", help=argparse.SUPPRESS)  # run this label here, print its row
    ap.add_argument("--adamw-before-block", type=int, default=0, metavar="PARAMS",
                    help="measure AdamW just before each row, on 4 blocks of this many params "
                         "(calibrate's thorough test: 268435456; ~16 B/param of RAM while it "
                         "runs), and predict the row at that rate too (0: not)")
    ap.add_argument("--out", type=Path)
    args = ap.parse_args()
    if args.allocator_history and args.traces is None:
        ap.error("--allocator-history writes into --traces DIR: give it")
    if args.one:
        print("ROW " + json.dumps(run_one(args.one, CONFIGS[args.one], args)), flush=True)
        return
    if args.out is None:
        ap.error("--out is required")
    if args.repredict:
        args.out.mkdir(parents=True, exist_ok=True)
        rows = repredict(args.repredict, args.profile, args.traces)
        (args.out / "validation.json").write_text(json.dumps(rows, indent=1))
        report(rows, args.out, profile_adamw_rate(args.profile))
        return
    labels = list(CONFIGS) if args.configs == "all" else args.configs.split(",")
    unknown = [label for label in labels if label not in CONFIGS]
    if unknown:
        ap.error(f"unknown configurations {unknown}; known: {', '.join(CONFIGS)}")
    args.out.mkdir(parents=True, exist_ok=True)
    # torch.cuda.is_available() in the parent would otherwise initialise the driver (no fork)
    os.environ.setdefault("PYTORCH_NVML_BASED_CUDA_CHECK", "1")
    preload()
    runs: dict[str, list[dict]] = {}  # label -> its rows, one per round
    rows, start = [], time.monotonic()
    for round_ in range(args.repeats):  # rounds, so a config's repeats are minutes apart
        for k, label in enumerate(labels):
            name = f"[{round_ + 1}.{k + 1}/{args.repeats}.{len(labels)}] {label}"
            left = args.deadline - (time.monotonic() - start) if args.deadline else None
            if left is not None and left < 30:
                print(f"{name}: skipped, the deadline is reached", flush=True)
                continue
            print(name, flush=True)
            row, failure = run_forked(label, args, timeout_s=left)
            if row is None:
                print(f"  {failure}", flush=True)
                continue
            runs.setdefault(label, []).append(row)
            print(f"  step {row['measured_step_s']:.3f} s measured, "
                  f"{row['predicted_step_s']:.3f} predicted; wall s {row['phase_s']}", flush=True)
            rows = [merged(found) for found in runs.values()]
            (args.out / "validation.json").write_text(json.dumps(rows, indent=1))
    report(rows, args.out, profile_adamw_rate(args.profile))


MEASURED = ("step_s", "gpu_allocated_bytes", "gpu_reserved_bytes", "host_bytes")


def merged(found: list[dict]) -> dict:
    """One configuration's rows from several rounds: the median of each measured quantity, and
    the step times of every round (measured_step_s_runs) to show the measurement's spread."""
    row = dict(found[0])
    for quantity in MEASURED:
        row[f"measured_{quantity}"] = statistics.median(r[f"measured_{quantity}"] for r in found)
    row["measured_step_s_runs"] = [r["measured_step_s"] for r in found]
    if all("predicted_step_s_at_adamw_before" in r for r in found):  # each round's own figure
        for key in ("adamw_before_params_per_s", "predicted_step_s_at_adamw_before"):
            row[key] = statistics.median(r[key] for r in found)
    return row


def spread_line(rows: list[dict]) -> str | None:
    """How far repeated runs of one configuration lie apart: (max - min) / median step."""
    from layerslide.reports.validation import spread

    spreads = {r["label"]: spread(r) for r in rows if spread(r) is not None}
    if not spreads:
        return None
    worst = max(spreads, key=spreads.get)
    return (f"- measurement spread over repeated runs ((max - min) / median step): median "
            f"{statistics.median(spreads.values()):.1%}, worst {spreads[worst]:.1%} ({worst})")


def in_situ_lines(rows: list[dict], profile_rate: float | None) -> list[str]:
    """The AdamW rates the rows' decoder layers kept, against the profile's, and the step-time
    error with each row predicted at its own (at_measured_adamw): what the model misses once
    the machine's rate during the row is given."""
    have = [r for r in rows if r.get("predicted_step_s_at_measured_adamw")]
    if not have:
        return []
    # a compact-moments row's in-situ figure is the fp32 rate its kernel's scaled one matched
    rates = [r["adamw_in_situ_params_per_s"] for r in have
             if r.get("policy", {}).get("residency", {}).get("moment_precision", "fp32") == "fp32"]
    rates = rates or [r["adamw_in_situ_params_per_s"] for r in have]
    errors = {r["label"]: r["predicted_step_s_at_measured_adamw"] / r["measured_step_s"] - 1
              for r in have}
    worst = max(errors, key=lambda label: abs(errors[label]))
    against = f" (the profile: {profile_rate / 1e9:.2f})" if profile_rate else ""
    return [(f"- AdamW as the rows' decoder layers ran it, solo rate: {min(rates) / 1e9:.2f}-"
             f"{max(rates) / 1e9:.2f} Gparam/s{against}"),
            (f"- step time predicted at each row's own AdamW rate (reads the measurement: not a "
             f"prediction): mean absolute error {statistics.fmean(map(abs, errors.values())):.1%}"
             f", worst {errors[worst]:+.1%} ({worst})")]


def adamw_before_lines(rows: list[dict]) -> list[str]:
    """The step-time error with each row predicted at the AdamW rate measured just before it
    (at_adamw_before), and how many CPU- or disk-bound rows that brings within their target."""
    from layerslide.reports.validation import row_target

    have = [r for r in rows if r.get("predicted_step_s_at_adamw_before")]
    if not have:
        return []
    errors = {r["label"]: r["predicted_step_s_at_adamw_before"] / r["measured_step_s"] - 1
              for r in have}
    worst = max(errors, key=lambda label: abs(errors[label]))
    bound = [r for r in have if row_target(r) is not None]
    within = sum(abs(errors[r["label"]]) <= row_target(r) for r in bound)
    rates = [r["adamw_before_params_per_s"] for r in have]
    return [(f"- AdamW measured just before each row: {min(rates) / 1e9:.2f}-"
             f"{max(rates) / 1e9:.2f} Gparam/s; step time predicted at it (a prediction: "
             f"measured before the run): mean absolute error "
             f"{statistics.fmean(map(abs, errors.values())):.1%}, worst {errors[worst]:+.1%} "
             f"({worst}); CPU- or disk-bound rows within target: {within} of {len(bound)}")]


def report(rows: list[dict], out: Path, profile_rate: float | None = None) -> None:
    from layerslide.reports.validation import (
        allocator_table,
        company_table,
        dispatch_table,
        figure,
        markdown,
        summarize,
    )

    every = rows
    # executor variants (other settings, the same plan) are shown apart, not validated; as the
    # configurations define them now (rows measured earlier may predate the mark)
    rows = [r for r in every
            if not CONFIGS.get(r["label"], r["config"]).get("variant_of")]
    summary = summarize(rows)
    tuned = next((r for r in rows if r["config"].get("tuned")), None)
    if tuned is not None:
        group = [r for r in rows if r["config"]["model"] == tuned["config"]["model"]
                 and r["config"]["micro_batch"] == tuned["config"]["micro_batch"]]
        best = min(r["measured_step_s"] for r in group)
        summary["tuned_vs_best_measured"] = tuned["measured_step_s"] / best - 1.0
    spread = spread_line(rows)
    summary["step_s_spread"] = spread
    in_situ = in_situ_lines(rows, profile_rate) + adamw_before_lines(rows)
    summary["step_s_at_measured_adamw_lines"] = in_situ
    (out / "validation_summary.json").write_text(json.dumps(summary, indent=1))
    table = markdown(rows)
    if "tuned_vs_best_measured" in summary:
        table += (f"- tune's pick against the best measured at its micro-batch: "
                  f"{summary['tuned_vs_best_measured']:+.1%}\n")
    if spread is not None:
        table += spread + "\n"
    table += "".join(line + "\n" for line in in_situ)
    table += "".join(line + "\n" for line in company_table(rows))
    table += "".join(line + "\n" for line in dispatch_table(rows))
    table += "\n".join(allocator_table(every)) + "\n"
    (out / "validation.md").write_text(table)
    figure(rows, out / "validation.png")
    print(table)


if __name__ == "__main__":
    main()
