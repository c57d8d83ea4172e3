"""Golden trace of a tiny two-step plan on the round profile, plus hand-worked timings.

Regenerate the golden file after an intended change of the planner or the simulator with
`python tests/simulator/test_sim_golden.py --regenerate`, and review the diff of the JSON.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

if __name__ == "__main__":  # run as a script: make the repository and tests/ importable
    sys.path[:0] = [str(Path(__file__).resolve().parents[2]),
                    str(Path(__file__).resolve().parents[1])]

import pytest
from helpers import make_round_profile, make_tiny_model

from layerslide.planner import Policy, TrainSpec, build_plan
from layerslide.simulator import simulate

GOLDEN_PATH = Path(__file__).parent / "data" / "golden_tiny.json"
ABS_TOL_S = 1e-12
US = 1e-6  # one microsecond, in seconds


def golden_prediction():
    """The plan the golden file describes: tiny 2-layer model, 1 x 16 tokens, the default
    policy with torch's CPU optimizer (separate cast tasks: the hand-worked times below)."""
    plan = build_plan(make_tiny_model(), TrainSpec(micro_batch=1, seq_len=16),
                      Policy.of(cpu_optimizer="torch", layer_kernels="eager"), num_steps=3)
    return plan, simulate(plan, make_round_profile())


def event_rows(prediction) -> list[list]:
    """(task_id, lane, start_s, end_s) of every event, in the order the trace lists them."""
    return [[e.task_id, e.lane, e.start_s, e.end_s] for e in prediction.trace.events]


def regenerate(path: Path = GOLDEN_PATH) -> None:
    """Write the golden file from the current planner and simulator (floats round-trip)."""
    _, prediction = golden_prediction()
    data = {
        "what": "build_plan(make_tiny_model(), TrainSpec(micro_batch=1, seq_len=16), "
                "Policy.of(cpu_optimizer='torch', layer_kernels='eager'), num_steps=3) simulated "
                "on make_round_profile()",
        "regenerate": "python tests/simulator/test_sim_golden.py --regenerate",
        "step_s": prediction.step_s,
        "events": event_rows(prediction),
    }
    rows = ",\n".join("  " + json.dumps(row) for row in data.pop("events"))
    head = json.dumps(data, indent=1)[:-2]  # drop the closing "\n}" to append the events
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(f'{head},\n "events": [\n{rows}\n ]\n}}\n')


@pytest.fixture(scope="module")
def golden():
    return golden_prediction()


@pytest.fixture(scope="module")
def events(golden):
    _, prediction = golden
    return {e.task_id: e for e in prediction.trace.events}


def test_trace_matches_golden_file(golden):
    _, prediction = golden
    expected = json.loads(GOLDEN_PATH.read_text())
    actual = event_rows(prediction)
    assert [row[:2] for row in actual] == [row[:2] for row in expected["events"]]
    for got, want in zip(actual, expected["events"], strict=True):
        assert got[2] == pytest.approx(want[2], rel=0, abs=ABS_TOL_S), got[0]
        assert got[3] == pytest.approx(want[3], rel=0, abs=ABS_TOL_S), got[0]
    assert prediction.step_s == pytest.approx(expected["step_s"], rel=0, abs=ABS_TOL_S)


def test_golden_trace_has_every_task_once(golden):
    plan, prediction = golden
    ids = [e.task_id for e in prediction.trace.events]
    assert sorted(ids) == sorted(plan.graph.nodes)
    # 3 steps x (7 GPU + 6 h2d + 6 d2h + 8 CPU) tasks
    assert len(ids) == 3 * (7 + 6 + 6 + 8)


