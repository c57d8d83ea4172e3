"""What a plan must pass before a run starts: options it would ignore or leave idle, its fit
on this machine's GPU cap and RAM (the simulator's prediction), and the lanes-first niceness
where it is GPU-bound. `prepare` runs them; simulate says the same where it can."""

from __future__ import annotations

import sys
from dataclasses import replace

from layerslide.planner.plan import STEADY_STEPS, Plan
from layerslide.planner.settings import LANES_FIRST_NICE, ExecutorKnobs
from layerslide.training.run import RunConfig, RunError

GIB = 1024**3


# what to change when a tier's need exceeds its limit, by tier (simulate and train say it)
FIT_HINTS = {
    "gpu": "lower --micro-batch or --window, keep activations off the GPU (--activations host), "
           "or let `layerslide tune` pick settings that fit",
    "host": "keep part of the state on NVMe (--moments-on-nvme/--master-on-nvme, fractions 0-1; "
            "train needs --nvme-dir), checkpoints too (--activations nvme), or let "
            "`layerslide tune` place it",
    "nvme": "keep less on NVMe (lower the --*-on-nvme fractions), stripe over more drives "
            "(--nvme-drives), or take a profile with a larger drive",
}
# on --device cpu, where the GPU tier's share of a plan is what overflows RAM
CPU_FIT_HINT = ("lower --micro-batch or --seq-len (on --device cpu the activations and "
                "workspaces the GPU would hold are RAM), or train on a GPU")


def refuse_options_a_plan_replaces(plan: Plan, plan_file: str, given, value, flag, *,
                                   also: dict[str, object] | None = None) -> None:
    """A --plan file's training settings and policy replace those options: refuse one given
    (the names in `given`; value(name) and flag(name) say it) with another value than the
    plan's, rather than drop it unsaid (a --max-grad-norm that would not clip). also: more
    options the plan decides, with the plan's value."""
    planned = {**plan.train.to_dict(), **plan.policy.flat(), **(also or {})}
    clashes = [f"{flag(name)} {value(name)} (the plan has {planned[name]})"
               for name in sorted(given) if name in planned and value(name) != planned[name]]
    if clashes:
        raise RunError(f"--plan {plan_file} sets the training settings and policy, so these "
                       f"would be ignored: {'; '.join(clashes)}. Drop them, make the plan "
                       "with them (`layerslide tune` takes --seq-len and --max-grad-norm), or "
                       "give the flags without --plan to build the plan from them")


def refuse_a_plan_for_other_ranks(plan: Plan, plan_file: str, train) -> None:
    """A plan's slices and collectives are made for its ranks: refuse one made for others
    than the run's (train: the run's TrainSpec, its gpus and hosts the launch's)."""
    planned, running = (plan.train.gpus, plan.train.hosts), (train.gpus, train.hosts)
    if planned == running:
        return
    g, h = plan.train.gpus, plan.train.hosts
    launch = ("one process: `layerslide train ...` without torchrun" if g * h == 1 else
              f"`layerslide train --gpus {g} ...`" if h == 1 else
              f"torchrun --nnodes {h} --nproc-per-node {g} on each host")
    raise RunError(f"--plan {plan_file} is a plan for {_ranks(*planned)}, and this run has "
                   f"{_ranks(*running)}: make one for them (`layerslide plan ... --gpus "
                   f"{train.gpus} --hosts {train.hosts} -o PLAN`), or launch the plan's ranks "
                   f"({launch})")


def _ranks(gpus: int, hosts: int) -> str:
    return f"{gpus} GPU(s) per host x {hosts} host(s)"


def with_rank_threads(plan: Plan, cores: int | None) -> Plan:
    """The plan with its CPU kernels on `cores` threads (a rank's share of its host's cores,
    None: a run of one rank, whose kernels take every core), unless LAYERSLIDE_CPU_THREADS
    or the --plan file chose a count: N ranks each starting a thread per core would fight."""
    chosen = plan.policy.executor.cpu_threads or "cpu_threads" in ExecutorKnobs.env_settings()
    if cores is None or chosen:
        return plan
    return replace(plan, policy=plan.policy.with_(cpu_threads=cores))


def refuse_policy_options_that_would_not_act(train, policy, given, flag) -> None:
    """Refuse a policy option given (its name in `given`, said as flag(name)) where the rest of
    the plan leaves it nothing to change: said with what it needs, rather than planned as if
    it did something."""
    s = policy.schedule
    idle = {
        "cast_worker": (s.cast_worker and not policy.cpu_casts,
                        (f"there are no CPU cast tasks to give a worker (--cast {s.cast} with "
                         f"--cpu-optimizer {policy.kernels.cpu_optimizer}); --cast "
                         "cpu_per_load, or cpu_once with --cpu-optimizer torch, has them")),
        "accumulation": (train.grad_accum == 1, "it schedules --grad-accum above 1"),
        "sweep_groups": (train.grad_accum == 1 or s.accumulation != "layer_major",
                         ("it groups a layer_major sweep (--accumulation layer_major with "
                          "--grad-accum above 1)")),
        "gpu_updated_order": (policy.residency.gpu_updated_blocks == 0,
                              "it orders --gpu-updated-blocks, and there are none"),
    }
    for name, (inert, why) in idle.items():
        if name in given and inert:
            raise RunError(f"{flag(name)} would change nothing here: {why}; drop it")


