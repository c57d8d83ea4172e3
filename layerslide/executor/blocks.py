"""A Hugging Face decoder-only LM split into the plan's blocks, each a flat parameter buffer.

Block -1 is the token embedding, 0..L-1 the decoder layers, L the final norm (+ the LM head when
it is not tied to the embedding). A block's parameters live in one flat buffer, matrices first
(weight decay applies to them) then norms and biases, so that one copy moves a block and one
fused AdamW call updates it. Modules are HF's own (attention through SDPA); their parameters are
pointed at views of a flat buffer, so loading a block into a GPU cache unit is a single copy.
"""

from __future__ import annotations

import importlib
import math
from collections.abc import Iterator
from dataclasses import dataclass

import torch
from torch import nn
from transformers import AutoConfig, PretrainedConfig
from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

from layerslide.planner.model import ModelSpec

EMBEDDING = -1
SUPPORTED_MODEL_TYPES = ("llama", "qwen2", "qwen3", "mistral")
# Defaults for presets built without a config.json: the families' published values.
_PRESET_ROPE_THETA = {"llama": 500000.0, "qwen2": 1000000.0, "qwen3": 1000000.0,
                      "mistral": 1000000.0}
_PRESET_RMS_EPS = {"llama": 1e-5, "qwen2": 1e-6, "qwen3": 1e-6, "mistral": 1e-5}
INIT_STD = 0.02  # HF's initializer_range default for these families


@dataclass(frozen=True, kw_only=True)
class ParamSlot:
    """One HF parameter inside its block's flat buffer."""

    name: str  # the state-dict name, e.g. model.layers.3.mlp.up_proj.weight
    local_name: str  # the name inside the block's module, e.g. mlp.up_proj.weight
    shape: tuple[int, ...]
    offset: int
    decay: bool  # matrices get weight decay; norms and biases do not

    @property
    def numel(self) -> int:
        return math.prod(self.shape)


def hf_config_from_spec(spec: ModelSpec) -> PretrainedConfig:
    """An HF config with the preset's shapes (rope and norm epsilon: the family's defaults)."""
    kwargs = {
        "hidden_size": spec.hidden_size, "intermediate_size": spec.intermediate_size,
        "num_hidden_layers": spec.num_layers, "num_attention_heads": spec.num_attention_heads,
        "num_key_value_heads": spec.num_key_value_heads, "head_dim": spec.head_dim,
        "vocab_size": spec.vocab_size, "tie_word_embeddings": spec.tie_word_embeddings,
        "max_position_embeddings": spec.max_position_embeddings,
        "rope_theta": _PRESET_ROPE_THETA[spec.architecture],
        "rms_norm_eps": _PRESET_RMS_EPS[spec.architecture],
    }
    if spec.architecture == "llama":
        kwargs["attention_bias"] = spec.attention_bias
    return AutoConfig.for_model(spec.architecture, **kwargs)


def _family_classes(config: PretrainedConfig) -> tuple[type, type, type]:
    """The family's decoder layer, RMSNorm and rotary embedding classes (e.g. LlamaDecoderLayer)."""
    module = importlib.import_module(
        f"transformers.models.{config.model_type}.modeling_{config.model_type}")
    prefix = MODEL_FOR_CAUSAL_LM_MAPPING_NAMES[config.model_type].removesuffix("ForCausalLM")
    return tuple(getattr(module, f"{prefix}{part}")
                 for part in ("DecoderLayer", "RMSNorm", "RotaryEmbedding"))


