"""One memory ledger: what the executor allocates equals the plan's static buffers, buffer by
buffer and tier by tier, for a set of policies (on the CPU device: the same tensors, unpinned)."""

from __future__ import annotations

import pytest
from helpers import SEQ, VOCAB, spec_of, tiny_config

from layerslide.data.sources import SyntheticTokens
from layerslide.executor.optim import OptimConfig
from layerslide.planner.build import build_plan
from layerslide.planner.settings import Policy, TrainSpec
from layerslide.training.trainer import Trainer

CASES = [
    ("default", TrainSpec(micro_batch=2, seq_len=SEQ), Policy.of()),
    ("window-1-resident", TrainSpec(micro_batch=1, seq_len=SEQ),
     Policy.of(window=1, resident_layers=1)),
    ("cast-gpu", TrainSpec(micro_batch=1, seq_len=SEQ), Policy.of(cast="gpu")),
    ("per-load-pool", TrainSpec(micro_batch=1, seq_len=SEQ),
     Policy.of(cast="cpu_per_load", host_grad_buffers=2)),
    ("per-block-landing", TrainSpec(micro_batch=1, seq_len=SEQ, max_grad_norm=1.0),
     Policy.of(cast="cpu_per_load")),
    ("accumulation", TrainSpec(micro_batch=1, seq_len=SEQ, grad_accum=2),
     Policy.of(activations="gpu")),
    ("layer-major", TrainSpec(micro_batch=1, seq_len=SEQ, grad_accum=3),
     Policy.of(accumulation="layer_major")),
    ("layer-major-per-block-landing", TrainSpec(micro_batch=1, seq_len=SEQ, grad_accum=2),
     Policy.of(accumulation="layer_major", cast="gpu")),
    ("gpu-updated", TrainSpec(micro_batch=1, seq_len=SEQ), Policy.of(gpu_updated_blocks=2)),
    ("nvme", TrainSpec(micro_batch=1, seq_len=SEQ),
     Policy.of(master_on_nvme=0.5, moments_on_nvme=0.75)),
    ("weights-on-nvme", TrainSpec(micro_batch=1, seq_len=SEQ, grad_accum=2),
     Policy.of(accumulation="layer_major", weights_on_nvme=0.6, moments_on_nvme=0.5)),
    ("bf16-moments-gpu-updated", TrainSpec(micro_batch=1, seq_len=SEQ),
     Policy.of(moment_precision="bf16", gpu_updated_blocks=2, moments_on_nvme=0.5)),
    ("int8-moments-nvme", TrainSpec(micro_batch=1, seq_len=SEQ),
     Policy.of(moment_precision="int8", master_on_nvme=0.5, moments_on_nvme=0.75)),
]


@pytest.mark.parametrize(("name", "train", "policy"), CASES, ids=[c[0] for c in CASES])
def test_the_executor_allocates_what_the_plan_says(tmp_path, name, train, policy):
    config = tiny_config("llama", tied=name == "gpu-updated")
    plan = build_plan(spec_of(config, tmp_path), train, policy)
    with Trainer(config=config, plan=plan, optim=OptimConfig(lr=1e-3), device="cpu",
                 nvme_dir=tmp_path / "nvme") as trainer:
        trainer.init_random(0)
        trainer.fit(SyntheticTokens(VOCAB, SEQ, seed=1), 1)  # the checkpoints' arena comes now
        allocated = trainer.allocated_bytes()
    expected = plan.static_buffer_bytes()
    assert allocated == expected
    for tier in ("gpu", "host", "nvme"):
        assert sum(v for k, v in allocated.items() if k.startswith(tier)) == (
            plan.static_bytes(tier) - plan.runtime_bytes(tier))
