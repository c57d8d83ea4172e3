"""Several ranks: the slices each owns (planner.sharding) and the collectives the plan adds."""

from collections import Counter

import pytest
from helpers import make_tiny_model

from layerslide.kinds import COLLECTIVE_KINDS, Lane, TaskKind
from layerslide.planner import Policy, TrainSpec, build_plan
from layerslide.planner.plan import HOST_MASTER, HOST_MOMENTS, HOST_UPLOAD
from layerslide.planner.sharding import SHARD_ALIGN, Shards

K = TaskKind


@pytest.mark.parametrize("numel", [1, SHARD_ALIGN - 1, SHARD_ALIGN, 3 * SHARD_ALIGN + 5, 10**6])
@pytest.mark.parametrize("ranks", [2, 3, 4, 8])
def test_slices_cover_the_block_once_in_equal_aligned_parts(numel, ranks):
    shards = Shards(numel, ranks)
    assert shards.slice_numel % SHARD_ALIGN == 0 and shards.padded_numel >= numel
    assert shards.padded_numel - numel < ranks * SHARD_ALIGN  # no slice wholly padding too many
    covered = []
    for rank in range(ranks):
        start, stop = shards.real(rank)
        assert shards.start(rank) == rank * shards.slice_numel
        assert stop - start <= shards.slice_numel
        covered.extend(range(start, stop))
    assert covered == list(range(numel))


def test_one_rank_owns_the_whole_block_unpadded():
    assert Shards(12345, 1).slice_numel == Shards(12345, 1).padded_numel == 12345
    assert Shards(12345, 1).real(0) == (0, 12345)


def test_a_rank_outside_the_group_is_refused():
    with pytest.raises(ValueError, match="rank 2 of 2"):
        Shards(10, 2).start(2)


def plan_for(gpus=1, hosts=1, accumulation="layer_major", grad_accum=2, clip=None, **policy):
    model = make_tiny_model(num_layers=3)
    train = TrainSpec(micro_batch=1, seq_len=16, grad_accum=grad_accum, gpus=gpus, hosts=hosts,
                      max_grad_norm=clip)
    return build_plan(model, train, Policy.of(accumulation=accumulation, window=2, **policy))


@pytest.mark.parametrize("accumulation", ["step_major", "layer_major"])
def test_each_load_is_gathered_and_each_offload_reduced_first(accumulation):
    plan = plan_for(gpus=2, accumulation=accumulation)
    kinds = Counter(t.kind for t in plan.tasks)
    assert kinds[K.GATHER_WEIGHTS] == kinds[K.LOAD_WEIGHTS] > 0
    assert kinds[K.REDUCE_GRADS] == kinds[K.OFFLOAD_GRADS] > 0
    assert kinds[K.ALL_REDUCE_GRADS] == kinds[K.REDUCE_NORM] == 0
    for t in plan.tasks:
        preds = {plan.task(p).kind for p in plan.graph.predecessors(t.id)}
        if t.kind == K.GATHER_WEIGHTS:
            assert t.lane == Lane.GATHER and t.comm_group == "host" and K.LOAD_WEIGHTS in preds
        if t.kind == K.OFFLOAD_GRADS:
            assert K.REDUCE_GRADS in preds
        if t.kind in (K.FORWARD, K.BACKWARD, K.HEAD):  # computes only from a whole block
            assert K.LOAD_WEIGHTS not in preds


def test_host_state_per_rank_is_its_slice():
    one, two = plan_for().static_buffer_bytes(), plan_for(gpus=2).static_buffer_bytes()
    for buffer in (HOST_MASTER, HOST_MOMENTS, HOST_UPLOAD):
        # half, give or take the padding of every block's last slice
        assert one[buffer] / 2 <= two[buffer] < one[buffer] / 2 * 1.2 + 8 * SHARD_ALIGN * 5


def test_loads_and_offloads_move_a_slice_and_collectives_the_block():
    plan = plan_for(gpus=4)
    model = plan.model
    for t in plan.tasks:
        shards = Shards(model.block_params(t.block), 4)
        if t.kind in (K.LOAD_WEIGHTS, K.OFFLOAD_GRADS):
            assert t.bytes == 2 * shards.slice_numel
        if t.kind in (K.GATHER_WEIGHTS, K.REDUCE_GRADS):
            assert t.bytes == 2 * shards.padded_numel


def test_hosts_all_reduce_slices_among_peers_and_clipping_sums_the_norm():
    plan = plan_for(gpus=2, hosts=2, clip=1.0)
    kinds = Counter(t.kind for t in plan.tasks)
    assert kinds[K.ALL_REDUCE_GRADS] == kinds[K.REDUCE_GRADS]
    assert kinds[K.REDUCE_NORM] == plan.num_steps
    groups = {t.kind: t.comm_group for t in plan.tasks if t.kind in COLLECTIVE_KINDS}
    assert groups == {K.GATHER_WEIGHTS: "host", K.REDUCE_GRADS: "host",
                      K.ALL_REDUCE_GRADS: "peers", K.REDUCE_NORM: "host"}
    for t in plan.tasks:
        if t.kind == K.OPTIMIZER_STEP:
            preds = {plan.task(p).kind for p in plan.graph.predecessors(t.id)}
            assert K.REDUCE_NORM in preds


def test_one_gpu_per_host_reduces_only_across_hosts():
    kinds = Counter(t.kind for t in plan_for(hosts=2).tasks)
    assert kinds[K.ALL_REDUCE_GRADS] == kinds[K.OFFLOAD_GRADS]
    assert kinds[K.GATHER_WEIGHTS] == kinds[K.REDUCE_GRADS] == 0


def test_one_rank_plans_no_collectives():
    assert not [t for t in plan_for(clip=1.0).tasks if t.kind in COLLECTIVE_KINDS]


def test_gpu_updated_blocks_with_several_ranks_are_refused_by_name():
    with pytest.raises(ValueError, match="gpu_updated_blocks=1 with 2 ranks"):
        plan_for(gpus=2, gpu_updated_blocks=1)


@pytest.mark.parametrize("accumulation", ["step_major", "layer_major"])
def test_step_major_grads_are_copied_into_one_padded_buffer_for_the_reduce(accumulation):
    """autograd's grads are a tensor per parameter: step-major copies them into one flat
    buffer padded to the slices for the reduce-scatter, alive while it runs; layer-major
    rounds its sum into such a buffer already."""
    plan = plan_for(gpus=2, accumulation=accumulation)
    reduces = {t.id: t for t in plan.tasks if t.kind == K.REDUCE_GRADS}
    flats = [b for b in plan.buffers if b.tier == "gpu" and b.alloc_task in reduces
             and b.release_tasks == (b.alloc_task,)]
    if accumulation == "layer_major":
        assert flats == []
        return
    assert len(flats) == len(reduces)
    for b in flats:
        block = reduces[b.alloc_task].block
        assert b.bytes == 2 * Shards(plan.model.block_params(block), 2).padded_numel