class ModelBlocks:
    """The block structure of one HF causal LM: names, flat layouts, and module factories."""

    def __init__(self, config: PretrainedConfig):
        if config.model_type not in SUPPORTED_MODEL_TYPES:
            raise ValueError(f"model_type {config.model_type!r} is not supported; use one of "
                             f"{', '.join(SUPPORTED_MODEL_TYPES)}")
        config._attn_implementation = "sdpa"  # HF reads its attention kernel here
        self.config = config
        self.num_layers = config.num_hidden_layers
        self.tied = bool(config.tie_word_embeddings)
        self._layer_class, self._norm_class, self._rotary_class = _family_classes(config)
        with torch.device("meta"):
            layer = self.make_layer(0)
        layer_local = [(n, tuple(p.shape)) for n, p in layer.named_parameters()]
        h, vocab = config.hidden_size, config.vocab_size
        self.layouts: dict[int, tuple[ParamSlot, ...]] = {
            EMBEDDING: self._layout([("model.embed_tokens.weight", "weight", (vocab, h))]),
        }
        for i in range(self.num_layers):
            self.layouts[i] = self._layout([(f"model.layers.{i}.{n}", n, s) for n, s in layer_local])
        head = [("model.norm.weight", "norm.weight", (h,))]
        if not self.tied:
            head.insert(0, ("lm_head.weight", "lm_head.weight", (vocab, h)))
        self.layouts[self.num_layers] = self._layout(head)

    @staticmethod
    def _layout(entries: list[tuple[str, str, tuple[int, ...]]]) -> tuple[ParamSlot, ...]:
        # matrices first, so the decayed parameters are one contiguous view
        ordered = sorted(entries, key=lambda e: len(e[2]) < 2)
        slots, offset = [], 0
        for name, local, shape in ordered:
            slots.append(ParamSlot(name=name, local_name=local, shape=shape, offset=offset,
                                   decay=len(shape) >= 2))
            offset += math.prod(shape)
        return tuple(slots)

    @property
    def blocks(self) -> list[int]:
        return [EMBEDDING, *range(self.num_layers), self.num_layers]

    def numel(self, block: int) -> int:
        last = self.layouts[block][-1]
        return last.offset + last.numel

    def decay_numel(self, block: int) -> int:
        """Parameters at the front of the block's flat buffer that get weight decay."""
        return sum(s.numel for s in self.layouts[block] if s.decay)

    def expected_tensors(self) -> dict[str, tuple[int, ...]]:
        """State-dict names and shapes a checkpoint of this model must hold."""
        return {s.name: s.shape for b in self.blocks for s in self.layouts[b]}

    # --- modules -------------------------------------------------------------------------------
    def make_layer(self, layer_idx: int) -> nn.Module:
        """A decoder layer on the current default device (its weights are bound later)."""
        return self._layer_class(self.config, layer_idx)

    def make_norm(self) -> nn.Module:
        return self._norm_class(self.config.hidden_size, eps=self.config.rms_norm_eps)

    def make_rotary(self, device: torch.device) -> nn.Module:
        with torch.device(device):  # the device argument is gone in newer transformers
            return self._rotary_class(config=self.config)

    def bind(self, module: nn.Module, block: int, flat: torch.Tensor) -> None:
        """Make the module's parameters (named as in the block's layout) views of `flat`, so that
        whatever is copied into `flat` is what the module computes with."""
        owned = dict(module.named_parameters())
        for slot in self.layouts[block]:
            if slot.local_name not in owned:
                continue  # e.g. the tied LM head: the head module has only the norm
            path, _, attr = slot.local_name.rpartition(".")
            owner = module.get_submodule(path) if path else module
            view = flat[slot.offset:slot.offset + slot.numel].view(slot.shape)
            owner._parameters[attr] = nn.Parameter(view)

    def views(self, block: int, flat: torch.Tensor) -> Iterator[tuple[ParamSlot, torch.Tensor]]:
        for slot in self.layouts[block]:
            yield slot, flat[slot.offset:slot.offset + slot.numel].view(slot.shape)

    # --- initial weights -----------------------------------------------------------------------
    def init_block(self, block: int, seed: int, out: torch.Tensor | None = None) -> torch.Tensor:
        """Random fp32 weights of one block (normal(0, 0.02) matrices, unit norms, zero biases),
        written into `out` if given; each block draws from its own generator, so the result does
        not depend on the order (or the threads) blocks are drawn in."""
        flat = torch.empty(self.numel(block), dtype=torch.float32) if out is None else out
        if flat.numel() != self.numel(block) or flat.dtype != torch.float32:
            raise ValueError(f"block {block}: out must be {self.numel(block)} fp32 elements")
        gen = torch.Generator().manual_seed(seed * 1_000_003 + block + 1)
        for slot, view in self.views(block, flat):
            if slot.decay:
                view.normal_(0.0, INIT_STD, generator=gen)
            elif slot.local_name.endswith("bias"):
                view.zero_()
            else:
                view.fill_(1.0)
        return flat


def check_supported(config: PretrainedConfig, seq_len: int) -> None:
    """Refuse configs the executor does not reproduce: attention dropout (the backward
    recomputes each layer's forward, which must come out the same) and sliding windows."""
    if getattr(config, "attention_dropout", 0.0):
        raise ValueError(f"attention_dropout={config.attention_dropout}: the backward recomputes "
                         "each layer's forward and needs it deterministic; set it to 0.0 in "
                         "config.json")
    window = getattr(config, "sliding_window", None)
    layer_types = getattr(config, "layer_types", None) or ()
    sliding = getattr(config, "use_sliding_window", window is not None)
    uses_sliding = sliding and window is not None and (
        not layer_types or "sliding_attention" in layer_types)
    if uses_sliding and seq_len > window:
        raise ValueError(f"seq_len={seq_len} exceeds the model's sliding_window={window}: the "
                         "executor runs full causal attention; use seq_len <= sliding_window")
