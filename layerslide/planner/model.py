"""Model shapes of decoder-only LLMs (Llama, Qwen2/2.5, Qwen3, Mistral): sizes, FLOPs, presets,
and loading from a Hugging Face config.json. Imports neither torch nor transformers."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, fields, replace
from pathlib import Path

from layerslide import hub

SUPPORTED_ARCHITECTURES = ("llama", "qwen2", "qwen3", "mistral")

# HF `architectures` entries we accept, mapped to model_type (used when model_type is absent).
_HF_ARCHITECTURES = {
    "LlamaForCausalLM": "llama",
    "Qwen2ForCausalLM": "qwen2",
    "Qwen3ForCausalLM": "qwen3",
    "MistralForCausalLM": "mistral",
}

BF16_BYTES = 2
FP32_BYTES = 4

_POSITIVE_INT_FIELDS = (
    "num_layers",
    "hidden_size",
    "intermediate_size",
    "num_attention_heads",
    "num_key_value_heads",
    "head_dim",
    "vocab_size",
    "max_position_embeddings",
)


@dataclass(frozen=True, kw_only=True)
class ModelSpec:
    """Shapes of a pre-norm decoder-only transformer with GQA attention and a SwiGLU FFN."""

    name: str
    architecture: str  # one of SUPPORTED_ARCHITECTURES
    num_layers: int
    hidden_size: int
    intermediate_size: int  # FFN width (SwiGLU: gate, up, down)
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int  # may differ from hidden_size / num_attention_heads (Mistral-Nemo, Qwen3)
    vocab_size: int
    tie_word_embeddings: bool
    attention_bias: bool = False  # q/k/v biases (Qwen2/2.5); o_proj never has one here
    qk_norm: bool = False  # per-head RMSNorm on q and k (Qwen3)
    max_position_embeddings: int = 131072

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not self.name:
            raise ValueError("ModelSpec.name must be a non-empty string")
        if self.architecture not in SUPPORTED_ARCHITECTURES:
            raise ValueError(
                f"ModelSpec.architecture={self.architecture!r} is not supported; "
                f"use one of {', '.join(SUPPORTED_ARCHITECTURES)}"
            )
        for name in _POSITIVE_INT_FIELDS:
            value = getattr(self, name)
            # bool is an int subclass; True as a layer count is a bug, not a shape.
            if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
                raise ValueError(f"ModelSpec.{name}={value!r} must be a positive int ({self.name})")
        for name in ("tie_word_embeddings", "attention_bias", "qk_norm"):
            if not isinstance(getattr(self, name), bool):
                raise ValueError(  # noqa: TRY004 (house style: ValueError at the boundary)
                    f"ModelSpec.{name}={getattr(self, name)!r} must be True or False ({self.name})"
                )
        if self.num_attention_heads % self.num_key_value_heads != 0:
            raise ValueError(
                f"ModelSpec.num_attention_heads={self.num_attention_heads} is not divisible by "
                f"num_key_value_heads={self.num_key_value_heads} ({self.name}); "
                "GQA needs each KV head shared by a whole number of query heads: change one of them"
            )

    # ---- widths -------------------------------------------------------------------------
    @property
    def q_dim(self) -> int:
        """Width of the concatenated query heads (= o_proj input width)."""
        return self.num_attention_heads * self.head_dim

    @property
    def kv_dim(self) -> int:
        """Width of the concatenated key (or value) heads."""
        return self.num_key_value_heads * self.head_dim

    # ---- parameter counts ---------------------------------------------------------------
    @property
    def layer_matmul_params(self) -> int:
        """Weights of one layer's projections (q, k, v, o, gate, up, down): no biases or norms."""
        h, f = self.hidden_size, self.intermediate_size
        attention = h * self.q_dim + 2 * h * self.kv_dim + self.q_dim * h
        ffn = 3 * h * f
        return attention + ffn

    @property
    def layer_params(self) -> int:
        """Parameters of one decoder layer: projections, q/k/v biases, RMSNorm weights."""
        biases = self.q_dim + 2 * self.kv_dim if self.attention_bias else 0
        norms = 2 * self.hidden_size  # input_layernorm, post_attention_layernorm
        if self.qk_norm:
            norms += 2 * self.head_dim  # q_norm and k_norm weights are shared across heads
        return self.layer_matmul_params + biases + norms

    @property
    def embedding_params(self) -> int:
        """Parameters of the input token embedding."""
        return self.vocab_size * self.hidden_size

    @property
    def head_params(self) -> int:
        """Parameters of the LM head; 0 when tied to the embedding."""
        return 0 if self.tie_word_embeddings else self.vocab_size * self.hidden_size

    @property
    def final_norm_params(self) -> int:
        """Parameters of the final RMSNorm."""
        return self.hidden_size

    @property
    def total_params(self) -> int:
        """All parameters, counting tied embedding/head weights once."""
        return (
            self.num_layers * self.layer_params
            + self.embedding_params
            + self.head_params
            + self.final_norm_params
        )

    def block_params(self, block: int) -> int:
        """Parameters of a block: the embedding (-1), a decoder layer (0..L-1) or the head (L:
        the final norm, and the LM head when it is not tied)."""
        if block < 0:
            return self.embedding_params
        if block >= self.num_layers:
            return self.head_params + self.final_norm_params
        return self.layer_params

    def layer_param_bytes(self, dtype_bytes: int) -> int:
        """Bytes of one layer's parameters stored at dtype_bytes per element."""
        if dtype_bytes <= 0:
            raise ValueError(f"dtype_bytes={dtype_bytes} must be positive (e.g. 2 for bf16)")
        return self.layer_params * dtype_bytes

    # ---- FLOPs --------------------------------------------------------------------------
    def layer_forward_flops_per_token(self, seq_len: int) -> float:
        """Forward FLOPs of one layer per token: matmuls plus full (non-causal) attention scores."""
        if seq_len <= 0:
            raise ValueError(f"seq_len={seq_len} must be positive")
        # QK^T and softmax(.)V are 2*s*d each per head; counted without the causal halving so it
        # matches the usual 12*L*s*h training term (what MFU numbers are quoted against).
        attention_flops = 4 * seq_len * self.q_dim
        # Norms, biases, RoPE, SiLU and residual adds are O(h) and left out.
        return float(2 * self.layer_matmul_params + attention_flops)

    @property
    def head_forward_flops_per_token(self) -> float:
        """Forward FLOPs of the LM head matmul per token (embedding lookup is free)."""
        return float(2 * self.hidden_size * self.vocab_size)

    def training_flops_per_token(self, seq_len: int) -> float:
        """Model FLOPs per token of forward + backward (backward = 2x forward), no recompute."""
        forward = (
            self.num_layers * self.layer_forward_flops_per_token(seq_len)
            + self.head_forward_flops_per_token
        )
        return 3.0 * forward

    # ---- activation memory --------------------------------------------------------------
    @property
    def layer_checkpoint_bytes_per_token(self) -> int:
        """Bytes per token that per-layer checkpointing keeps for one layer: its bf16 input."""
        return BF16_BYTES * self.hidden_size

    @property
    def layer_activation_bytes_per_token(self) -> int:
        """Bytes per token saved for backward by ONE recomputed layer (SDPA/flash, no s^2 term);
        excludes the layer input, which layer_checkpoint_bytes_per_token already counts."""
        # What autograd keeps for a Llama/Qwen layer x -> out, per token (bf16 unless noted):
        #   input_layernorm:          input x is the checkpoint (not counted); output n1   h
        #                             rstd (fp32, one per token)                          4 B
        #   q, k, v (after RoPE; RoPE backward needs only cos/sin)   q_dim + 2*kv_dim
        #   Qwen3 q_norm/k_norm inputs (outputs go through RoPE)   q_dim + kv_dim
        #                             + rstd fp32 per head: 4*(a + g) B
        #   SDPA/flash: its output                                  q_dim
        #               logsumexp (fp32, one per query head)      4*a B
        #   o_proj input (transpose(1,2).reshape of the output copies)  q_dim
        #   mid residual r = x + o_proj(.) = post_attention_layernorm input     h
        #                             rstd fp32                                           4 B
        #   post_attention_layernorm output n2 (gate/up input)                  h
        #   gate g, up u (SiLU backward needs g; the product needs u and act(g)) 2*f
        #   act(g), and act(g)*u (down_proj input)                                 2*f
        # The layer output is the next layer's checkpoint and is not counted here. Gradient
        # buffers are transient, and fused kernels (Liger) would save less; this is the vanilla
        # HF upper estimate. Attention masks/positions are per sequence, not per token.
        h, f = self.hidden_size, self.intermediate_size
        a, g = self.num_attention_heads, self.num_key_value_heads
        bf16_elements = 3 * h + 3 * self.q_dim + 2 * self.kv_dim + 4 * f
        fp32_elements = 2 + a  # two norm rstd values, one logsumexp per query head
        if self.qk_norm:
            bf16_elements += self.q_dim + self.kv_dim
            fp32_elements += a + g
        return BF16_BYTES * bf16_elements + FP32_BYTES * fp32_elements

    # ---- serialization ------------------------------------------------------------------
    def to_dict(self) -> dict:
        """Plain JSON-able dict of the fields (derived sizes not included)."""
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> ModelSpec:
        """Inverse of to_dict; unknown keys are an error rather than silently dropped."""
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(d) - known)
        if unknown:
            raise ValueError(
                f"unknown ModelSpec keys {unknown}; expected a subset of {sorted(known)}"
            )
        return cls(**d)


