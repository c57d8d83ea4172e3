"""what-if: one model across profiles, one profile across models and sizes."""

from dataclasses import replace

import pytest
from helpers import GIB, make_round_profile, make_tiny_model

from layerslide.tuner import SearchSpace
from layerslide.tuner.whatif import across_models, across_profiles, largest_fitting

SPACE = SearchSpace(windows=(2,), micro_batches=(1, 2), activations=("host",), casts=("cpu_once",),
                    cast_workers=(False,), fill_gpu_updates=False,
                    allow_nvme=False)


def test_model_across_profiles_reports_fit_and_speed():
    fast = make_round_profile()
    slow_cpu = make_round_profile(adamw_params_per_s=1e5)
    rows = across_profiles(make_tiny_model(), [fast, slow_cpu], seq_len=16, space=SPACE)
    a, b = (r.row() for r in rows)
    assert a["feasible"] and b["feasible"]
    assert a["tokens_per_s"] > b["tokens_per_s"]
    assert b["bottleneck"] == "cpu"
    assert all(r.result.best is not None and r.result.best_plan is None for r in rows)  # unbuilt


def test_profiles_tuned_on_several_processes_come_back_in_order_as_on_one():
    profiles = [make_round_profile(adamw_params_per_s=rate) for rate in (1e5, 1e12, 1e6)]
    seen = []
    pooled = across_profiles(make_tiny_model(), profiles, seq_len=16, space=SPACE, workers=2,
                             progress=lambda done, total: seen.append((done, total)))
    alone = across_profiles(make_tiny_model(), profiles, seq_len=16, space=SPACE, workers=1)
    assert [r.row()["tokens_per_s"] for r in pooled] == [r.row()["tokens_per_s"] for r in alone]
    assert [r.profile for r in pooled] == [p.name for p in profiles]
    assert seen == [(1, 3), (2, 3), (3, 3)]


def test_profile_across_models_and_ram_sizes_finds_the_largest_fit():
    small, big = make_tiny_model(2), make_tiny_model(8)
    # RAM that holds the small model's run but not the big one's state (~3 MB more)
    roomy = across_models(make_round_profile(), [small], seq_len=16, space=SPACE)
    ram_small = max(c.prediction.peak_bytes["host"] for c in roomy[0].result.candidates)
    rows = across_models(make_round_profile(), [small, big], ram_sizes=[ram_small, 64 * GIB],
                         seq_len=16, space=SPACE)
    by = {(r.model, r.ram_bytes): r.row() for r in rows}
    assert by[(small.name, ram_small)]["feasible"]
    assert not by[(big.name, ram_small)]["feasible"]
    assert "host" in by[(big.name, ram_small)]["reason"]
    assert by[(big.name, 64 * GIB)]["feasible"]
    assert largest_fitting(rows).model == big.name
    assert largest_fitting([r for r in rows if r.ram_bytes == ram_small]).model == small.name


def test_capacity_bounds_by_hand():
    from layerslide.tuner.whatif import capacity_bounds

    gib = 1024**3
    bounds = capacity_bounds(make_round_profile(ram_bytes=130 * gib))  # NVMe 100 GiB
    # 128 GiB free after the 2 GiB runtime: 14 B/param all in RAM; with NVMe any of the
    # 14 B/param (the bf16 copy too) may go to disk: (128 + 100) / 14
    assert bounds["all_in_ram_params"] == 128 * gib / 14
    assert bounds["ram_and_nvme_params"] == (128 + 100) * gib / 14
    huge_nvme = make_round_profile(ram_bytes=130 * gib).with_overrides(
        nvme_capacity_bytes=10**15)
    assert capacity_bounds(huge_nvme)["ram_and_nvme_params"] == (128 * gib + 10**15) / 14


def test_capacity_bounds_by_moment_precision():
    from layerslide.tuner.whatif import capacity_bounds

    gib = 1024**3
    profile = make_round_profile(ram_bytes=130 * gib)
    bounds = {p: capacity_bounds(profile, p)["all_in_ram_params"] for p in ("fp32", "bf16", "int8")}
    assert bounds["fp32"] == 128 * gib / 14
    assert bounds["bf16"] == 128 * gib / 10  # master 4, moments 4, the bf16 copy 2
    assert bounds["int8"] == pytest.approx(128 * gib / (8 + 8 / 2048))


def test_compact_moments_are_tried_only_when_asked_and_fit_more():
    big = make_tiny_model(8)
    roomy = across_models(make_round_profile(), [big], seq_len=16, space=SPACE, exhaustive=True)
    need = min(c.prediction.peak_bytes["host"] for c in roomy[0].result.candidates)
    ram = need - 2 * big.total_params  # too little for fp32 moments; bf16 ones save 4 B/param
    fp32 = across_models(make_round_profile(), [big], ram_sizes=[ram], seq_len=16, space=SPACE)
    assert not fp32[0].row()["feasible"]
    assert all(c.policy.residency.moment_precision == "fp32" for c in roomy[0].result.candidates)
    compact = replace(SPACE, moment_precisions=("fp32", "bf16"))
    rows = across_models(make_round_profile(), [big], ram_sizes=[ram], seq_len=16, space=compact)
    assert rows[0].row()["feasible"]
    best = rows[0].result.best
    assert best.policy.residency.moment_precision == "bf16"
