"""build_plan: task structure, lane orders, dependencies and buffers of the plan."""

import json
from collections import Counter
from itertools import pairwise

import networkx as nx
import pytest
from helpers import make_tiny_model

from layerslide.kinds import TaskKind
from layerslide.planner import (
    EMBEDDING,
    PRESETS,
    Buffer,
    Plan,
    Policy,
    TrainSpec,
    build_plan,
    sizes,
)
from layerslide.planner.model import BF16_BYTES, FP32_BYTES
from layerslide.planner.plan import HOST_CHECKPOINTS, HOST_GRAD_ACCUM, task_buffer_id, task_id

HEAD = "head"  # tid's name for the head's block (block L of an L-layer model)


def kinds_on(plan: Plan, lane: str) -> Counter:
    return Counter(plan.task(t).kind for t in plan.lane_order[lane])


def tid(plan: Plan, kind: str, block: int | str, *, step: int = 0, micro_batch: int = 0,
        for_kind: str = "") -> str:
    """The id plan.task_id gives `kind`'s task of `block` (EMBEDDING, a layer or HEAD)."""
    num_layers = plan.model.num_layers
    return task_id(kind=TaskKind(kind), block=num_layers if block == HEAD else block, step=step,
                   micro_batch=micro_batch, num_layers=num_layers, for_kind=for_kind)


def buffer_named(plan: Plan, buffer_id: str) -> Buffer:
    (found,) = [b for b in plan.buffers if b.id == buffer_id]
    return found


def task_buffer(plan: Plan, task: str, name: str) -> Buffer:
    """The buffer `name` that task `task` makes."""
    return buffer_named(plan, task_buffer_id(task, name))


def test_gpu_order_is_forward_head_backward_per_micro_batch(tiny_model):
    plan = build_plan(tiny_model, TrainSpec(micro_batch=2, seq_len=16), Policy.of(), num_steps=2)
    step0 = [t for t in plan.lane_order["gpu"] if plan.task(t).step == 0]
    assert step0 == [tid(plan, "forward", EMBEDDING), tid(plan, "forward", 0),
                     tid(plan, "forward", 1), tid(plan, "head", HEAD), tid(plan, "backward", 1),
                     tid(plan, "backward", 0), tid(plan, "backward", EMBEDDING)]
    assert plan.meta["step_markers"] == [tid(plan, "backward", EMBEDDING, step=s) for s in (0, 1)]


def test_window_decides_how_many_layers_are_loaded_twice():
    model = make_tiny_model(num_layers=6)
    train = TrainSpec(micro_batch=1, seq_len=16)
    for window, expected_reloads in ((1, 5), (2, 4), (4, 2), (6, 0), (8, 0)):
        plan = build_plan(model, train, Policy.of(window=window, prefetch_depth=1), num_steps=2)
        loads = [plan.task(t) for t in plan.lane_order["h2d"]
                 if plan.task(t).kind == "load_weights" and plan.task(t).step == 0]
        per_layer = Counter(t.block for t in loads)
        # embedding and head are resident: loaded once per step; layers once for forward and
        # again for backward unless still in one of the `window` cache units.
        assert per_layer[EMBEDDING] == 1 and per_layer[6] == 1
        assert sum(per_layer[i] for i in range(6)) == 6 + expected_reloads, window


def test_resident_layers_are_loaded_once_per_step():
    model = make_tiny_model(num_layers=4)
    plan = build_plan(model, TrainSpec(micro_batch=1, seq_len=16),
                      Policy.of(window=1, prefetch_depth=1, resident_layers=2), num_steps=2)
    loads = Counter(plan.task(t).block for t in plan.lane_order["h2d"]
                    if plan.task(t).kind == "load_weights" and plan.task(t).step == 1)
    assert loads[0] == 1 and loads[1] == 1  # resident
    assert loads[2] == 2 and loads[3] == 1  # window of one: layer 3 stays for its backward


def test_optimizer_step_precedes_next_steps_load_of_same_layer(tiny_model):
    for cast in ("cpu_once", "cpu_per_load", "gpu"):
        plan = build_plan(tiny_model, TrainSpec(micro_batch=2, seq_len=16), Policy.of(cast=cast),
                          num_steps=3)
        for load_id in plan.lane_order["h2d"]:
            load = plan.task(load_id)
            if load.kind != "load_weights" or load.step == 0:
                continue
            update = tid(plan, "optimizer_step", load.block, step=load.step - 1)
            assert nx.has_path(plan.graph, update, load_id), load_id


def test_clipping_makes_every_update_wait_for_every_gradient(tiny_model):
    plan = build_plan(tiny_model, TrainSpec(micro_batch=2, seq_len=16, max_grad_norm=1.0),
                      Policy.of(), num_steps=2)
    grads = [t for t in plan.lane_order["d2h"]
             if plan.task(t).kind == "offload_grads" and plan.task(t).step == 0]
    opts = [t for t in plan.lane_order["cpu"]
            if plan.task(t).kind == "optimizer_step" and plan.task(t).step == 0]
    assert len(grads) == len(opts) == tiny_model.num_layers + 2
    for g in grads:
        for o in opts:
            assert nx.has_path(plan.graph, g, o)


def test_without_clipping_an_update_does_not_wait_for_other_layers(tiny_model):
    plan = build_plan(tiny_model, TrainSpec(micro_batch=2, seq_len=16), Policy.of(), num_steps=2)
    assert not nx.has_path(plan.graph, tid(plan, "offload_grads", 0),
                           tid(plan, "optimizer_step", 1))


def test_optimizer_priority_order_follows_policy(tiny_model):
    train = TrainSpec(micro_batch=2, seq_len=16)

    def update_order(order: str) -> list[int]:
        plan = build_plan(tiny_model, train, Policy.of(optimizer_order=order), num_steps=2)
        return [plan.task(t).block for t in plan.lane_order["cpu"]
                if plan.task(t).kind == "optimizer_step" and plan.task(t).step == 0]

    head = tiny_model.num_layers
    assert update_order("arrival") == [head, 1, 0, EMBEDDING]
    assert update_order("deadline") == [EMBEDDING, 0, 1, head]