# Values from the official Hugging Face config.json files (meta-llama, Qwen, mistralai).
# A compact table reads better than one field per line.
# fmt: off
PRESETS: dict[str, ModelSpec] = {
    spec.name: spec
    for spec in (
        ModelSpec(
            name="llama-3.2-1b", architecture="llama", num_layers=16, hidden_size=2048,
            intermediate_size=8192, num_attention_heads=32, num_key_value_heads=8, head_dim=64,
            vocab_size=128256, tie_word_embeddings=True, max_position_embeddings=131072,
        ),
        ModelSpec(
            name="llama-3.2-3b", architecture="llama", num_layers=28, hidden_size=3072,
            intermediate_size=8192, num_attention_heads=24, num_key_value_heads=8, head_dim=128,
            vocab_size=128256, tie_word_embeddings=True, max_position_embeddings=131072,
        ),
        ModelSpec(
            name="llama-3.1-8b", architecture="llama", num_layers=32, hidden_size=4096,
            intermediate_size=14336, num_attention_heads=32, num_key_value_heads=8, head_dim=128,
            vocab_size=128256, tie_word_embeddings=False, max_position_embeddings=131072,
        ),
        ModelSpec(
            name="llama-3.1-70b", architecture="llama", num_layers=80, hidden_size=8192,
            intermediate_size=28672, num_attention_heads=64, num_key_value_heads=8, head_dim=128,
            vocab_size=128256, tie_word_embeddings=False, max_position_embeddings=131072,
        ),
        ModelSpec(
            name="qwen3-4b", architecture="qwen3", num_layers=36, hidden_size=2560,
            intermediate_size=9728, num_attention_heads=32, num_key_value_heads=8, head_dim=128,
            vocab_size=151936, tie_word_embeddings=True, qk_norm=True,
            max_position_embeddings=40960,
        ),
        ModelSpec(
            name="qwen3-8b", architecture="qwen3", num_layers=36, hidden_size=4096,
            intermediate_size=12288, num_attention_heads=32, num_key_value_heads=8, head_dim=128,
            vocab_size=151936, tie_word_embeddings=False, qk_norm=True,
            max_position_embeddings=40960,
        ),
        ModelSpec(
            name="qwen3-14b", architecture="qwen3", num_layers=40, hidden_size=5120,
            intermediate_size=17408, num_attention_heads=40, num_key_value_heads=8, head_dim=128,
            vocab_size=151936, tie_word_embeddings=False, qk_norm=True,
            max_position_embeddings=40960,
        ),
        ModelSpec(
            name="qwen3-32b", architecture="qwen3", num_layers=64, hidden_size=5120,
            intermediate_size=25600, num_attention_heads=64, num_key_value_heads=8, head_dim=128,
            vocab_size=151936, tie_word_embeddings=False, qk_norm=True,
            max_position_embeddings=40960,
        ),
        ModelSpec(
            name="qwen2.5-72b", architecture="qwen2", num_layers=80, hidden_size=8192,
            intermediate_size=29568, num_attention_heads=64, num_key_value_heads=8, head_dim=128,
            vocab_size=152064, tie_word_embeddings=False, attention_bias=True,
            max_position_embeddings=32768,
        ),
        ModelSpec(
            name="mistral-7b", architecture="mistral", num_layers=32, hidden_size=4096,
            intermediate_size=14336, num_attention_heads=32, num_key_value_heads=8, head_dim=128,
            vocab_size=32768, tie_word_embeddings=False, max_position_embeddings=32768,
        ),  # v0.3 (vocab 32768; v0.1/v0.2 had 32000)
        ModelSpec(
            name="mistral-nemo-12b", architecture="mistral", num_layers=40, hidden_size=5120,
            intermediate_size=14336, num_attention_heads=32, num_key_value_heads=8, head_dim=128,
            vocab_size=131072, tie_word_embeddings=False, max_position_embeddings=1024000,
        ),
        ModelSpec(
            name="mistral-large-123b", architecture="mistral", num_layers=88, hidden_size=12288,
            intermediate_size=28672, num_attention_heads=96, num_key_value_heads=8, head_dim=128,
            vocab_size=32768, tie_word_embeddings=False, max_position_embeddings=131072,
        ),  # Mistral-Large-Instruct-2407
    )
}
# fmt: on


