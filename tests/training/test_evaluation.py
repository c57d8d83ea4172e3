"""Eval against the Hugging Face model itself: the same loss and accuracy from the same weights,
whichever units the layers slide through or stay in, and with packed documents."""

from __future__ import annotations

import pytest
import torch
from helpers import SEQ, VOCAB, PackedDocuments, spec_of, tiny_config
from reference_training import ReferenceTrainer

from layerslide.data.sources import SyntheticTokens
from layerslide.executor.optim import OptimConfig
from layerslide.kernels.linear_cross_entropy import IGNORE_INDEX
from layerslide.planner.build import build_plan
from layerslide.planner.settings import Policy, TrainSpec
from layerslide.training.trainer import EvalSchedule, Trainer

GPU = pytest.param("cuda", marks=pytest.mark.gpu)


def reference_scores(config, master, batches):
    """Mean token loss and argmax accuracy of the HF model (bf16, as trained) on batches."""
    model = ReferenceTrainer(config, master, lr_at=lambda _: 0.0)
    with torch.no_grad():
        for name, param in model.model.named_parameters():
            param.copy_(model.params[name])
        loss, hits, count = 0.0, 0, 0
        for ids, labels, *positions in batches:
            logits = (model._logits_by_document(ids, positions[0]) if positions
                      else model.model(input_ids=ids).logits.float())
            valid = labels != IGNORE_INDEX
            loss += float(torch.nn.functional.cross_entropy(
                logits[valid], labels[valid], reduction="sum"))
            hits += int((logits.argmax(-1)[valid] == labels[valid]).sum())
            count += int(valid.sum())
    return loss / count, hits / count


@pytest.mark.parametrize("device", ["cpu", GPU])
@pytest.mark.parametrize(("family", "tied", "policy", "packed"), [
    ("llama", False, Policy.of(window=1), False),
    ("qwen2", True, Policy.of(gpu_updated_blocks=2, resident_layers=1), False),
    ("llama", False, Policy.of(accumulation="layer_major"), True)])
def test_eval_scores_the_weights_as_hugging_face_does(tmp_path, device, family, tied, policy,
                                                      packed):
    config = tiny_config(family, tied)
    spec = spec_of(config, tmp_path)
    train = TrainSpec(micro_batch=2, seq_len=SEQ, grad_accum=2)
    source = PackedDocuments(seed=9) if packed else SyntheticTokens(VOCAB, SEQ, seed=9)
    held_out = [source.next_batch(2) for _ in range(3)]
    held_out[1][1][0, :5] = IGNORE_INDEX  # unlabelled tokens are not scored
    results = []
    with Trainer(config=config, plan=build_plan(spec, train, policy),
                 optim=OptimConfig(lr=1e-2, warmup_steps=0, decay_steps=4), device=device,
                 segment_steps=4) as trainer:
        trainer.init_random(0)
        logs = trainer.fit(SyntheticTokens(VOCAB, SEQ, seed=1), 4,
                           evals=EvalSchedule(batches=held_out, every_steps=2),
                           on_eval=results.append)
        master = {n: v.clone() for n, v in trainer.state.named_master()}
        again = trainer.evaluate(held_out)
        after = trainer.fit(SyntheticTokens(VOCAB, SEQ, seed=2), 1)  # the units still train
    assert [r.step for r in results] == [2, 4] and len(logs) == 4 and len(after) == 1
    assert results[0].loss != results[1].loss
    loss, accuracy = reference_scores(config, master, held_out)
    assert again.loss == pytest.approx(loss, rel=2e-3)
    assert again.accuracy == pytest.approx(accuracy, abs=2 / again.tokens)
    assert again.tokens == 3 * 2 * SEQ - 5
    assert (again.loss, again.accuracy) == (results[1].loss, results[1].accuracy)