def check_fits(plan: Plan, profile, gpu_memory: int | None, *, warn: bool = True,
               on_cpu: bool = False):
    """Refuse a plan whose predicted memory exceeds the GPU cap or this machine's RAM; the
    prediction (on the profile) that says it fits. warn: say where RAM is tight. on_cpu: the
    run is on the CPU, whose RAM holds the GPU tier too."""
    from layerslide.calibrate.host import physical_ram_bytes
    from layerslide.simulator.predict import simulate

    if plan.num_steps < STEADY_STEPS:  # to simulate a steady step: the plan's last, repeated
        plan = plan.unroll(STEADY_STEPS)
    prediction = simulate(plan, profile, gpu_memory_bytes=gpu_memory)
    gpu_need = prediction.gpu_need_bytes  # the allocator's reserve, not only the allocated peak
    if gpu_memory is not None and gpu_need > gpu_memory:
        raise RunError(f"the plan needs {gpu_need / GIB:.2f} GiB of GPU memory (what the "
                       "allocator reserves for it), more than "
                       f"--gpu-memory {gpu_memory / GIB:.2f} GiB: {FIT_HINTS['gpu']}")
    ram = physical_ram_bytes()
    # the plan is one rank's (its host buffers the rank's slices): a host holds all its ranks
    per_rank = max(plan.static_bytes("host"), prediction.peak_bytes.get("host", 0))
    # on the CPU the GPU tier's buffers (weights window, activations, workspaces) are RAM too;
    # the CUDA context is not there
    gpu_in_ram = prediction.gpu_allocated_peak_bytes if on_cpu else 0
    ranks_here = plan.train.gpus
    need = (per_rank + gpu_in_ram) * ranks_here
    reserve = profile.host.reserve_bytes
    said = _host_need(need, gpu_in_ram * ranks_here, ranks_here)
    if warn and ram - reserve < need <= ram:  # a machine whose RAM grows may hold it
        print(f"warning: the plan needs {said}, within {reserve / GIB:.0f} GiB of this "
              f"machine's {ram / GIB:.1f} GiB (the OS and the CUDA driver need some): the OOM "
              "killer may stop it", file=sys.stderr)
    if need > ram:
        hint = CPU_FIT_HINT if gpu_in_ram > per_rank else FIT_HINTS["host"]
        if ranks_here > 1:
            hint += f", or run fewer ranks on this host ({ranks_here} now)"
        raise RunError(f"the plan needs {said}, this machine has {ram / GIB:.1f} GiB: {hint}")
    return prediction


def _host_need(need: int, gpu_in_ram: int, ranks_here: int = 1) -> str:
    """A plan's host memory need, said with the part of it that is the GPU tier's on the CPU,
    and its ranks on this host."""
    where = (f" ({gpu_in_ram / GIB:.1f} GiB of it the GPU's share, which --device cpu keeps in "
             "RAM)" if gpu_in_ram else "")
    ranks = (f" for its {ranks_here} ranks on this host, {need / ranks_here / GIB:.1f} GiB "
             "each" if ranks_here > 1 else "")
    return f"{need / GIB:.1f} GiB of host memory at its peak{ranks}{where}"


def with_lanes_first(config: RunConfig, plan: Plan, prediction, profile, device: str, say):
    """The plan with its CPU kernels niced where it is GPU-bound (tuner.lanes_first), built
    from the settings (a --plan file runs as it is), runs on a GPU (on the CPU its compute is
    no launch to let through) and LAYERSLIDE_CPU_NICE leaves the choice open; and its
    prediction, simulated again where the profile prices niced launches apart."""
    from layerslide.tuner.lanes_first import chosen_in_environment, niced_where_gpu_bound

    if config.plan or chosen_in_environment() or not device.startswith("cuda"):
        return plan, prediction

    def fitting(policy):
        try:
            return check_fits(replace(plan, policy=policy), profile, config.gpu_memory,
                              warn=False)
        except RunError:
            return None
    found = niced_where_gpu_bound(plan.policy, prediction, profile, fitting)
    if found is None:
        return plan, prediction
    say(f"the plan is GPU-bound: the CPU optimizer's workers run at nice {LANES_FIRST_NICE}, "
        "so that the GPU's launches take a core first (LAYERSLIDE_CPU_NICE=0 keeps them at 0)")
    return replace(plan, policy=found[0]), found[1]
