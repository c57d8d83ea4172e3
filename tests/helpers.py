"""Round-number model and hardware for tests whose expected values are worked out by hand,
random small plans' inputs, and tiny HF configs for the executor's tests."""

import dataclasses

from hypothesis import strategies as st

from layerslide.hwprofiles import (
    GPUSpec,
    HardwareProfile,
    HostSpec,
    InterconnectSpec,
    LinkSpec,
    NetworkSpec,
    StorageSpec,
)
from layerslide.planner import ModelSpec, Policy, TrainSpec
from layerslide.planner.model import model_from_hf_config

GIB = 1024**3


@st.composite
def random_plan_inputs(draw, every_schedule: bool = False):
    """A random small model, training shape and policy (model, train, policy) for tests over
    random plans; every_schedule: the accumulation and the streams' run-ahead drawn too."""
    layers = draw(st.integers(1, 5))
    model = ModelSpec(name="rand", architecture="llama", num_layers=layers, hidden_size=64,
                      intermediate_size=128, num_attention_heads=4, num_key_value_heads=2,
                      head_dim=16, vocab_size=256, tie_word_embeddings=draw(st.booleans()),
                      max_position_embeddings=4096)
    train = TrainSpec(micro_batch=draw(st.integers(1, 3)), seq_len=16,
                      grad_accum=draw(st.integers(1, 3)),
                      max_grad_norm=draw(st.sampled_from([None, 1.0])))
    window = draw(st.integers(1, 4))
    cast = draw(st.sampled_from(["cpu_once", "cpu_per_load", "gpu"]))
    schedule = {"accumulation": draw(st.sampled_from(["step_major", "layer_major"])),
                "stream_run_ahead": draw(st.sampled_from([0, 1, 3]))} if every_schedule else {}
    policy = Policy.of(
        window=window, grad_buffers=draw(st.integers(1, 3)),
        prefetch_depth=draw(st.integers(1, window)),
        activations=draw(st.sampled_from(["gpu", "host", "nvme"])),
        moments_on_nvme=draw(st.sampled_from([0.0, 0.5, 1.0])),
        master_on_nvme=draw(st.sampled_from([0.0, 1.0])) if cast == "cpu_once" else 0.0,
        resident_layers=draw(st.integers(0, layers)),
        gpu_updated_blocks=draw(st.integers(0, layers + 2)),
        optimizer_order=draw(st.sampled_from(["arrival", "deadline"])), cast=cast,
        cast_worker=draw(st.booleans()), nvme_prefetch=draw(st.integers(1, 3)),
        host_grad_buffers=draw(st.sampled_from([None, 1, 3])), **schedule)
    return model, train, policy


def make_tiny_model(num_layers: int = 2) -> ModelSpec:
    """A Llama-shaped toy: hidden 64, FFN 128, 4 heads of 16, 2 KV heads, vocab 256, untied."""
    return ModelSpec(name=f"tiny-{num_layers}l", architecture="llama", num_layers=num_layers,
                     hidden_size=64, intermediate_size=128, num_attention_heads=4,
                     num_key_value_heads=2, head_dim=16, vocab_size=256,
                     tie_word_embeddings=False, max_position_embeddings=4096)


def make_round_profile(**host_overrides) -> HardwareProfile:
    """GPU 1e12 FLOP/s at full efficiency, 1e9 B/s copies each way, no contention limits."""
    host = {"cores": 8, "ram_bytes": 64 * GIB, "memory_bytes_per_s": 1e15,
            "adamw_params_per_s": 1e6, "adamw_bytes_per_param": 28.0, "cast_bytes_per_s": 1e7,
            "dma_share": 1.0}
    host.update(host_overrides)
    return HardwareProfile(
        name="round", description="round numbers for hand-checked tests",
        gpu=GPUSpec(name="toy", memory_bytes=16 * GIB, bf16_flops_per_s=1e12,
                    hbm_bytes_per_s=1e15, matmul_efficiency=((1, 1.0),),
                    attention_forward_efficiency=((1, 1.0),),
                    attention_backward_efficiency=((1, 1.0),), kernel_launch_s=0.0),
        link=LinkSpec(h2d_bytes_per_s=1e9, d2h_bytes_per_s=1e9, duplex_bytes_per_s=2e9,
                      h2d_pageable_bytes_per_s=1e9),
        host=HostSpec(**host),
        storage=StorageSpec(read_bytes_per_s=1e9, write_bytes_per_s=1e9,
                            capacity_bytes=100 * GIB),
        sources={},
    )


ROUND_NVLINK = InterconnectSpec(kind="nvlink", bandwidth_bytes_per_s=100e9, latency_s=1e-5)
ROUND_NETWORK = NetworkSpec(bandwidth_bytes_per_s=50e9, latency_s=2e-5, nics=4)


def make_round_host(gpus: int = 4, interconnect: InterconnectSpec | None = ROUND_NVLINK,
                    network: NetworkSpec | None = ROUND_NETWORK, gpus_per_link: int = 1,
                    **host_overrides) -> HardwareProfile:
    """The round profile as a host of `gpus` GPUs: NVLink at 100e9 B/s one way and 10 us a
    ring step unless told, four 50e9 B/s network cards at 20 us."""
    one = make_round_profile(**host_overrides)
    host = dataclasses.replace(one.host, gpus=gpus, gpus_per_link=gpus_per_link)
    return dataclasses.replace(one, name=f"round-x{gpus}", host=host, interconnect=interconnect,
                               network=network)