def test_accumulation_adds_host_accumulation_per_block_and_micro_batch(tiny_model):
    plan = build_plan(tiny_model, TrainSpec(micro_batch=1, seq_len=16, grad_accum=3), Policy.of(),
                      num_steps=2)
    cpu = kinds_on(plan, "cpu")
    blocks = tiny_model.num_layers + 2
    assert cpu["accumulate_grads"] == 2 * 3 * blocks
    assert cpu["optimizer_step"] == 2 * blocks
    assert plan.static_bytes("host") >= FP32_BYTES * tiny_model.total_params * 4  # + grad sum


def test_activation_policies_route_checkpoints(tiny_model):
    train = TrainSpec(micro_batch=2, seq_len=16)
    on_gpu = build_plan(tiny_model, train, Policy.of(activations="gpu"), num_steps=2)
    assert "offload_activation" not in kinds_on(on_gpu, "d2h")
    on_host = build_plan(tiny_model, train, Policy.of(activations="host"), num_steps=2)
    assert kinds_on(on_host, "d2h")["offload_activation"] == 2 * tiny_model.num_layers
    assert kinds_on(on_host, "h2d")["fetch_activation"] == 2 * tiny_model.num_layers
    on_nvme = build_plan(tiny_model, train, Policy.of(activations="nvme"), num_steps=2)
    assert kinds_on(on_nvme, "nvme_write")["write_activation"] == 2 * tiny_model.num_layers
    ckpt = on_nvme.task(tid(on_nvme, "read_activation", 1))
    assert ckpt.bytes == BF16_BYTES * tiny_model.hidden_size * train.tokens_per_micro_batch


def test_optimizer_state_on_nvme_is_read_and_written_per_block(tiny_model):
    plan = build_plan(tiny_model, TrainSpec(micro_batch=2, seq_len=16),
                      Policy.of(master_on_nvme=0.5, moments_on_nvme=1.0), num_steps=2)
    read = plan.task(tid(plan, "read_state", 0, step=1))
    assert read.bytes == tiny_model.layer_params * (4 * 0.5 + 8 * 1.0)
    assert nx.has_path(plan.graph, tid(plan, "write_state", 0), read.id)
    n = tiny_model.total_params
    assert plan.static_bytes("nvme") == int(4 * n * 0.5) + 8 * n


