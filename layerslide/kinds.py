"""The vocabulary every layer shares: the lanes tasks run on and the kinds of task, defined once.

Both are string enums, so a plan file or a trace stores them as plain strings and a member
compares equal to its value. Lanes and kinds are listed in the order a reader expects them.
"""

from __future__ import annotations

from enum import StrEnum


class Lane(StrEnum):
    """Where a task runs: a CUDA stream (strict order) or a worker (picks a ready task)."""

    GPU = "gpu"  # the compute stream
    H2D = "h2d"  # host-to-device copies
    D2H = "d2h"  # device-to-host copies
    CPU = "cpu"  # the CPU optimizer's worker (and casts, unless they have their own)
    CPU_CAST = "cpu_cast"  # the cast's own worker (Policy.schedule.cast_worker)
    NVME_READ = "nvme_read"
    NVME_WRITE = "nvme_write"
    # Collectives between ranks, each lane a CUDA stream and a process group of its own (NCCL,
    # or gloo on a CPU run), so the two never wait on each other's order
    GATHER = "gather"  # weights: the ranks' slices of a loaded block into its unit
    REDUCE = "reduce"  # grads: their sums over ranks, and the clipping norm's


# CUDA streams run their tasks in issue order; the other lanes pick the most urgent ready one.
STREAM_LANES = (Lane.GPU, Lane.H2D, Lane.D2H, Lane.GATHER, Lane.REDUCE)


class TaskKind(StrEnum):
    """What a task does; the executor has one handler per kind, the cost model one rule."""

    LOAD_WEIGHTS = "load_weights"  # a block's bf16 (or fp32) weights into a GPU unit
    FORWARD = "forward"
    BACKWARD = "backward"  # recomputes the forward from the checkpoint, then backward
    HEAD = "head"  # final norm, LM head and loss, forward and backward
    OFFLOAD_ACTIVATION = "offload_activation"  # a layer's checkpointed input to the host
    FETCH_ACTIVATION = "fetch_activation"  # and back to the GPU for its backward
    WRITE_ACTIVATION = "write_activation"  # a checkpoint from the host to NVMe
    READ_ACTIVATION = "read_activation"  # and back
    OFFLOAD_GRADS = "offload_grads"  # a block's bf16 grads to their host landing buffer
    ACCUMULATE_GRADS = "accumulate_grads"  # landed grads into the fp32 sum (accumulation)
    GRAD_NORM = "grad_norm"  # the global norm for clipping
    OPTIMIZER_STEP = "optimizer_step"  # AdamW of one block (CPU, or GPU for GPU-updated blocks)
    CAST = "cast"  # fp32 master -> bf16 upload copy
    READ_STATE = "read_state"  # a block's optimizer state on NVMe into its staging slot
    WRITE_STATE = "write_state"  # and back after the block's optimizer step (new bf16 weights too)
    READ_WEIGHTS = "read_weights"  # a block's bf16 weights on NVMe into a staging slot, to load
    # Collectives of several ranks (planner/sharding.py: each rank owns a slice of every block's
    # host state); every rank issues them in the plan's order on their lane.
    GATHER_WEIGHTS = "gather_weights"  # the other ranks' slices of a loaded block into its unit
    REDUCE_GRADS = "reduce_grads"  # a block's grads summed over a host's ranks, each its slice
    ALL_REDUCE_GRADS = "all_reduce_grads"  # grads summed where every rank needs them whole
    REDUCE_NORM = "reduce_norm"  # the ranks' partial squared grad norms summed, for clipping


# kinds that run on the compute stream and compute from a block's weights
COMPUTE_KINDS = (TaskKind.FORWARD, TaskKind.HEAD, TaskKind.BACKWARD)
# kinds that exchange data between ranks (on the gather and reduce lanes)
COLLECTIVE_KINDS = (TaskKind.GATHER_WEIGHTS, TaskKind.REDUCE_GRADS, TaskKind.ALL_REDUCE_GRADS,
                    TaskKind.REDUCE_NORM)