# tiny HF models for the executor's tests
VOCAB, SEQ = 256, 32


def tiny_config(family: str, tied: bool = False):
    """A 3-layer HF config of the family (llama, qwen2, qwen3) with a 256-token vocab."""
    from transformers import LlamaConfig, Qwen2Config, Qwen3Config

    common = {"hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 3,
              "num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": VOCAB,
              "max_position_embeddings": 128, "tie_word_embeddings": tied}
    if family == "qwen3":
        return Qwen3Config(head_dim=16, **common)
    return {"llama": LlamaConfig, "qwen2": Qwen2Config}[family](**common)


def spec_of(config, tmp_path):
    """The planner's ModelSpec of an HF config, through a config.json as users give it."""
    config.save_pretrained(tmp_path / "cfg")
    return model_from_hf_config(tmp_path / "cfg")


class PackedDocuments:
    """Rows of random documents packed end to end (lengths 1-13 tokens), with position_ids
    that restart at each document, as DatasetTokens makes them with document masks."""

    def __init__(self, seed: int):
        import torch

        self.generator = torch.Generator().manual_seed(seed)

    vocab_size = VOCAB

    def next_batch(self, micro_batch):
        import torch

        ids = torch.randint(0, VOCAB, (micro_batch, SEQ), generator=self.generator)
        labels = torch.randint(0, VOCAB, (micro_batch, SEQ), generator=self.generator)
        positions = torch.empty(micro_batch, SEQ, dtype=torch.int64)
        for row in positions:
            start = 0
            while start < SEQ:
                length = int(torch.randint(1, 14, (1,), generator=self.generator))
                row[start:start + length] = torch.arange(min(length, SEQ - start))
                start += length
        return ids, labels, positions

    def state_dict(self):
        return {}

    def load_state_dict(self, state):
        pass


# a tiny Llama folder with a word-level tokenizer, and text data in its words (train end to end)
WORDS = ["the", "cat", "sat", "on", "a", "mat", "and", "dog", "ran", "to", "park", "with", "ball",
         "red", "blue"]


def tiny_model_folder(path):
    """An HF folder (config.json, safetensors, tokenizer) of a 2-layer Llama, vocab 32."""
    import torch
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    vocab = {w: i for i, w in enumerate(["[UNK]", "</s>", *WORDS])}
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="</s>",
                            unk_token="[UNK]").save_pretrained(path)
    config = LlamaConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, vocab_size=32,
                         max_position_embeddings=64)
    torch.manual_seed(0)
    LlamaForCausalLM(config).save_pretrained(path)
    return path


def tiny_text_data(path):
    """40 JSONL text records of six of WORDS each."""
    import json

    lines = [json.dumps({"text": " ".join(WORDS[i % 7:i % 7 + 6])}) for i in range(40)]
    path.write_text("\n".join(lines) + "\n")
    return path
# a Hugging Face home whose caches hold what a test puts there, as loads from the Hub leave them
COMMIT = "0123456789abcdef0123456789abcdef01234567"


def cache_hub_model(home, repo_id: str, folder) -> None:
    """Put a model folder into huggingface_hub's cache under HF_HOME `home`, as a download of
    the Hub model `repo_id` leaves it (refs/main naming the snapshot of its commit)."""
    import shutil

    root = home / "hub" / f"models--{repo_id.replace('/', '--')}"
    (root / "refs").mkdir(parents=True)
    (root / "refs" / "main").write_text(COMMIT)
    shutil.copytree(folder, root / "snapshots" / COMMIT)


def cache_hub_dataset(home, name: str, splits: dict) -> None:
    """Put records (by split) into datasets' cache under HF_HOME `home`, as loading the Hub
    dataset `name` (owner/name, lower case) leaves it: built by datasets' own JSON builder,
    placed at owner___name/default/0.0.0/HASH."""
    import json
    import shutil
    import tempfile
    from pathlib import Path

    from datasets.packaged_modules.json.json import Json

    with tempfile.TemporaryDirectory() as tmp:
        files = {}
        for split, records in splits.items():
            files[split] = str(Path(tmp) / f"{split}.jsonl")
            Path(files[split]).write_text("".join(json.dumps(r) + "\n" for r in records))
        builder = Json(cache_dir=str(Path(tmp) / "build"), dataset_name=name.split("/")[-1],
                       config_name="default", data_files=files, hash=COMMIT[:16])
        builder.download_and_prepare()
        target = home / "datasets" / name.replace("/", "___") / "default" / "0.0.0"
        target.mkdir(parents=True)
        shutil.move(builder.cache_dir, target / COMMIT[:16])


def level_bounds(levels, train, policy):
    """A candidate taken through tune's levels (tuner.levels): the bound each gave, and the
    candidate at its end (None where its sweep found it infeasible)."""
    from layerslide.tuner.stages import STAGES

    bounds = [levels.class_tokens_per_s(train, policy), levels.short_bound(train, policy)[0]]
    candidate, later = levels.sweep(train, policy)
    if not candidate.feasible:
        return bounds, None
    for stage in STAGES:
        if later is None:
            break
        bounds.append(later)
        candidate, later = levels.stage(candidate, stage)
    return bounds, candidate
