"""tune: candidates, placement of optimizer state, ranking, rejections, the written plan."""

from dataclasses import replace

import pytest
from helpers import GIB, make_round_profile, make_tiny_model

from layerslide.planner import Plan, Policy, TrainSpec, build_plan, sizes
from layerslide.simulator import simulate
from layerslide.tuner import SearchSpace, evaluate, tune

SMALL = SearchSpace(windows=(1, 2), micro_batches=(1, 4), grad_accums=(1,),
                    activations=("gpu", "host"), cast_workers=(False,), casts=("cpu_once",),
                    fill_gpu_updates=False)


def test_every_candidate_is_evaluated_and_best_first():
    result = tune(make_tiny_model(), make_round_profile(), seq_len=16, space=SMALL, workers=1,
                  exhaustive=True)
    assert len(result.candidates) == 2 * 2 * 2
    speeds = [c.prediction.tokens_per_s for c in result.feasible]
    assert speeds == sorted(speeds, reverse=True)
    best = result.best
    assert best is result.candidates[0]
    # the tuner's own number for its pick is what simulating its plan gives
    again = simulate(result.best_plan, make_round_profile())
    assert again.tokens_per_s == pytest.approx(best.prediction.tokens_per_s, rel=1e-12)


def test_parallel_and_serial_tuning_agree():
    serial = tune(make_tiny_model(), make_round_profile(), seq_len=16, space=SMALL, workers=1)
    parallel = tune(make_tiny_model(), make_round_profile(), seq_len=16, space=SMALL, workers=2)
    assert [c.row() for c in serial.candidates] == [c.row() for c in parallel.candidates]


SEQ_FOR_PAGES = 2048  # past cuBLAS's 64 MiB of workspaces, which both batches share


def test_gpu_cap_rejects_with_the_tier_and_the_plan_file_loads(tmp_path):
    model = make_tiny_model()
    profile = make_round_profile()
    # a cap that every micro-batch-1 candidate fits and some micro-batch-4 one does not (a
    # sequence long enough that micro-batch 4 needs more 2 MiB pages of the allocator)
    uncapped = tune(model, profile, seq_len=SEQ_FOR_PAGES, space=SMALL, workers=1,
                    exhaustive=True)
    peaks = {}
    for c in uncapped.candidates:
        peaks.setdefault(c.train.micro_batch, []).append(c.prediction.gpu_need_bytes)
    cap = max(peaks[1])
    assert max(peaks[4]) > cap
    result = tune(model, profile, seq_len=SEQ_FOR_PAGES, space=SMALL, gpu_memory_bytes=cap,
                  workers=1, exhaustive=True)
    assert result.rejections().get("gpu", 0) >= 1
    assert all(c.prediction.gpu_need_bytes <= cap for c in result.feasible)
    path = tmp_path / "tuned.json"
    result.best_plan.save(path)
    loaded = Plan.load(path)
    assert loaded == result.best_plan
    assert loaded.meta["tuned_for_profile"] == "round"
    assert loaded.meta["gpu_memory_bytes"] == cap


def test_state_spills_to_nvme_only_when_the_host_is_too_small():
    model = make_tiny_model()
    train, policy = TrainSpec(micro_batch=1, seq_len=16), Policy.of()
    roomy = evaluate(model, train, policy, make_round_profile(), gpu_memory_bytes=None,
                     allow_nvme=True, num_steps=3)
    assert roomy.policy.residency.moments_on_nvme == 0.0 and roomy.feasible
    # host RAM just above the runtime: the state (12 B/param + bf16 copy) no longer fits
    static = build_plan(model, train, policy, num_steps=3).static_bytes("host")
    tight = make_round_profile(ram_bytes=static - 4 * model.total_params)
    spilled = evaluate(model, train, policy, tight, gpu_memory_bytes=None, allow_nvme=True,
                       num_steps=3)
    assert spilled.policy.residency.moments_on_nvme > 0
    refused = evaluate(model, train, policy, tight, gpu_memory_bytes=None, allow_nvme=False,
                       num_steps=3)
    assert not refused.feasible and refused.prediction.overflows[0].tier == "host"


