"""What to buy: variants in ranges, ranked against a target, with cost, bound and shortfall."""

from types import SimpleNamespace

import pytest
from helpers import GIB, make_tiny_model

from layerslide.hwprofiles import ProfileError
from layerslide.tuner import SearchSpace
from layerslide.tuner.purchase import (
    RESOURCE_OF_FLOOR,
    bound_of,
    purchase_search,
    rank,
    summary,
    variants,
)

TINY_SPACE = SearchSpace(windows=(2,), micro_batches=(1,), grad_accums=(1,),
                         activations=("host",), casts=("cpu_once",), fill_gpu_updates=False)


def test_variants_cover_the_ranges_the_platforms_take():
    got, skipped = variants(["desktop-ddr5", "workstation-8ch"], ["rtx4090", "rtx5090"],
                            [128 * GIB, 256 * GIB], [1, 4])
    specs = {v.spec for v in got}
    # the desktop takes 128 GiB in two DIMMs and two drives; the workstation all four combos
    assert len(got) == 2 * 1 + 2 * 4
    assert "desktop-ddr5+rtx4090,ram=128GiB,drives=1" in specs
    assert "workstation-8ch+rtx5090,ram=256GiB,drives=4" in specs
    why = dict(skipped)
    assert "ram_max 128 GiB" in why["desktop-ddr5+rtx4090,ram=256GiB,drives=1"]
    assert "drives_max 2" in why["desktop-ddr5+rtx4090,ram=128GiB,drives=4"]
    v = next(v for v in got if v.spec == "workstation-8ch+rtx5090,ram=256GiB,drives=4")
    assert (v.profile.host.ram_bytes, v.profile.storage.drives) == (256 * GIB, 4)
    assert v.profile.cost() == pytest.approx(1999 + 9000 + 256 * 10 + 4 * 200)


@pytest.mark.parametrize("args, error, fragment", [
    ((["no-such-box"], ["rtx4090"], [128 * GIB], [1]), ProfileError, "unknown hardware profile"),
    ((["desktop-ddr5"], ["rtx9090"], [128 * GIB], [1]), ProfileError, "unknown GPU card"),
    ((["desktop-ddr5"], ["rtx4090"], [0], [1]), ValueError, "more than 0 bytes"),
    ((["desktop-ddr5"], ["rtx4090"], [128 * GIB], [0]), ValueError, ">= 1"),
    (([], ["rtx4090"], [128 * GIB], [1]), ValueError, "at least one"),
])
def test_bad_ranges_are_refused_before_any_tuning(args, error, fragment):
    with pytest.raises(error, match=fragment):
        variants(*args)


def _row(profile, cost, tps):
    return {"profile": profile, "cost": cost, "tokens_per_s": tps, "currency": "USD",
            "feasible": tps is not None, "bound": "GPU"}


def test_rank_puts_the_cheapest_that_reaches_the_target_first_with_the_next_cheapers_gap():
    rows = rank([_row("big", 9000, 400.0), _row("mid", 5000, 300.0),
                 _row("small", 3000, 150.0), _row("tiny", 2000, None),
                 _row("unpriced", None, 500.0)], target=250)
    assert [r["profile"] for r in rows] == ["mid", "big", "unpriced", "small", "tiny"]
    mid, big = rows[0], rows[1]
    assert mid["meets_target"] and not rows[3]["meets_target"]
    # mid's next cheaper is small: 150 of 250 tokens/s, 40% short
    assert mid["next_cheaper"] == "small"
    assert mid["next_cheaper_short_of_target"] == pytest.approx(0.4)
    assert big["next_cheaper"] == "mid" and big["next_cheaper_short_of_target"] == 0.0
    assert rows[3]["next_cheaper"] == "tiny"  # nothing fits on tiny: 100% short
    assert rows[3]["next_cheaper_short_of_target"] == 1.0
    assert rows[4]["next_cheaper"] is None
    assert mid["tokens_per_s_per_1k_cost"] == pytest.approx(300 / 5)
    assert rows[2]["tokens_per_s_per_1k_cost"] is None  # no price, no ratio
    lines = summary(rows, 250)
    assert lines[0].startswith("cheapest that reaches 250 tokens/s: mid at 5,000 USD")
    assert "small at 3,000, reaches 150 tokens/s (40% short)" in lines[1]


def test_summary_says_how_far_the_fastest_falls_short_when_none_reaches():
    rows = rank([_row("a", 3000, 100.0), _row("b", 4000, 200.0)], target=400)
    expected = "none reaches 400 tokens/s: the fastest, b, reaches 200 (50% short), bound by GPU"
    assert summary(rows, 400) == [expected]


def test_bound_is_the_largest_floor_by_resource():
    pred = SimpleNamespace(floors_s={"lane:gpu": 1.0, "host_memory": 3.0, "lane:cpu": 2.5},
                           step_s=4.0)
    assert bound_of(pred) == ("host memory bandwidth", 0.75)
    assert bound_of(SimpleNamespace(floors_s={}, step_s=1.0)) == (None, None)
    assert RESOURCE_OF_FLOOR["lane:cpu"] == "CPU AdamW"


def test_search_tunes_each_variant_and_ranks_them():
    got, _ = variants(["desktop-ddr5", "workstation-8ch"], ["rtx4090", "rtx5090"],
                      [128 * GIB], [1])
    rows = purchase_search(make_tiny_model(), 1.0, got, seq_len=16, space=TINY_SPACE,
                           workers=1)
    assert len(rows) == 4 and all(r["feasible"] and r["meets_target"] for r in rows)
    costs = [r["cost"] for r in rows]
    assert costs == sorted(costs)  # all reach 1 tokens/s: cheapest first
    assert rows[0]["profile"] == "desktop-ddr5+rtx4090,ram=128GiB,drives=1"
    assert all(r["bound"] in set(RESOURCE_OF_FLOOR.values()) for r in rows)
    assert all(0 < r["bound_share_of_step"] <= 1.0 + 1e-9 for r in rows)
    assert rows[1]["next_cheaper"] == rows[0]["profile"]
    with pytest.raises(ValueError, match="more than 0 tokens/s"):
        purchase_search(make_tiny_model(), 0, got, seq_len=16, space=TINY_SPACE)