# --- hand-worked values (independent of the golden file) -----------------------------------
# Round profile: h2d/d2h 1e9 B/s, GPU 1e12 FLOP/s at efficiency 1 and HBM 1e15 B/s, AdamW 1e6
# params/s at 28 B/param, cast 1e7 B/s of fp32 read, host memory 1e15 B/s (no contention here).
# Tiny model: layer 36992 params, embedding 256*64 = 16384, head 16384 + 64 (final norm) = 16448;
# layer forward FLOPs per token at seq 16 = 77824; 16 tokens per micro-batch.
EMB_LOAD_S = 2 * 16384 / 1e9  # bf16 embedding: 32.768 us
LAYER_LOAD_S = 2 * 36992 / 1e9  # bf16 layer: 73.984 us
HEAD_LOAD_S = 2 * 16448 / 1e9  # bf16 head + final norm: 32.896 us
# Layer forward: GEMMs 73728 + attention 4*16*64 = 4096 FLOPs/token, both at efficiency 1:
# 77824*16/1e12 = 1.245184 us, plus elementwise HBM traffic (sizes.layer_elementwise_bytes_per_token:
# norms 2*36*64 + RoPE 20*(64+32) + SwiGLU 10*128 + residuals 2*6*64 + layout 4*64
# = 8832 B/token) * 16 tokens / 1e15 B/s = 1.41312e-10 s.
LAYER_FWD_S = 77824 * 16 / 1e12 + 8832 * 16 / 1e15
# Embedding forward: 2 hidden tensors (2 B * 64 * 16 = 2048 B each) of HBM traffic, no FLOPs.
EMB_FWD_S = 2 * 2048 / 1e15
# Head: 3 * (2*64*256 FLOPs/token) * 16 tokens / 1e12 = 1.572864 us, plus HBM traffic of 4
# hidden tensors (4 * 2048 B) and the fused loss's logits (12 B * 256 vocab * 16 tokens) / 1e15.
HEAD_S = 3 * 2 * 64 * 256 * 16 / 1e12 + (4 * 2048 + 12 * 256 * 16) / 1e15
CKPT_COPY_S = 2048 / 1e9  # one bf16 [16, 64] checkpoint: 2.048 us
HEAD_GRADS_OFFLOAD_S = 2 * 16448 / 1e9  # bf16 head grads: 32.896 us
# AdamW moves 28 B/param plus 6 B/param of bf16->fp32 grad upcast, at 1e6 * 28 B/s.
OPT_HEAD_S = 16448 * 34 / 28 / 1e6  # 19.972571 ms
OPT_EMB_S = 16384 * 34 / 28 / 1e6  # 19.894857 ms
CAST_EMB_S = 4 * 16384 / 1e7  # fp32 read at 1e7 B/s: 6.5536 ms


def _assert_times(event, start_s: float, end_s: float) -> None:
    assert event.start_s == pytest.approx(start_s, rel=0, abs=ABS_TOL_S), event.task_id
    assert event.end_s == pytest.approx(end_s, rel=0, abs=ABS_TOL_S), event.task_id


def test_first_loads_run_back_to_back_on_h2d(events):
    _assert_times(events["s0.m0.load_weights.emb.forward"], 0.0, 32.768 * US)
    assert EMB_LOAD_S == pytest.approx(32.768 * US)
    # layer 0's load follows on the strict h2d lane: ends at 32.768 + 73.984 = 106.752 us
    _assert_times(events["s0.m0.load_weights.L0.forward"], EMB_LOAD_S, EMB_LOAD_S + LAYER_LOAD_S)
    assert EMB_LOAD_S + LAYER_LOAD_S == pytest.approx(106.752 * US)
    l1_load_end_s = EMB_LOAD_S + 2 * LAYER_LOAD_S  # 180.736 us
    _assert_times(events["s0.m0.load_weights.L1.forward"], EMB_LOAD_S + LAYER_LOAD_S, l1_load_end_s)
    head_load = events["s0.m0.load_weights.head.head"]
    _assert_times(head_load, l1_load_end_s, l1_load_end_s + HEAD_LOAD_S)