def test_nothing_fits_gives_no_plan():
    result = tune(make_tiny_model(), make_round_profile(ram_bytes=GIB), seq_len=16, space=SMALL,
                  workers=1)
    assert result.best is None and result.best_plan is None
    assert result.rejections()["host"] == len(result.candidates)


def test_empty_search_space_is_refused():
    with pytest.raises(ValueError, match="windows is empty"):
        SearchSpace(windows=())


def test_gpu_overflow_is_not_blamed_on_the_host_or_spilled_to_nvme():
    model = make_tiny_model()
    train, policy = TrainSpec(micro_batch=1, seq_len=16), Policy.of()
    cap = build_plan(model, train, policy, num_steps=3).static_bytes("gpu") - 1
    c = evaluate(model, train, policy, make_round_profile(), gpu_memory_bytes=cap,
                 allow_nvme=True, num_steps=3)
    assert [o.tier for o in c.prediction.overflows] == ["gpu"]
    assert c.policy.residency.moments_on_nvme == 0.0 and c.policy.residency.master_on_nvme == 0.0


def test_a_host_overflowing_only_while_running_bounds_grad_buffers_before_spilling():
    """A host whose static buffers fit but which overflows while the step runs gets the bounded
    pool of pinned grad landing buffers tried before any optimizer state goes to NVMe.

    The landing buffers are static now (host.grad_landing), so the pool no longer bounds grads
    piling up behind a slow CPU while the step runs: it shrinks the static landing buffer from
    one per block to BOUNDED_LANDING_BUFFERS of the largest block's size. What comes and goes on
    the host here is torch AdamW's fp32 grad upcast (4 B/param of the block being stepped)."""
    model = make_tiny_model(num_layers=6)
    # cast on the GPU: no bf16 upload copies for the grads to land in, so landing buffers
    train = TrainSpec(micro_batch=1, seq_len=16)
    policy = Policy.of(cpu_optimizer="torch", cast="gpu")
    layer = 36992  # params of a decoder layer, the largest block
    n = 6 * layer + 256 * 64 + (256 * 64 + 64)  # + embedding + LM head and final norm
    assert model.total_params == n
    roomy = evaluate(model, train, policy, make_round_profile(), gpu_memory_bytes=None,
                     allow_nvme=True, num_steps=3)
    assert roomy.policy.residency.host_grad_buffers is None
    static = build_plan(model, train, policy, num_steps=3).static_bytes("host")
    peak = roomy.prediction.peak_bytes["host"]
    assert peak == static + 4 * layer  # one layer's fp32 upcast: the CPU steps one block at a time
    bounded = build_plan(model, train, policy.with_(host_grad_buffers=4), num_steps=3)
    # bf16 landing buffers: 2 B for every parameter, one per block -> four of a layer's size
    assert static - bounded.static_bytes("host") == 2 * n - 4 * 2 * layer
    bounded_peak = simulate(bounded, make_round_profile()).peak_bytes["host"]
    assert bounded_peak == bounded.static_bytes("host") + 4 * layer
    assert bounded_peak < static < peak
    # RAM between the static bytes and the peak: the plan passes the static check and only
    # overflows while it runs; four pinned grad buffers then make it fit without NVMe
    tight = make_round_profile(ram_bytes=static + 2 * layer)
    assert static < tight.host.ram_bytes < peak
    c = evaluate(model, train, policy, tight, gpu_memory_bytes=None, allow_nvme=True,
                 num_steps=3)
    assert c.feasible
    assert c.policy.residency.host_grad_buffers == 4
    assert c.policy.residency.moments_on_nvme == 0.0 and c.policy.residency.master_on_nvme == 0.0
    assert c.prediction.peak_bytes["host"] == bounded_peak <= tight.host.ram_bytes