def test_static_host_bytes_by_hand(tiny_model):
    n = tiny_model.total_params
    plan = build_plan(tiny_model, TrainSpec(micro_batch=2, seq_len=16), Policy.of(cast="cpu_once"),
                      num_steps=2)
    runtime = 2 * 1024**3
    # activations on the host: one pinned checkpoint per layer, bf16 [32 tokens, hidden 64]
    checkpoints = tiny_model.num_layers * 2 * 32 * tiny_model.hidden_size
    # fp32 master 4, moments 8, persistent bf16 copy 2; the grads land in that copy
    assert plan.static_bytes("host") == runtime + 4 * n + 8 * n + 2 * n + checkpoints
    # one bf16 landing buffer per block (no pool) where there is no upload copy, or where a
    # step's later micro-batches load the block again after grads landed
    landing = 2 * n
    gpu_cast = build_plan(tiny_model, TrainSpec(micro_batch=2, seq_len=16), Policy.of(cast="gpu"),
                          num_steps=2)
    assert gpu_cast.static_bytes("host") == runtime + 12 * n + landing + checkpoints
    accumulating = build_plan(tiny_model, TrainSpec(micro_batch=1, seq_len=16, grad_accum=2),
                              Policy.of(cast="cpu_once"), num_steps=2)
    fp32_sums = 4 * n
    assert accumulating.static_bytes("host") == (runtime + 14 * n + landing + fp32_sums
                                                 + checkpoints // 2)


def test_grads_landing_in_the_upload_copy_follow_every_load_of_their_block(tiny_model):
    """The landed grads overwrite the block's bf16 weights: every load of the block in the step
    must come first (it does: the block's backward needs the weights), and the next step's
    loads must follow the optimizer step that writes the new weights there."""
    plan = build_plan(tiny_model, TrainSpec(micro_batch=2, seq_len=16), Policy.of(cast="cpu_once"),
                      num_steps=2)
    assert plan.static_bytes("host") < build_plan(
        tiny_model, TrainSpec(micro_batch=2, seq_len=16), Policy.of(cast="cpu_once",
        host_grad_buffers=1), num_steps=2).static_bytes("host") + 1  # no pool can beat none
    g = plan.graph
    for block in (0, 1):
        offload = tid(plan, "offload_grads", block)
        loads = [t for t in g if plan.task(t).kind == "load_weights"
                 and plan.task(t).step == 0 and plan.task(t).block == block]
        assert loads
        for load in loads:
            assert nx.has_path(g, load, offload), (load, offload)
        for load in (t for t in g if plan.task(t).kind == "load_weights"
                     and plan.task(t).step == 1 and plan.task(t).block == block):
            assert nx.has_path(g, tid(plan, "optimizer_step", block), load)


def test_gpu_cast_sends_fp32_and_charges_the_cast_to_the_consumer(tiny_model):
    train = TrainSpec(micro_batch=2, seq_len=16)
    base = build_plan(tiny_model, train, Policy.of(cast="cpu_once"), num_steps=2)
    gpu = build_plan(tiny_model, train, Policy.of(cast="gpu"), num_steps=2)
    p = tiny_model.layer_params
    load, forward = tid(base, "load_weights", 0, for_kind="forward"), tid(base, "forward", 0)
    assert gpu.task(load).bytes == 4 * p
    assert base.task(load).bytes == 2 * p
    assert gpu.task(forward).bytes - base.task(forward).bytes == 6 * p


@pytest.mark.parametrize("preset", ["llama-3.2-3b", "qwen3-8b", "mistral-large-123b"])
def test_presets_build_valid_plans(preset):
    plan = build_plan(PRESETS[preset], TrainSpec(), Policy.of(window=3, prefetch_depth=2))
    plan.validate()
    model = PRESETS[preset]
    assert len(plan.lane_order["gpu"]) == 3 * (2 * model.num_layers + 3)


def test_bad_inputs_are_refused_with_what_to_change(tiny_model):
    with pytest.raises(ValueError, match="num_steps"):
        build_plan(tiny_model, TrainSpec(), Policy.of(), num_steps=1)
    with pytest.raises(ValueError, match="max_position_embeddings"):
        build_plan(tiny_model, TrainSpec(seq_len=8192), Policy.of())


def test_gpu_cast_needs_fp32_landing_buffers_on_the_gpu(tiny_model):
    train = TrainSpec(micro_batch=2, seq_len=16)
    base = build_plan(tiny_model, train, Policy.of(cast="cpu_once", window=2), num_steps=2)
    gpu = build_plan(tiny_model, train, Policy.of(cast="gpu", window=2), num_steps=2)
    m = tiny_model
    landing = 4 * (2 * m.layer_params + m.embedding_params + m.head_params + m.final_norm_params)
    assert gpu.static_bytes("gpu") - base.static_bytes("gpu") == landing


def test_edges_to_tasks_that_do_not_exist_are_refused(tiny_model):
    plan = build_plan(tiny_model, TrainSpec(micro_batch=2, seq_len=16), Policy.of(), num_steps=2)
    plan.graph.add_edge(tid(plan, "forward", 0), "no.such.task")
    with pytest.raises(ValueError, match="does not have"):
        plan.validate()


def test_a_plan_file_edge_without_its_reason_is_refused_by_name(tiny_model, tmp_path):
    plan = build_plan(tiny_model, TrainSpec(micro_batch=2, seq_len=16), Policy.of(), num_steps=2)
    data = plan.to_dict()
    data["edges"][0] = data["edges"][0][:2]  # it said "not enough values to unpack"
    path = tmp_path / "plan.json"
    path.write_text(json.dumps(data))
    with pytest.raises(ValueError, match=r"plan.json: edge \[.*\] is not \[from task, to task, "
                                         r"reason\]"):
        Plan.load(path)


def test_cast_from_nvme_staging_finishes_before_the_write_back(tiny_model):
    plan = build_plan(tiny_model, TrainSpec(micro_batch=1, seq_len=16),
                      Policy.of(master_on_nvme=1.0, moments_on_nvme=1.0, cpu_optimizer="torch"),
                      num_steps=2)
    for block in (EMBEDDING, 0, 1, HEAD):
        assert nx.has_path(plan.graph, tid(plan, "cast", block), tid(plan, "write_state", block))


def test_tied_head_waits_for_the_embedding_grads_of_the_previous_micro_batch():
    tied = make_tiny_model()
    tied = type(tied)(**{**tied.to_dict(), "tie_word_embeddings": True})
    plan = build_plan(tied, TrainSpec(micro_batch=1, seq_len=16, grad_accum=2), Policy.of(),
                      num_steps=2)
    # both write the embedding's GPU grad buffer: the head of micro-batch 1 after the offload
    assert nx.has_path(plan.graph, tid(plan, "offload_grads", EMBEDDING),
                       tid(plan, "head", HEAD, micro_batch=1))


def test_grads_on_the_gpu_live_from_their_backward_to_their_offload():
    tied = make_tiny_model()
    tied = type(tied)(**{**tied.to_dict(), "tie_word_embeddings": True})
    plan = build_plan(tied, TrainSpec(micro_batch=1, seq_len=16, grad_accum=2), Policy.of(),
                      num_steps=2)
    # tied: the head makes the [V, h] LM-weight grad, the embedding backward adds its rows into
    # it, and it leaves as the embedding's grads: one such buffer, from the head to the offload
    head_task, emb_backward = tid(plan, "head", HEAD), tid(plan, "backward", EMBEDDING)
    emb = task_buffer(plan, head_task, "tied_grad")
    assert emb.tier == "gpu" and emb.bytes == BF16_BYTES * 256 * 64  # vocab x hidden
    assert emb.alloc_task == head_task
    assert emb.release_tasks == (tid(plan, "offload_grads", EMBEDDING),)
    assert not [b for b in plan.buffers
                if b.id == task_buffer_id(emb_backward, "offloaded_grads")]
    # the backward's workspace: its rows summed per token id (16 tokens of hidden 64, bf16)
    rows = task_buffer(plan, emb_backward, "rows")
    assert rows.bytes == BF16_BYTES * 16 * 64 and rows.release_tasks == (emb_backward,)
    # untied: autograd makes the embedding's own bf16 grads in its backward, freed offloaded
    untied = build_plan(make_tiny_model(), TrainSpec(micro_batch=1, seq_len=16, grad_accum=2),
                        Policy.of(), num_steps=2)
    own = task_buffer(untied, tid(untied, "backward", EMBEDDING), "offloaded_grads")
    assert own.bytes == BF16_BYTES * 256 * 64
    assert own.alloc_task == tid(untied, "backward", EMBEDDING)
    assert own.release_tasks == (tid(untied, "offload_grads", EMBEDDING),)
    # tied: the head block's own grads are the final norm's (hidden 64), made by the head task
    head = task_buffer(plan, head_task, "offloaded_grads")
    assert head.tier == "gpu" and head.bytes == BF16_BYTES * 64
    assert head.alloc_task == head_task
    assert head.release_tasks == (tid(plan, "offload_grads", HEAD),)
    # one per micro-batch of each step (2 x 2), not one held for the run
    assert len([b for b in plan.buffers if b.id.endswith(".tied_grad")]) == 4
    # a decoder layer's grads too: made by its backward, freed once offloaded (autograd's, from
    # the caching allocator: no standing grad buffers on the GPU)
    backward = tid(plan, "backward", 1, micro_batch=1)
    layer = task_buffer(plan, backward, "offloaded_grads")
    assert layer.bytes == BF16_BYTES * tied.layer_params
    assert layer.alloc_task == backward
    assert layer.release_tasks == (tid(plan, "offload_grads", 1, micro_batch=1),)
    assert not [b.id for b in plan.buffers if b.tier == "gpu" and b.is_static and "grad" in b.id]


def test_blocks_updated_on_the_gpu_hold_their_fresh_bf16_grads_only_within_their_task(
        tiny_model):
    """Autograd still makes a bf16 grad for a GPU-updated block (the embedding first, then layer
    0); the backward adds it into the block's fp32 sum on the GPU before it ends."""
    plan = build_plan(tiny_model, TrainSpec(micro_batch=1, seq_len=16),
                      Policy.of(gpu_updated_blocks=2), num_steps=2)
    emb_backward, layer0_backward = tid(plan, "backward", EMBEDDING), tid(plan, "backward", 0)
    emb = task_buffer(plan, emb_backward, "grads")
    assert emb.tier == "gpu" and emb.bytes == BF16_BYTES * 256 * 64
    assert emb.alloc_task == emb_backward and emb.release_tasks == (emb_backward,)
    layer0 = task_buffer(plan, layer0_backward, "grads")
    assert layer0.bytes == BF16_BYTES * 36992 and layer0.release_tasks == (layer0_backward,)
    # nothing of theirs is offloaded: no grads made for an offload, as layer 1's are
    ids = {b.id for b in plan.buffers}
    assert task_buffer_id(tid(plan, "backward", 1), "offloaded_grads") in ids
    assert not {task_buffer_id(tid(plan, "backward", block, step=s), "offloaded_grads")
                for block in (EMBEDDING, 0) for s in (0, 1)} & ids


def test_host_grad_landing_is_one_buffer_per_cpu_block_or_a_pool_of_the_largest(tiny_model):
    train = TrainSpec(micro_batch=1, seq_len=16)
    layer, emb, head = 36992, 256 * 64, 256 * 64 + 64  # params; head: LM head + final norm
    assert tiny_model.total_params == 2 * layer + emb + head

    def landing(policy: Policy, train: TrainSpec = train) -> int:
        plan = build_plan(tiny_model, train, policy, num_steps=2)
        return sum(b.bytes for b in plan.buffers if b.id == "host.grad_landing")

    # grads land in the blocks' bf16 upload copies: no landing buffers at all, pool or not
    assert landing(Policy.of()) == landing(Policy.of(host_grad_buffers=2)) == 0
    # without upload copies (fp32 master weights sent, cast on the GPU): one bf16 buffer per
    # block updated on the CPU, all of them or all but the embedding
    gpu_cast = Policy.of(cast="gpu")
    assert landing(gpu_cast) == BF16_BYTES * (2 * layer + emb + head)
    assert landing(gpu_cast.with_(gpu_updated_blocks=1)) == BF16_BYTES * (2 * layer + head)
    # a pool of 2 (no clipping: TrainSpec's max_grad_norm is None) of the largest block, a layer
    assert landing(gpu_cast.with_(host_grad_buffers=2)) == 2 * BF16_BYTES * layer
    # clipping holds every block's grads until the norm: one per block whatever the policy says
    clipped = TrainSpec(micro_batch=1, seq_len=16, max_grad_norm=1.0)
    assert landing(gpu_cast.with_(host_grad_buffers=2), clipped) == BF16_BYTES * (
        2 * layer + emb + head)
    # no transient landing buffers beside it
    plan = build_plan(tiny_model, train, Policy.of(), num_steps=2)
    assert not [b for b in plan.buffers if ".offload_grads." in b.id and b.tier == "host"]


def test_host_checkpoints_are_one_static_buffer_only_when_activations_go_to_the_host():
    model = make_tiny_model(num_layers=3)
    train = TrainSpec(micro_batch=2, seq_len=16)  # 32 tokens

    def plan_for(activations: str) -> Plan:
        return build_plan(model, train, Policy.of(activations=activations), num_steps=2)

    # a bf16 [32 tokens, hidden 64] checkpoint per layer, reused by every micro-batch and step
    on_host = plan_for("host")
    ckpts = buffer_named(on_host, "host.checkpoints")
    assert ckpts.is_static and ckpts.bytes == 3 * BF16_BYTES * 32 * 64
    assert not [b for b in on_host.buffers if b.tier == "host" and b.alloc_task is not None]
    on_gpu = plan_for("gpu")
    assert not [b for b in on_gpu.buffers if b.id == "host.checkpoints"]
    # on NVMe they pass through the host one at a time: transient buffers, no static one
    on_nvme = plan_for("nvme")
    assert not [b for b in on_nvme.buffers if b.id == "host.checkpoints"]
    offload = tid(on_nvme, "offload_activation", 1)
    host = task_buffer(on_nvme, offload, "host")
    assert host.alloc_task == offload
    assert host.release_tasks == (tid(on_nvme, "write_activation", 1),)


def test_all_layers_resident_needs_no_ring_units(tiny_model):
    plan = build_plan(tiny_model, TrainSpec(micro_batch=1, seq_len=16),
                      Policy.of(window=2, prefetch_depth=1, resident_layers=2), num_steps=2)
    assert not any(b.id == "gpu.weight_units" for b in plan.buffers)
    resident = next(b for b in plan.buffers if b.id == "gpu.resident_layers")
    assert resident.bytes == 2 * 2 * tiny_model.layer_params


def test_gpu_updated_blocks_never_cross_pcie_nor_touch_the_cpu(tiny_model):
    train = TrainSpec(micro_batch=1, seq_len=16)
    plan = build_plan(tiny_model, train, Policy.of(gpu_updated_blocks=2), num_steps=2)  # emb, L0
    moved = {(plan.task(t).kind, plan.task(t).block) for lane in ("h2d", "d2h", "cpu")
             for t in plan.lane_order[lane]}
    state_kinds = {"load_weights", "offload_grads", "optimizer_step", "cast"}
    for block in (EMBEDDING, 0):  # (layer 0's checkpoints still go to the host: not state)
        assert not any(layer == block and kind in state_kinds for kind, layer in moved)
    assert ("optimizer_step", 1) in moved and ("load_weights", 1) in moved
    # their updates run on the GPU after the step's backwards, before the next step's forward
    step0 = [t for t in plan.lane_order["gpu"] if plan.task(t).step == 0]
    update0 = tid(plan, "optimizer_step", 0)
    assert step0[-2:] == [tid(plan, "optimizer_step", EMBEDDING), update0]
    assert nx.has_path(plan.graph, update0, tid(plan, "forward", 0, step=1))
    assert nx.has_path(plan.graph, tid(plan, "backward", 0), update0)


def test_gpu_updated_state_moves_from_host_to_gpu_memory(tiny_model):
    train = TrainSpec(micro_batch=1, seq_len=16)
    base = build_plan(tiny_model, train, Policy.of(window=2), num_steps=2)
    moved = build_plan(tiny_model, train, Policy.of(window=2, gpu_updated_blocks=1), num_steps=2)
    e = tiny_model.embedding_params
    # host loses the embedding's m + v (8 B/param) and its bf16 upload copy (2, where its grads
    # landed); its fp32 master (4) stays in RAM as its home for loads and checkpoints
    assert base.static_bytes("host") - moved.static_bytes("host") == (8 + 2) * e
    # the GPU gains fp32 master, m, v and grads (16 B/param) as static state
    assert moved.static_bytes("gpu") - base.static_bytes("gpu") == 16 * e
    # and no longer makes the transient bf16 grads (2 B/param) the backward made for the offload
    made = task_buffer_id(tid(base, "backward", EMBEDDING), "offloaded_grads")
    assert buffer_named(base, made).bytes == 2 * e
    assert not [b for b in moved.buffers if b.tier == "gpu" and b.id == made]


def test_clipping_makes_gpu_updates_wait_for_the_norm(tiny_model):
    plan = build_plan(tiny_model, TrainSpec(micro_batch=1, seq_len=16, max_grad_norm=1.0),
                      Policy.of(gpu_updated_blocks=1), num_steps=2)
    assert nx.has_path(plan.graph, tid(plan, "offload_grads", 1),
                       tid(plan, "optimizer_step", EMBEDDING))
    assert nx.has_path(plan.graph, tid(plan, "backward", EMBEDDING), tid(plan, "grad_norm", HEAD))


def test_plan_names_the_gpu_unit_of_each_load_and_backward():
    model = make_tiny_model(num_layers=4)
    plan = build_plan(model, TrainSpec(micro_batch=1, seq_len=16),
                      Policy.of(window=2, grad_buffers=2), num_steps=2)
    loads = [plan.task(t) for t in plan.lane_order["h2d"] if plan.task(t).kind == "load_weights"]
    ring = [t for t in loads if 0 <= t.block < model.num_layers]
    assert {t.unit for t in ring} == {0, 1}
    assert all(t.unit == -1 for t in loads if t not in ring)  # embedding, head: dedicated
    # a unit is reloaded only after the task that last read it: the reuse edge says which
    by_unit: dict[int, list] = {}
    for t in ring:
        by_unit.setdefault(t.unit, []).append(t.id)
    for ids in by_unit.values():
        for earlier, later in pairwise(ids):
            (consumer_of_earlier,) = [s for s in plan.graph.successors(earlier)
                                      if plan.task(s).lane == "gpu"]
            assert nx.has_path(plan.graph, consumer_of_earlier, later)
    # a compute task names the unit its weights are in: the unit of its block's last load
    unit_of = {}
    for t in plan.lane_order["gpu"]:
        task = plan.task(t)
        for src in plan.graph.predecessors(t):
            if plan.task(src).kind == "load_weights":
                unit_of[task.block] = plan.task(src).unit
        if task.kind in ("forward", "backward") and 0 <= task.block < 4:
            assert task.unit == unit_of[task.block], t
    grad_slots = [plan.task(t).slot for t in plan.lane_order["gpu"]
                  if plan.task(t).kind == "backward" and 0 <= plan.task(t).block < 4]
    assert grad_slots[:4] == [0, 1, 0, 1]


def test_native_optimizer_writes_the_bf16_weights_itself(tiny_model):
    train = TrainSpec(micro_batch=1, seq_len=16)
    native = build_plan(tiny_model, train, Policy.of(cast="cpu_once"), num_steps=2)
    torch_ = build_plan(tiny_model, train, Policy.of(cast="cpu_once", cpu_optimizer="torch"),
                        num_steps=2)
    assert not [t for t in native.tasks if t.kind == "cast"]
    assert len([t for t in torch_.tasks if t.kind == "cast"]) == 2 * 4
    # step 1's first load of a block waits for step 0's optimizer step of that block
    load = tid(native, "load_weights", 0, step=1, for_kind="forward")
    assert native.graph.has_edge(tid(native, "optimizer_step", 0), load)
    assert torch_.graph.has_edge(tid(torch_, "cast", 0), load)
    # one pass over bf16 grads that writes bf16 weights: no upcast traffic, no fp32 buffer
    opt = native.task(tid(native, "optimizer_step", 0))
    assert opt.bytes == 0 and torch_.task(opt.id).bytes == 6 * opt.params
    assert not [b for b in native.buffers if b.id.endswith("grad_fp32")]


@pytest.mark.parametrize("gpu_updated", [0, 1, 3])
@pytest.mark.parametrize("host_grad_buffers", [None, 2])
def test_an_offload_never_overtakes_the_reader_of_the_buffer_it_reuses(tiny_model, gpu_updated,
                                                                       host_grad_buffers):
    plan = build_plan(tiny_model, TrainSpec(micro_batch=1, seq_len=16, grad_accum=2),
                      Policy.of(gpu_updated_blocks=gpu_updated,
                                host_grad_buffers=host_grad_buffers),
                      num_steps=2)
    offloads = [t for t in plan.lane_order["d2h"] if plan.task(t).kind == "offload_grads"]
    readers = [next(iter(plan.graph.successors(t))) for t in offloads]
    assert all(plan.task(r).kind == "accumulate_grads" for r in readers)
    pool = host_grad_buffers or len({plan.task(t).block for t in offloads})
    for i in range(pool, len(offloads)):  # buffer i % pool: the reader of offload i - pool first
        assert nx.has_path(plan.graph, readers[i - pool], offloads[i]), offloads[i]


def test_the_head_workspace_follows_the_policy_head_chunk():
    spec, train = PRESETS["llama-3.2-3b"], TrainSpec(micro_batch=8)

    def workspace_bytes(policy):
        plan = build_plan(spec, train, policy, num_steps=3)
        workspace = task_buffer_id(tid(plan, "head", HEAD), "workspace")
        (buffer,) = [b for b in plan.buffers if b.id == workspace]
        return buffer.bytes

    # 8k tokens of a 128k vocab: 4096-row chunks of bf16 logits at 1 GiB, 2048 at 0.5
    logits_row = BF16_BYTES * spec.vocab_size + FP32_BYTES
    full = workspace_bytes(Policy.of())
    assert full - workspace_bytes(Policy.of(head_chunk_bytes=512 * 2**20)) == 2048 * logits_row


def test_gpu_updated_blocks_can_take_the_decoder_layers_first():
    from layerslide.planner.build import gpu_layout

    forward = gpu_layout(4, Policy.of(gpu_updated_blocks=2))
    layers = gpu_layout(4, Policy.of(gpu_updated_blocks=2, gpu_updated_order="layers_first"))
    assert forward.gpu_updated == (EMBEDDING, 0) and forward.dedicated_layers == (0,)
    assert layers.gpu_updated == (0, 1) and layers.dedicated_layers == (0, 1)
    # all of them: the embedding comes last in the choice, first in the update order
    every = gpu_layout(4, Policy.of(gpu_updated_blocks=6, gpu_updated_order="layers_first"))
    assert every.gpu_updated == (EMBEDDING, 0, 1, 2, 3, 4)
    with pytest.raises(ValueError, match="gpu_updated_order"):
        Policy.of(gpu_updated_order="largest")


def test_cublas_workspaces_are_the_compute_pools_first_buffers_and_stay(tiny_model):

    plan = build_plan(tiny_model, TrainSpec(micro_batch=2, seq_len=16), Policy.of(), num_steps=2)
    first_gpu_task = plan.lane_order["gpu"][0]
    made_by_it = [b for b in plan.buffers if b.alloc_task == first_gpu_task]
    workspaces = made_by_it[:sizes.BLAS_WORKSPACES]  # requested before the task's own buffers
    assert [b.bytes for b in workspaces] == [sizes.BLAS_WORKSPACE_BYTES] * sizes.BLAS_WORKSPACES
    assert all(b.tier == "gpu" and not b.release_tasks and not b.at_end for b in workspaces)
    assert len(made_by_it) > len(workspaces)  # the embedding's forward makes more after them


def test_a_tasks_outputs_are_made_as_it_ends_and_the_heads_requests_keep_their_order(tiny_model):
    plan = build_plan(tiny_model, TrainSpec(micro_batch=2, seq_len=16), Policy.of(), num_steps=2)
    head, backward = tid(plan, "head", HEAD), tid(plan, "backward", 1)
    assert task_buffer(plan, backward, "offloaded_grads").at_end  # a backward's grads
    assert task_buffer(plan, backward, "dgrad").at_end  # and the grad it hands on
    assert task_buffer(plan, head, "dgrad").at_end
    assert not task_buffer(plan, backward, "workspace").at_end  # scratch: at the start
    order = [b.id for b in plan.buffers if b.alloc_task == head]
    # the final norm's saved tensors, then the LM weight's grad (summed over the loss's chunks:
    # there from the start), then the loss's logits
    grad = task_buffer_id(head, "offloaded_grads")
    assert not buffer_named(plan, grad).at_end
    assert (order.index(task_buffer_id(head, "norm")) < order.index(grad)
            < order.index(task_buffer_id(head, "workspace")))


@pytest.mark.parametrize("prefetch", [1, 2, 3])
def test_state_reads_reuse_a_staging_slot_only_after_its_write(prefetch):
    plan = build_plan(make_tiny_model(), TrainSpec(micro_batch=1, seq_len=16),
                      Policy.of(moments_on_nvme=1.0, nvme_prefetch=prefetch), num_steps=3)
    reads = [plan.task(t) for t in plan.lane_order["nvme_read"]]
    assert {t.kind for t in reads} == {"read_state"}
    assert {t.slot for t in reads} == set(range(prefetch)) == set(range(
        plan.placement.nvme_staging_slots))
    writes = {(t.block, t.step): t for t in plan.tasks if t.kind == "write_state"}
    for t in reads:  # a read and its block's write name one slot
        assert writes[(t.block, t.step)].slot == t.slot
    for k, a in enumerate(reads):  # reads sharing a slot: the later waits for the earlier's write
        for b in reads[k + 1:]:
            if a.slot == b.slot:
                assert nx.has_path(plan.graph, writes[(a.block, a.step)].id, b.id)


LAYER_MAJOR = Policy.of(accumulation="layer_major")


def test_layer_major_runs_each_task_for_every_micro_batch_in_turn(tiny_model):
    plan = build_plan(tiny_model, TrainSpec(micro_batch=1, seq_len=16, grad_accum=2),
                      LAYER_MAJOR, num_steps=2)
    step0 = [t for t in plan.lane_order["gpu"] if plan.task(t).step == 0]
    assert step0 == [tid(plan, kind, block, micro_batch=m) for kind, block in
                     (("forward", EMBEDDING), ("forward", 0), ("forward", 1), ("head", HEAD),
                      ("backward", 1), ("backward", 0), ("backward", EMBEDDING)) for m in (0, 1)]
    assert plan.meta["step_markers"] == [tid(plan, "backward", EMBEDDING, step=s, micro_batch=1)
                                         for s in (0, 1)]


def test_layer_major_loads_and_offloads_each_block_once_per_sweep():
    model = make_tiny_model(num_layers=6)
    train = TrainSpec(micro_batch=1, seq_len=16, grad_accum=4)
    step_major = build_plan(model, train, Policy.of(window=2), num_steps=2)
    layer_major = build_plan(model, train, Policy.of(window=2, accumulation="layer_major"),
                             num_steps=2)

    def per_step(plan, kind):
        return Counter(plan.task(t).block for t in plan.graph
                       if plan.task(t).kind == kind and plan.task(t).step == 1)

    loads = per_step(layer_major, "load_weights")
    # a layer's forward and backward loads (the last layers' backward reuses the forward's)
    assert all(loads[i] in (1, 2) for i in range(6)) and loads[EMBEDDING] == loads[6] == 1
    # as many as one micro-batch alone needs; step-major loads per micro-batch (some layers
    # stay in the window from one micro-batch's backward into the next's forward)
    single = build_plan(model, TrainSpec(micro_batch=1, seq_len=16), Policy.of(window=2),
                        num_steps=2)
    assert loads == per_step(single, "load_weights")
    assert sum(per_step(step_major, "load_weights").values()) == 3 * sum(loads.values())
    assert set(per_step(layer_major, "offload_grads").values()) == {1}
    assert set(per_step(step_major, "offload_grads").values()) == {4}
    assert not per_step(layer_major, "accumulate_grads")
    # no fp32 sums on the host; a checkpoint per layer and micro-batch waits there instead
    ids = {b.id: b for b in layer_major.buffers}
    assert HOST_GRAD_ACCUM in {b.id for b in step_major.buffers} and HOST_GRAD_ACCUM not in ids
    assert ids[HOST_CHECKPOINTS].bytes == 4 * buffer_named(step_major, HOST_CHECKPOINTS).bytes
    assert layer_major.placement.checkpoints_per_layer == 4
    assert layer_major.placement.grad_landing == "upload"  # as without accumulation


def test_layer_major_sums_grads_on_the_gpu_from_the_first_micro_batch_to_the_offload():
    tied = make_tiny_model()
    tied = type(tied)(**{**tied.to_dict(), "tie_word_embeddings": True})
    plan = build_plan(tied, TrainSpec(micro_batch=1, seq_len=16, grad_accum=3), LAYER_MAJOR,
                      num_steps=2)
    layer = task_buffer(plan, tid(plan, "backward", 1), "grad_sum")
    assert layer.tier == "gpu" and layer.bytes == FP32_BYTES * tied.layer_params
    last = tid(plan, "backward", 1, micro_batch=2)
    assert not layer.at_end and layer.release_tasks == (last,)
    rounded = task_buffer(plan, last, "offloaded_grads")
    # made as the last backward ends, its scratch gone, beside the sum (an input there)
    assert rounded.bytes == BF16_BYTES * tied.layer_params and rounded.at_end
    assert rounded.release_tasks == (tid(plan, "offload_grads", 1, micro_batch=2),)
    into = tied.layer_matmul_params  # the projections' GEMMs add into the sum themselves
    for m in range(3):  # autograd's bf16 grads of the norms, added in within the task
        backward = tid(plan, "backward", 1, micro_batch=m)
        fresh = task_buffer(plan, backward, "grads")
        assert fresh.release_tasks == (backward,)
        assert fresh.bytes == BF16_BYTES * (tied.layer_params - into)
    # tied: the heads start the embedding's sum with their LM-weight grads, its backwards add
    # their rows, the last rounds it; each head's own [V, h] grad is gone within the head
    emb = task_buffer(plan, tid(plan, "head", HEAD), "tied_grad_sum")
    assert emb.bytes == FP32_BYTES * 256 * 64
    assert emb.release_tasks == (tid(plan, "backward", EMBEDDING, micro_batch=2),)
    head1 = tid(plan, "head", HEAD, micro_batch=1)
    assert task_buffer(plan, head1, "tied_grad").release_tasks == (head1,)
    # the next step's sum waits for this one's offload
    assert nx.has_path(plan.graph, tid(plan, "offload_grads", EMBEDDING, micro_batch=2),
                       tid(plan, "head", HEAD, step=1))
    # the adds and the rounding cost GPU memory traffic
    step_major = build_plan(tied, TrainSpec(micro_batch=1, seq_len=16, grad_accum=3),
                            Policy.of(), num_steps=2)
    def extra(m: int) -> float:
        task = tid(plan, "backward", 1, micro_batch=m)
        return plan.task(task).bytes - step_major.task(task).bytes

    added = 10 * (tied.layer_params - into) + 5 * into
    assert extra(0) == added + 4 * tied.layer_params  # the sum made as zeros
    assert extra(1) == added
    assert extra(2) == added + 6 * tied.layer_params  # and rounded to bf16


def test_layer_major_sums_are_copied_from_the_first_grads_as_their_task_ends():
    """As the executor makes them (gpu_updates.add_into_sum): the head's and embedding's fp32
    sums start from the first micro-batch's bf16 grad once autograd has made it, so they come
    as that task ends and the grad goes after them; a decoder layer's sum is attached before
    its backward, so it is there from the start (H200 allocator history, 8B layer-major,
    benchmarks/results/scoreboard_2026-12-04d)."""
    model = make_tiny_model()  # untied
    train = TrainSpec(micro_batch=1, seq_len=16, grad_accum=3)
    plan = build_plan(model, train, LAYER_MAJOR, num_steps=2)
    for kind, block in (("head", HEAD), ("backward", EMBEDDING)):
        first, second = (tid(plan, kind, block, micro_batch=m) for m in (0, 1))
        total = task_buffer(plan, first, "grad_sum")
        assert total.at_end and total.release_tasks == (tid(plan, kind, block, micro_batch=2),)
        assert task_buffer(plan, first, "grads").outlives_outputs
        assert not task_buffer(plan, second, "grads").outlives_outputs
    layer = task_buffer(plan, tid(plan, "backward", 1), "grad_sum")
    assert not layer.at_end and not layer.outlives_outputs
    # the loss's LM-weight grad and the final norm's are two tensors: the rounded sum, one
    # block of both, does not fit the first's hole
    head = tid(plan, "head", HEAD)
    assert task_buffer(plan, head, "grads").bytes == BF16_BYTES * model.head_params
    assert (task_buffer(plan, head, "norm_grads").bytes
            == BF16_BYTES * model.final_norm_params)
    # the head holds its norm's bf16 output until it returns; the fp32 saved tensors go before
    normed = task_buffer(plan, head, "normed")
    assert normed.outlives_outputs and normed.bytes == 16 * 64 * BF16_BYTES
    assert (normed.bytes + task_buffer(plan, head, "norm").bytes
            == sizes.final_norm_saved_bytes(model, 16))
    # its fp32 saved tensors go before a layer-major head's sums are made; a step-major head's
    # one output, the dgrad its norm's backward makes, comes while they are alive
    assert not task_buffer(plan, head, "norm").outlives_outputs
    step_major = build_plan(model, TrainSpec(micro_batch=1, seq_len=16), Policy.of(),
                            num_steps=2)
    assert task_buffer(step_major, tid(step_major, "head", HEAD), "norm").outlives_outputs
    # tied: the head copies its LM-weight grad into the embedding's new sum the same way
    tied = type(model)(**{**model.to_dict(), "tie_word_embeddings": True})
    tied_plan = build_plan(tied, train, LAYER_MAJOR, num_steps=2)
    tied_head = tid(tied_plan, "head", HEAD)
    total = task_buffer(tied_plan, tied_head, "tied_grad_sum")
    assert total.at_end
    assert total.release_tasks == (tid(tied_plan, "backward", EMBEDDING, micro_batch=2),)
    assert task_buffer(tied_plan, tied_head, "tied_grad").outlives_outputs
    assert not task_buffer(tied_plan, tid(tied_plan, "head", HEAD, micro_batch=1),
                           "tied_grad").outlives_outputs
    # one group of three: its task makes the sum and rounds it, holding it past the rounding
    grouped = build_plan(model, train, LAYER_MAJOR.with_(sweep_groups=1), num_steps=2)
    for kind, block in (("head", HEAD), ("backward", EMBEDDING), ("backward", 1)):
        task = tid(grouped, kind, block)
        total = task_buffer(grouped, task, "grad_sum")
        assert not total.at_end and total.outlives_outputs
        assert task_buffer(grouped, task, "offloaded_grads").at_end


def test_layer_major_prefetches_weights_a_whole_sweep_ahead():
    model = make_tiny_model(num_layers=4)
    plan = build_plan(model, TrainSpec(micro_batch=1, seq_len=16, grad_accum=3),
                      Policy.of(window=2, prefetch_depth=1, accumulation="layer_major"),
                      num_steps=2)
    # layer 2's forward load may start once layer 1's forwards begin (the last of layer 0's
    # ended), as it would start at layer 1's forward with one micro-batch
    load = tid(plan, "load_weights", 2, step=1, for_kind="forward")
    (gate,) = [u for u, _, r in plan.graph.in_edges(load, data="reason") if r == "prefetch"]
    assert gate == tid(plan, "forward", 0, step=1, micro_batch=2)


def test_layer_major_with_one_micro_batch_is_the_plain_plan(tiny_model):
    train = TrainSpec(micro_batch=2, seq_len=16)
    assert (build_plan(tiny_model, train, LAYER_MAJOR).to_dict()["tasks"]
            == build_plan(tiny_model, train, Policy.of()).to_dict()["tasks"])


def test_layer_major_tasks_run_groups_of_micro_batches_and_cost_them_together(tiny_model):
    train = TrainSpec(micro_batch=1, seq_len=16, grad_accum=5)
    plan = build_plan(tiny_model, train, LAYER_MAJOR.with_(sweep_groups=2), num_steps=2)
    step0 = [plan.task(t) for t in plan.lane_order["gpu"] if plan.task(t).step == 0]
    # groups of 3 and 2 micro-batches: each block's task for each group in turn
    assert [(t.id, t.micro_batches) for t in step0[:4]] == [
        (tid(plan, "forward", EMBEDDING), 3), (tid(plan, "forward", EMBEDDING, micro_batch=3), 2),
        (tid(plan, "forward", 0), 3), (tid(plan, "forward", 0, micro_batch=3), 2)]
    single = build_plan(tiny_model, TrainSpec(micro_batch=1, seq_len=16), Policy.of(),
                        num_steps=2)
    one, three = single.task(tid(single, "forward", 0)), plan.task(tid(plan, "forward", 0))
    assert three.flops == 3 * one.flops and three.tokens == one.tokens
    assert three.host_ops == 3 * one.host_ops
    offload = plan.task(tid(plan, "offload_activation", 1, micro_batch=3))
    assert offload.micro_batches == 2 and offload.bytes == 2 * 16 * 64 * BF16_BYTES
    # a group's checkpoints come one by one as its task runs: counted from its start
    checkpoint = task_buffer(plan, tid(plan, "forward", 0), "checkpoint")
    assert checkpoint.bytes == 3 * 16 * 64 * BF16_BYTES and not checkpoint.at_end
    # one offload per block, made by the last group's task, read by the optimizer step
    offloads = [t for t in plan.lane_order["d2h"] if plan.task(t).kind == "offload_grads"
                and plan.task(t).step == 0]
    assert offloads == [tid(plan, "offload_grads", b, micro_batch=3)
                        for b in (HEAD, 1, 0, EMBEDDING)]
    assert task_buffer(plan, tid(plan, "backward", 0), "grad_sum").release_tasks == (
        tid(plan, "backward", 0, micro_batch=3),)
    # a step runs 2 groups through 7 GPU tasks each
    assert len(step0) == 2 * 7


@pytest.mark.parametrize(("train", "policy"), [
    (TrainSpec(micro_batch=2, seq_len=16), Policy.of()),
    (TrainSpec(micro_batch=1, seq_len=16, grad_accum=3), Policy.of(activations="host")),
    (TrainSpec(micro_batch=1, seq_len=16, grad_accum=3), LAYER_MAJOR.with_(cast="gpu")),
    (TrainSpec(micro_batch=1, seq_len=16), Policy.of(moments_on_nvme=0.5, gpu_updated_blocks=2,
                                                  host_grad_buffers=2, cast="cpu_per_load"))])
def test_static_buffers_without_the_tasks_are_the_plans(tiny_model, train, policy):
    from layerslide.planner.build import static_buffers
    plan = build_plan(tiny_model, train, policy)
    assert static_buffers(tiny_model, train, policy) == tuple(
        b for b in plan.buffers if b.is_static)