def test_forwards_wait_for_their_weights(events):
    _assert_times(events["s0.m0.forward.emb"], EMB_LOAD_S, EMB_LOAD_S + EMB_FWD_S)
    l0_start_s = EMB_LOAD_S + LAYER_LOAD_S
    _assert_times(events["s0.m0.forward.L0"], l0_start_s, l0_start_s + LAYER_FWD_S)
    assert events["s0.m0.forward.L0"].duration_s == pytest.approx(1.245325312 * US, rel=1e-12)
    l1_start_s = EMB_LOAD_S + 2 * LAYER_LOAD_S
    _assert_times(events["s0.m0.forward.L1"], l1_start_s, l1_start_s + LAYER_FWD_S)
    head_start_s = l1_start_s + HEAD_LOAD_S  # 213.632 us: the head waits for its load
    _assert_times(events["s0.m0.head.head"], head_start_s, head_start_s + HEAD_S)
    # the embedding's output (layer 0's checkpoint) goes to the host as soon as it exists
    emb_end_s = EMB_LOAD_S + EMB_FWD_S
    _assert_times(events["s0.m0.offload_activation.L0"], emb_end_s, emb_end_s + CKPT_COPY_S)


def test_cpu_chain_and_step_time(golden, events):
    _, prediction = golden
    head_end_s = EMB_LOAD_S + 2 * LAYER_LOAD_S + HEAD_LOAD_S + HEAD_S  # 215.204921 us
    grads_end_s = head_end_s + HEAD_GRADS_OFFLOAD_S  # 248.100872 us
    _assert_times(events["s0.m0.offload_grads.head"], head_end_s, grads_end_s)
    # The head's grads land first, so the CPU starts with the head's step; by its end every
    # block's grads are in, and deadline order picks the embedding (first used next step), then
    # the embedding's cast (its key sorts before layer 0's step).
    _assert_times(events["s0.m0.optimizer_step.head"], grads_end_s, grads_end_s + OPT_HEAD_S)
    emb_opt_start_s = grads_end_s + OPT_HEAD_S
    _assert_times(events["s0.m0.optimizer_step.emb"], emb_opt_start_s, emb_opt_start_s + OPT_EMB_S)
    cast_end_s = emb_opt_start_s + OPT_EMB_S + CAST_EMB_S
    _assert_times(events["s0.m0.cast.emb"], emb_opt_start_s + OPT_EMB_S, cast_end_s)
    assert cast_end_s == pytest.approx(46669.12949277 * US, abs=1e-12)
    # step 1's embedding is loaded once step 0's cast is done, then the embedding forward runs
    _assert_times(events["s1.m0.load_weights.emb.forward"], cast_end_s, cast_end_s + EMB_LOAD_S)
    # the step is the last cycle between the ends of consecutive steps' last GPU tasks (or the
    # mean cycle, if longer); with the CPU this slow every cycle is the same (to rounding)
    step_s = events["s2.m0.backward.emb"].end_s - events["s1.m0.backward.emb"].end_s
    assert prediction.step_s == pytest.approx(step_s, rel=1e-12)
    first_s = events["s1.m0.backward.emb"].end_s - events["s0.m0.backward.emb"].end_s
    assert first_s == pytest.approx(step_s, rel=1e-12)
    # step 1's head waits for the last CPU task of step 0 (the head's cast, deadline order),
    # then the head's load; behind it on H2D the L1 checkpoint (2048 B, 2.048 us, longer than
    # the head's 1.57 us) gates backward L1; then both layer backwards and the embedding's run
    tail = events["s1.m0.backward.emb"].end_s - events["s0.m0.cast.head"].end_s
    assert tail == pytest.approx(HEAD_LOAD_S + 2048 / 1e9
                                 + events["s1.m0.backward.L1"].duration_s
                                 + events["s1.m0.backward.L0"].duration_s
                                 + events["s1.m0.backward.emb"].duration_s, rel=0, abs=ABS_TOL_S)
    assert prediction.bottleneck == "cpu"


if __name__ == "__main__":
    if sys.argv[1:] != ["--regenerate"]:
        sys.exit(f"usage: python {sys.argv[0]} --regenerate  (rewrites {GOLDEN_PATH})")
    regenerate()
    print(f"wrote {GOLDEN_PATH}")