def test_a_host_whose_static_buffers_overflow_takes_the_grad_pool_before_nvme():
    """The landing buffers are static, so a pool of them can relieve a static overflow: RAM
    between the static bytes with the pool and without it fits wholly in RAM with the pool,
    where spilling moments to NVMe would be slower."""
    model = make_tiny_model(num_layers=6)
    # cast on the GPU: no bf16 upload copies for the grads to land in, so landing buffers
    train, policy = TrainSpec(micro_batch=1, seq_len=16), Policy.of(cast="gpu")
    static = build_plan(model, train, policy, num_steps=3).static_bytes("host")
    pooled = build_plan(model, train, policy.with_(host_grad_buffers=4), num_steps=3)
    between = make_round_profile(ram_bytes=(static + pooled.static_bytes("host")) // 2)
    assert pooled.static_bytes("host") < between.host.ram_bytes < static
    c = evaluate(model, train, policy, between, gpu_memory_bytes=None, allow_nvme=True,
                 num_steps=3)
    assert c.feasible
    assert c.policy.residency.host_grad_buffers == 4
    assert c.policy.residency.moments_on_nvme == 0.0 and c.policy.residency.master_on_nvme == 0.0


def test_search_space_values_are_checked():
    with pytest.raises(ValueError, match="casts"):
        SearchSpace(casts=("cpu_twice",))
    with pytest.raises(ValueError, match="micro_batches"):
        SearchSpace(micro_batches=(0,))


def test_free_gpu_memory_goes_to_gpu_updated_blocks_when_that_is_faster():
    model = make_tiny_model(num_layers=4)
    train, policy = TrainSpec(micro_batch=1, seq_len=16), Policy.of()
    profile = make_round_profile()  # the CPU is the bottleneck: GPU updates take work off it
    base = evaluate(model, train, policy, profile, gpu_memory_bytes=None, allow_nvme=True,
                    num_steps=3)
    filled = evaluate(model, train, policy, profile, gpu_memory_bytes=None, allow_nvme=True,
                      num_steps=3, fill_gpu_updates=True)
    assert base.policy.residency.gpu_updated_blocks == 0
    assert filled.policy.residency.gpu_updated_blocks == model.num_layers + 2  # plenty of room: all
    assert filled.prediction.tokens_per_s > 10 * base.prediction.tokens_per_s
    # with room for the embedding's state only (18 B/param) the fill takes just that one
    room = 18 * model.embedding_params + 1000
    capped = evaluate(model, train, policy, profile,
                      gpu_memory_bytes=base.prediction.gpu_need_bytes + int(room / 0.95),
                      allow_nvme=True, num_steps=3, fill_gpu_updates=True)
    assert capped.policy.residency.gpu_updated_blocks == 1
    assert capped.prediction.feasible


def test_where_grads_land_in_the_upload_copies_no_pool_is_tried():
    """With cast=cpu_once and no accumulation there are no landing buffers to bound: a host
    overflow goes straight to NVMe placements."""
    model = make_tiny_model(num_layers=6)
    train, policy = TrainSpec(micro_batch=1, seq_len=16), Policy.of()
    static = build_plan(model, train, policy, num_steps=3).static_bytes("host")
    assert static == build_plan(model, train, policy.with_(host_grad_buffers=4),
                                num_steps=3).static_bytes("host")
    c = evaluate(model, train, policy, make_round_profile(ram_bytes=static - 1),
                 gpu_memory_bytes=None, allow_nvme=True, num_steps=3)
    assert c.policy.residency.host_grad_buffers is None
    assert c.policy.residency.moments_on_nvme > 0


@pytest.mark.parametrize(("cast", "master"), [("cpu_once", 1.0), ("gpu", 0.0)])
def test_with_all_state_on_nvme_and_the_host_still_over_one_block_is_staged_at_a_time(cast,
                                                                                     master):
    """Each NVMe read ahead holds a whole block's fp32 state in RAM: where that is what keeps
    the plan over the host's RAM, the tuner stages one block at a time (Mistral-Large-123B on a
    24 GiB card with 256 GiB of RAM fits only so). Casts other than cpu_once keep the master
    weights in RAM: then "all" is the moments (and the grads' landing pool is already set, so
    that it is not what makes room)."""
    model = make_tiny_model(num_layers=6)
    train = TrainSpec(micro_batch=1, seq_len=16)
    policy = Policy.of(cast=cast, host_grad_buffers=4 if cast == "gpu" else None)
    all_on_disk = policy.with_(moments_on_nvme=1.0, master_on_nvme=master)
    profile = make_round_profile()
    two_ahead = simulate(build_plan(model, train, all_on_disk, num_steps=3), profile)
    one_ahead = simulate(build_plan(model, train, all_on_disk.with_(nvme_prefetch=1),
                                    num_steps=3), profile)
    low, high = one_ahead.peak_bytes["host"], two_ahead.peak_bytes["host"]
    assert low < high
    between = make_round_profile(ram_bytes=(low + high) // 2)
    c = evaluate(model, train, policy, between, gpu_memory_bytes=None, allow_nvme=True,
                 num_steps=3)
    assert c.feasible
    placed = c.policy.flat()
    assert (placed["moments_on_nvme"], placed["master_on_nvme"], placed["nvme_prefetch"]) == (
        1.0, master, 1)
    # with RAM for two read-aheads, the policy's own depth stays
    roomy = evaluate(model, train, policy, make_round_profile(ram_bytes=high), gpu_memory_bytes=None,
                     allow_nvme=True, num_steps=3)
    assert roomy.policy.schedule.nvme_prefetch == policy.schedule.nvme_prefetch


def test_the_leaders_are_ranked_at_the_speed_their_gpu_settles_at(monkeypatch):
    # a profile with a busy speedup: the search holds the GPU's clock, the leaders are
    # simulated again with it settled, and the pick is what simulate says of its plan
    from layerslide.hwprofiles import load_profile
    from layerslide.planner import PRESETS
    from layerslide.tuner import exhaustive

    monkeypatch.setattr(exhaustive, "CLOCK_FINALISTS", 2)
    profile = load_profile("h200-bench")
    space = SearchSpace(windows=(1, 2), micro_batches=(1, 8), grad_accums=(1,),
                        activations=("host",), casts=("cpu_once",), allow_nvme=False,
                        fill_gpu_updates=False)
    result = tune(PRESETS["llama-3.2-1b"], profile, space=space, workers=1, exhaustive=True)
    speedups = [c.prediction.gpu_speedup for c in result.candidates]
    assert sum(s > 1.0 for s in speedups) == 2 and speedups.count(1.0) == 2
    best = result.best
    direct = simulate(build_plan(PRESETS["llama-3.2-1b"], best.train, best.policy), profile)
    assert best.prediction.step_s == pytest.approx(direct.step_s)
    assert best.prediction.gpu_speedup == pytest.approx(direct.gpu_speedup)


def test_with_no_room_for_the_embedding_the_fill_takes_decoder_layers():
    # a 4096-token vocab: the embedding's GPU state (18 B/param, 4.7 MB) does not fit the room
    # left, decoder layers' (0.67 MB each) do; the CPU is the bottleneck, so moving them pays
    from layerslide.planner import EMBEDDING
    from layerslide.planner.build import gpu_layout

    model = replace(make_tiny_model(num_layers=4), vocab_size=4096)
    train, policy = TrainSpec(micro_batch=1, seq_len=16), Policy.of()
    profile = make_round_profile()
    base = evaluate(model, train, policy, profile, gpu_memory_bytes=None, allow_nvme=True,
                    num_steps=3)
    room = 18 * 4 * model.layer_params
    assert room < 18 * model.embedding_params
    capped = evaluate(model, train, policy, profile,
                      gpu_memory_bytes=base.prediction.gpu_need_bytes + int(room / 0.95),
                      allow_nvme=True, num_steps=3, fill_gpu_updates=True)
    assert capped.policy.residency.gpu_updated_order == "layers_first"
    updated = gpu_layout(model.num_layers, capped.policy).gpu_updated
    assert 1 <= len(updated) <= 4 and EMBEDDING not in updated
    assert capped.prediction.feasible
    assert capped.prediction.tokens_per_s > base.prediction.tokens_per_s


@pytest.mark.parametrize("exhaustive", [True, False])
def test_the_pick_is_always_one_whose_clock_was_settled(monkeypatch, exhaustive):
    # a table that slows a busy GPU below its efficiency tables' rate: settling the leader can
    # drop it under an unsettled one, which is then settled before it can be the pick
    import dataclasses

    from layerslide.hwprofiles import load_profile
    from layerslide.planner import PRESETS
    from layerslide.tuner import exhaustive

    monkeypatch.setattr(exhaustive, "CLOCK_FINALISTS", 1)
    base = load_profile("h200-bench")
    profile = dataclasses.replace(base, gpu=dataclasses.replace(
        base.gpu, busy_speedup=((0.25, 1.0), (0.5, 1.0), (1.0, 0.92))))
    space = SearchSpace(windows=(2, 4), micro_batches=(8, 16, 32), activations=("gpu", "host"),
                        casts=("cpu_once",), allow_nvme=False, fill_gpu_updates=False)
    result = tune(PRESETS["llama-3.2-1b"], profile, space=space, workers=1,
                  exhaustive=exhaustive)
    best = result.best
    direct = simulate(build_plan(PRESETS["llama-3.2-1b"], best.train, best.policy), profile)
    assert best.prediction.gpu_speedup == pytest.approx(direct.gpu_speedup)
    assert best.prediction.step_s == pytest.approx(direct.step_s)


def test_accumulation_is_tried_both_ways_under_the_cap_on_tokens_per_step():
    space = replace(SMALL, windows=(1,), activations=("host",), grad_accums=(1, 4),
                    max_tokens_per_step=4 * 16 * 2)
    result = tune(make_tiny_model(), make_round_profile(), seq_len=16, space=space, workers=1,
                  exhaustive=True)
    tried = sorted((c.train.micro_batch, c.train.grad_accum, c.policy.schedule.accumulation)
                   for c in result.candidates)
    # one micro-batch a step is one plan whichever the schedule; 4 x 4 x 16 tokens is over
    assert tried == [(1, 1, "step_major"), (1, 4, "layer_major"), (1, 4, "step_major"),
                     (4, 1, "step_major")]
    assert all(c.row()["tokens_per_step"] <= 128 for c in result.candidates)
    with pytest.raises(ValueError, match="max_tokens_per_step"):
        tune(make_tiny_model(), make_round_profile(), seq_len=16,
             space=replace(space, max_tokens_per_step=8), workers=1)
    with pytest.raises(ValueError, match="max_tokens_per_step"):
        SearchSpace(max_tokens_per_step=0)


def test_settings_that_overflow_the_gpu_are_not_tried_at_a_larger_micro_batch():
    # GPU needs (MiB) at micro-batch 64 / 128: 828 / 848 with the checkpoints on the GPU, 848 /
    # 868 with them on the host; capped at 838, the host's at 128 is not simulated
    space = replace(SMALL, windows=(1,), micro_batches=(64, 128))
    result = tune(make_tiny_model(), make_round_profile(), seq_len=256, space=space, workers=1,
                  gpu_memory_bytes=838 * 2**20, exhaustive=True)
    tried = {(c.train.micro_batch, c.policy.residency.activations): c.feasible
             for c in result.candidates}
    assert tried == {(64, "gpu"): True, (64, "host"): False, (128, "gpu"): False}
    assert result.pruned == 1


def test_a_finer_spill_sheds_the_host_overflow_between_the_coarse_placements():
    """(moments, master) on NVMe, moments first: the least step of SPILL_STEP that moves the
    overflowing bytes, then the master weights once the moments are all there."""
    from layerslide.tuner.placement import SPILL_STEP, finer_spill

    params = 10**9
    moments_bytes = sizes.MOMENTS_BYTES_PER_PARAM * params
    assert finer_spill((0.5, 0.0, 0.0), int(0.03 * moments_bytes), params) == (0.55, 0.0, 0.0)
    assert finer_spill((0.5, 0.0, 0.0), int(0.26 * moments_bytes), params) == (0.8, 0.0, 0.0)
    assert finer_spill((0.5, 0.0, 0.0), 1, params) == (0.5 + SPILL_STEP, 0.0, 0.0)
    assert finer_spill((0.5, 0.0, 0.0), 2 * moments_bytes, params) == (1.0, 0.0, 0.0)
    master_bytes = sizes.MASTER_BYTES_PER_PARAM * params
    assert finer_spill((1.0, 0.5, 0.0), int(0.1 * master_bytes), params) == (1.0, 0.6, 0.0)
    weight_bytes = sizes.UPLOAD_BYTES_PER_PARAM * params
    assert finer_spill((1.0, 1.0, 0.0), int(0.2 * weight_bytes), params) == (1.0, 1.0, 0.2)
    # a cast that reads the master from RAM skips to the weights; without the native AdamW's
    # cast, nothing is left
    assert finer_spill((1.0, 0.0, 0.0), 10, params, master_ok=False) == (1.0, 0.0, 0.05)
    assert finer_spill((1.0, 0.0, 0.0), 10, params, master_ok=False, weights_ok=False) is None
    assert finer_spill((1.0, 1.0, 1.0), 10, params) is None


def test_the_tuner_spills_just_enough_between_its_coarse_placements():
    """A host that half of the moments on NVMe leave over, and a drive that cannot hold all of
    them: the pick keeps more than half and less than all of them on the disk (the 14B case on
    the benchmark machine). Where all of them fit the drive, the coarse placement stands (a
    finer one costs simulations)."""
    model = make_tiny_model()
    train = TrainSpec(micro_batch=1, seq_len=16)
    policy = Policy.of(host_grad_buffers=2)  # no grad pool left to bound first

    def peaks(moments: float) -> dict[str, int]:
        plan = build_plan(model, train, policy.with_(moments_on_nvme=moments), num_steps=3)
        return simulate(plan, make_round_profile()).peak_bytes

    ram = peaks(0.7)["host"]  # each spilled step also stages more: more than one finer try
    assert peaks(0.5)["host"] > peaks(0.65)["host"] > ram
    roomy_drive = make_round_profile(ram_bytes=ram)
    coarse = evaluate(model, train, policy, roomy_drive, gpu_memory_bytes=None,
                      allow_nvme=True, num_steps=3)
    assert coarse.feasible and coarse.policy.residency.moments_on_nvme == 1.0
    small_drive = roomy_drive.with_overrides(
        nvme_capacity_bytes=(peaks(0.7)["nvme"] + peaks(1.0)["nvme"]) // 2)
    picked = evaluate(model, train, policy, small_drive, gpu_memory_bytes=None,
                      allow_nvme=True, num_steps=3)
    assert picked.feasible
    assert picked.policy.residency.moments_on_nvme == pytest.approx(0.7)
    assert picked.policy.residency.master_on_nvme == 0.0


def test_a_cast_worker_is_tried_only_where_the_plan_has_cpu_casts_to_give_it():
    space = replace(SMALL, windows=(1,), micro_batches=(1,), activations=("host",),
                    casts=("gpu", "cpu_once", "cpu_per_load"), cast_workers=(False, True))
    for kernel, with_cpu_casts in (("native", {"cpu_per_load"}),
                                   ("torch", {"cpu_once", "cpu_per_load"})):
        base = Policy.of(cpu_optimizer=kernel)
        found = [p for _, p in space.candidates(16, None, base)]
        # one candidate per cast, and a second, with the worker, where it has casts to run
        assert sorted((p.schedule.cast, p.schedule.cast_worker) for p in found) == sorted(
            [(c, False) for c in space.casts] + [(c, True) for c in with_cpu_casts])
        assert all(p.cpu_casts for p in found if p.schedule.cast_worker)