def preset_names() -> list[str]:
    """Names of the built-in model presets, in definition order."""
    return list(PRESETS)


def _config_file(path: str | Path) -> Path:
    p = Path(path)
    if p.is_dir():
        p = p / "config.json"
    if not p.is_file():
        raise ValueError(
            f"no Hugging Face config at {p}; pass a config.json or a folder holding one"
        )
    return p


def model_from_hf_config(path: str | Path) -> ModelSpec:
    """Read a Hugging Face config.json (file or its folder) into a ModelSpec; reads no weights."""
    config_path = _config_file(path)
    try:
        config = json.loads(config_path.read_text())
    except json.JSONDecodeError as exc:
        raise ValueError(f"{config_path} is not valid JSON: {exc}") from exc
    if not isinstance(config, dict):
        raise ValueError(f"{config_path} must hold a JSON object")  # noqa: TRY004

    model_type = config.get("model_type")
    if model_type is None:
        # Some exported configs drop model_type but keep architectures.
        for arch in config.get("architectures") or ():
            model_type = _HF_ARCHITECTURES.get(arch)
            if model_type:
                break
    if model_type not in SUPPORTED_ARCHITECTURES:
        supported = ", ".join(f"{t} ({a})" for a, t in _HF_ARCHITECTURES.items())
        raise ValueError(
            f"{config_path}: model_type {model_type!r} "
            f"(architectures {config.get('architectures')}) is not supported; "
            f"supported: {supported}"
        )

    def required(key: str) -> int:
        if config.get(key) is None:
            raise ValueError(f"{config_path}: missing required key {key!r} for {model_type}")
        return config[key]

    if config.get("mlp_bias"):
        raise ValueError(f"{config_path}: mlp_bias=true is not modelled; only bias-free FFNs are")

    hidden_size = required("hidden_size")
    num_heads = required("num_attention_heads")
    # HF defaults: missing num_key_value_heads means MHA; missing/null head_dim means h / a.
    num_kv_heads = config.get("num_key_value_heads") or num_heads
    head_dim = config.get("head_dim")
    if head_dim is None:
        if hidden_size % num_heads:
            raise ValueError(
                f"{config_path}: no head_dim and hidden_size={hidden_size} is not divisible by "
                f"num_attention_heads={num_heads}; add head_dim to the config"
            )
        head_dim = hidden_size // num_heads

    # Qwen2 always has q/k/v biases (no config key); Llama/Qwen3 read attention_bias.
    attention_bias = True if model_type == "qwen2" else bool(config.get("attention_bias", False))
    # The folder name (e.g. "Llama-3.2-1B") beats _name_or_path, often a machine-local path.
    name = config_path.parent.name or Path(str(config.get("_name_or_path") or "")).name
    kwargs = {
        "name": name or model_type,
        "architecture": model_type,
        "num_layers": required("num_hidden_layers"),
        "hidden_size": hidden_size,
        "intermediate_size": required("intermediate_size"),
        "num_attention_heads": num_heads,
        "num_key_value_heads": num_kv_heads,
        "head_dim": head_dim,
        "vocab_size": required("vocab_size"),
        "tie_word_embeddings": bool(config.get("tie_word_embeddings", False)),
        "attention_bias": attention_bias,
        "qk_norm": model_type == "qwen3",
    }
    if config.get("max_position_embeddings") is not None:
        kwargs["max_position_embeddings"] = config["max_position_embeddings"]
    try:
        return ModelSpec(**kwargs)
    except ValueError as exc:
        raise ValueError(f"{config_path}: {exc}") from exc


def resolve_model(name_or_path: str | Path) -> ModelSpec:
    """A preset by name (case-insensitive), a Hugging Face config.json / folder path, or a
    Hugging Face Hub model id (owner/name: its config.json, from huggingface_hub's cache or
    the Hub)."""
    key = str(name_or_path).strip().lower()
    if key in PRESETS:
        return PRESETS[key]
    path = Path(name_or_path).expanduser()
    if path.exists():
        return model_from_hf_config(path)
    if hub.is_model_id(name_or_path):
        folder = hub.model_folder(str(name_or_path), hub.CONFIG_FILES)
        return replace(model_from_hf_config(folder), name=hub.model_name(str(name_or_path)))
    raise ValueError(
        f"unknown model {str(name_or_path)!r}: not a preset, no such path, nor a Hugging Face "
        f"Hub id (owner/name); presets: {', '.join(preset_names())}; or pass a config.json / "
        "model folder"
    )
