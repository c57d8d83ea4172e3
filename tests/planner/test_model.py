"""ModelSpec: hand-counted sizes, FLOPs, presets and Hugging Face config loading."""

import dataclasses
import json

import pytest

from layerslide.planner.model import (
    PRESETS,
    ModelSpec,
    model_from_hf_config,
    preset_names,
    resolve_model,
)

# fmt: off
EXPECTED_PRESETS = [
    "llama-3.2-1b", "llama-3.2-3b", "llama-3.1-8b", "llama-3.1-70b",
    "qwen3-4b", "qwen3-8b", "qwen3-14b", "qwen3-32b", "qwen2.5-72b",
    "mistral-7b", "mistral-nemo-12b", "mistral-large-123b",
]

# A trimmed copy of meta-llama/Llama-3.2-1B's config.json.
LLAMA_3_2_1B_CONFIG = {
    "architectures": ["LlamaForCausalLM"],
    "attention_bias": False,
    "attention_dropout": 0.0,
    "bos_token_id": 128000,
    "eos_token_id": 128001,
    "head_dim": 64,
    "hidden_act": "silu",
    "hidden_size": 2048,
    "initializer_range": 0.02,
    "intermediate_size": 8192,
    "max_position_embeddings": 131072,
    "mlp_bias": False,
    "model_type": "llama",
    "num_attention_heads": 32,
    "num_hidden_layers": 16,
    "num_key_value_heads": 8,
    "pretraining_tp": 1,
    "rms_norm_eps": 1e-05,
    "rope_scaling": {"factor": 32.0, "high_freq_factor": 4.0, "low_freq_factor": 1.0,
                     "original_max_position_embeddings": 8192, "rope_type": "llama3"},
    "rope_theta": 500000.0,
    "tie_word_embeddings": True,
    "torch_dtype": "bfloat16",
    "transformers_version": "4.45.0.dev0",
    "use_cache": True,
    "vocab_size": 128256,
}
# fmt: on

# Qwen/Qwen2.5-0.5B's config.json (no head_dim key, q/k/v biases implied by model_type).
QWEN2_5_0_5B_CONFIG = {
    "architectures": ["Qwen2ForCausalLM"],
    "attention_dropout": 0.0,
    "bos_token_id": 151643,
    "eos_token_id": 151643,
    "hidden_act": "silu",
    "hidden_size": 896,
    "initializer_range": 0.02,
    "intermediate_size": 4864,
    "max_position_embeddings": 32768,
    "max_window_layers": 24,
    "model_type": "qwen2",
    "num_attention_heads": 14,
    "num_hidden_layers": 24,
    "num_key_value_heads": 2,
    "rms_norm_eps": 1e-06,
    "rope_theta": 1000000.0,
    "sliding_window": 32768,
    "tie_word_embeddings": True,
    "torch_dtype": "bfloat16",
    "use_cache": True,
    "use_sliding_window": False,
    "vocab_size": 151936,
}


def _write_config(folder, config):
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "config.json"
    path.write_text(json.dumps(config))
    return path


# ---- parameter counts (hand arithmetic in comments; official counts where published) ----


def test_llama_3_1_8b_layer_params_by_hand():
    # q 4096*4096 = 16,777,216; k, v 4096*1024 = 4,194,304 each; o 16,777,216
    #   -> attention 41,943,040
    # gate, up, down 3*4096*14336 = 176,160,768; two RMSNorms 2*4096 = 8,192
    # layer = 41,943,040 + 176,160,768 + 8,192 = 218,112,000
    spec = PRESETS["llama-3.1-8b"]
    assert spec.layer_params == 218_112_000
    assert spec.layer_param_bytes(2) == 436_224_000
    assert spec.layer_param_bytes(4) == 872_448_000


def test_llama_3_1_8b_total_params():
    # 32 * 218,112,000 = 6,979,584,000 layers
    # embedding and untied head 128256*4096 = 525,336,576 each -> 1,050,673,152
    # final norm 4,096 -> 8,030,261,248 (the published 8.03B)
    spec = PRESETS["llama-3.1-8b"]
    assert spec.embedding_params == 525_336_576
    assert spec.head_params == 525_336_576
    assert spec.final_norm_params == 4096
    assert spec.total_params == 8_030_261_248


def test_llama_3_2_1b_total_params():
    # layer: q 2048^2 = 4,194,304; k, v 2048*512 = 1,048,576 each; o 4,194,304 -> 10,485,760
    #   FFN 3*2048*8192 = 50,331,648; norms 4,096 -> 60,821,504; x16 = 973,144,064
    # tied embedding 128256*2048 = 262,668,288 (head 0); final norm 2,048
    # total 1,235,814,400 (published 1.24B)
    spec = PRESETS["llama-3.2-1b"]
    assert spec.head_params == 0
    assert spec.layer_params == 60_821_504
    assert spec.total_params == 1_235_814_400


def test_llama_3_2_3b_total_params():
    # layer: q 3072^2 = 9,437,184; k, v 3072*1024 = 3,145,728 each; o 9,437,184 -> 25,165,824
    #   FFN 3*3072*8192 = 75,497,472; norms 6,144 -> 100,669,440; x28 = 2,818,744,320
    # tied embedding 128256*3072 = 394,002,432; final norm 3,072 -> 3,212,749,824
    assert PRESETS["llama-3.2-3b"].total_params == 3_212_749_824


def test_qwen3_8b_total_params_with_qk_norm():
    # layer: q 4096*4096 = 16,777,216; k, v 4096*1024 = 4,194,304 each; o 16,777,216
    #   -> 41,943,040; FFN 3*4096*12288 = 150,994,944; norms 8,192; q_norm + k_norm 2*128 = 256
    #   -> 192,946,432; x36 = 6,946,071,552
    # untied embedding + head 2 * 151936*4096 = 1,244,659,712; final norm 4,096
    # total 8,190,735,360 (the published 8.19B)
    spec = PRESETS["qwen3-8b"]
    assert spec.layer_params == 192_946_432
    assert spec.total_params == 8_190_735_360


def test_qwen3_4b_tied_and_wide_heads():
    # heads*head_dim = 4096 != hidden 2560: q 2560*4096 = 10,485,760; k, v 2560*1024 = 2,621,440
    #   each; o 4096*2560 = 10,485,760 -> 26,214,400; FFN 3*2560*9728 = 74,711,040;
    #   norms 5,120 + 256 -> 100,930,816; x36 = 3,633,509,376
    # tied embedding 151936*2560 = 388,956,160; final 2,560 -> 4,022,468,096 (published 4.02B)
    assert PRESETS["qwen3-4b"].total_params == 4_022_468_096


def test_qwen2_5_72b_total_params_with_bias():
    # layer: q 8192^2 + bias 8192; k, v 8192*1024 + 1024 each; o 8192^2
    #   -> 150,994,944 + 10,240 = 151,005,184; FFN 3*8192*29568 = 726,663,168; norms 16,384
    #   -> 877,684,736; x80 = 70,214,778,880
    # embedding + head 2 * 152064*8192 = 2,491,416,576; final 8,192 -> 72,706,203,648 (72.7B)
    spec = PRESETS["qwen2.5-72b"]
    assert spec.layer_params == 877_684_736
    assert spec.total_params == 72_706_203_648


def test_mistral_7b_v0_3_total_params():
    # layer identical to Llama-3.1-8B: 218,112,000; x32 = 6,979,584,000
    # embedding + head 2 * 32768*4096 = 268,435,456; final 4,096 -> 7,248,023,552
    assert PRESETS["mistral-7b"].total_params == 7_248_023_552


def test_mistral_nemo_head_dim_differs_from_hidden_over_heads():
    # 32 heads * 128 = 4096 != hidden 5120, so q is 5120x4096 and o is 4096x5120.
    # layer: q 20,971,520; k, v 5120*1024 = 5,242,880 each; o 20,971,520 -> 52,428,800
    #   FFN 3*5120*14336 = 220,200,960; norms 10,240 -> 272,640,000; x40 = 10,905,600,000
    # embedding + head 2 * 131072*5120 = 1,342,177,280; final 5,120 -> 12,247,782,400 (12.2B)
    spec = PRESETS["mistral-nemo-12b"]
    assert spec.q_dim == 4096 != spec.hidden_size
    assert spec.layer_params == 272_640_000
    assert spec.total_params == 12_247_782_400


def test_mistral_large_123b_total_params():
    # layer: q 12288^2 = 150,994,944; k, v 12288*1024 = 12,582,912 each; o 150,994,944
    #   -> 327,155,712; FFN 3*12288*28672 = 1,056,964,608; norms 24,576 -> 1,384,144,896
    #   x88 = 121,804,750,848; embedding + head 2 * 32768*12288 = 805,306,368; final 12,288
    # total 122,610,069,504 (~122.6B)
    spec = PRESETS["mistral-large-123b"]
    assert spec.total_params == 122_610_069_504
    assert spec.total_params == pytest.approx(1.226e11, rel=5e-3)


def test_llama_3_1_70b_total_params():
    # layer: attention 2*8192^2 + 2*8192*1024 = 150,994,944; FFN 3*8192*28672 = 704,643,072;
    #   norms 16,384 -> 855,654,400; x80 = 68,452,352,000
    # embedding + head 2 * 128256*8192 = 2,101,346,304; final 8,192 -> 70,553,706,496 (70.6B)
    assert PRESETS["llama-3.1-70b"].total_params == 70_553_706_496


# ---- FLOPs and activation bytes ----


def test_llama_3_1_8b_training_flops_match_design_formula():
    spec = PRESETS["llama-3.1-8b"]
    s, L, h, V = 1024, 32, 4096, 128256
    # Matmul weights per layer: 218,112,000 - 8,192 norm weights = 218,103,808.
    # 6 * 32 * 218,103,808 = 41,875,931,136; 6*h*V = 3,152,019,456; 12*L*s*h = 1,610,612,736
    assert spec.training_flops_per_token(s) == 46_638_563_328
    # DESIGN.md's formula with N_layers counting the norms too (O(h) differences only).
    design = 6 * L * 218_112_000 + 6 * h * V + 12 * L * s * h
    assert spec.training_flops_per_token(s) == pytest.approx(design, rel=1e-4)
    assert spec.head_forward_flops_per_token == 2 * h * V
    # Per layer forward: 2 * 218,103,808 + 4 * 1024 * 4096 = 436,207,616 + 16,777,216
    assert spec.layer_forward_flops_per_token(s) == 452_984_832


def test_flops_grow_linearly_with_sequence():
    spec = PRESETS["llama-3.2-3b"]
    delta = spec.layer_forward_flops_per_token(2048) - spec.layer_forward_flops_per_token(1024)
    assert delta == 4 * 1024 * 24 * 128


def test_checkpoint_bytes_per_token():
    assert PRESETS["llama-3.1-8b"].layer_checkpoint_bytes_per_token == 2 * 4096
    assert PRESETS["llama-3.2-3b"].layer_checkpoint_bytes_per_token == 6144


def test_activation_bytes_per_token_llama_3_2_3b():
    # bf16: n1, mid residual, n2 3*3072; q, attn out, o_proj input 3*3072; k, v 2*1024;
    #   gate, up, act, act*up 4*8192 -> 53,248 elements = 106,496 bytes
    # fp32: 2 norm rstd + 24 logsumexp = 26 -> 104 bytes; total 106,600
    assert PRESETS["llama-3.2-3b"].layer_activation_bytes_per_token == 106_600


def test_activation_bytes_qk_norm_adds_norm_inputs():
    qwen = PRESETS["qwen3-8b"]
    plain = dataclasses.replace(qwen, qk_norm=False)
    # q_norm and k_norm inputs (4096 + 1024 bf16) and their rstd per head (32 + 8 fp32).
    extra = 2 * (4096 + 1024) + 4 * (32 + 8)
    assert qwen.layer_activation_bytes_per_token - plain.layer_activation_bytes_per_token == extra


def test_activation_bytes_dwarf_checkpoint():
    for spec in PRESETS.values():
        assert spec.layer_activation_bytes_per_token > 8 * spec.layer_checkpoint_bytes_per_token


# ---- presets ----


def test_preset_names_exact():
    assert preset_names() == EXPECTED_PRESETS
    assert sorted(PRESETS) == sorted(EXPECTED_PRESETS)


@pytest.mark.parametrize("name", EXPECTED_PRESETS)
def test_every_preset_constructs_and_round_trips(name):
    spec = PRESETS[name]
    assert spec.name == name
    assert spec.total_params > 0
    assert ModelSpec.from_dict(spec.to_dict()) == spec
    # JSON-able (to_dict is what plans and reports store).
    assert ModelSpec.from_dict(json.loads(json.dumps(spec.to_dict()))) == spec


def test_qwen3_presets_have_qk_norm_and_qwen2_has_bias():
    for name in ("qwen3-4b", "qwen3-8b", "qwen3-14b", "qwen3-32b"):
        assert PRESETS[name].qk_norm and not PRESETS[name].attention_bias
    assert PRESETS["qwen2.5-72b"].attention_bias and not PRESETS["qwen2.5-72b"].qk_norm


def test_from_dict_rejects_unknown_keys():
    d = PRESETS["llama-3.2-1b"].to_dict() | {"num_experts": 8}
    with pytest.raises(ValueError, match="num_experts"):
        ModelSpec.from_dict(d)


def test_spec_is_frozen_and_keyword_only():
    spec = PRESETS["llama-3.2-1b"]
    with pytest.raises(dataclasses.FrozenInstanceError):
        spec.num_layers = 3  # type: ignore[misc]
    with pytest.raises(TypeError):
        ModelSpec("x", "llama", 1, 1, 1, 1, 1, 1, 1, False)  # type: ignore[misc]


# ---- validation ----


@pytest.mark.parametrize(
    "change, match",
    [
        ({"num_layers": 0}, "num_layers"),
        ({"hidden_size": -1}, "hidden_size"),
        ({"vocab_size": 1.5}, "vocab_size"),
        ({"head_dim": True}, "head_dim"),
        ({"num_key_value_heads": 5}, "num_key_value_heads"),
        ({"architecture": "gpt2"}, "architecture.*llama"),
        ({"tie_word_embeddings": 1}, "tie_word_embeddings"),
        ({"name": ""}, "name"),
    ],
)
def test_post_init_validation(change, match):
    with pytest.raises(ValueError, match=match):
        dataclasses.replace(PRESETS["llama-3.2-1b"], **change)


def test_heads_not_divisible_message_says_what_to_change():
    with pytest.raises(ValueError, match="not divisible.*change"):
        dataclasses.replace(PRESETS["llama-3.1-8b"], num_key_value_heads=3)


# ---- Hugging Face config.json ----


def test_llama_config_file_and_folder(tmp_path):
    path = _write_config(tmp_path / "Llama-3.2-1B", LLAMA_3_2_1B_CONFIG)
    from_file = model_from_hf_config(path)
    from_folder = model_from_hf_config(path.parent)
    assert from_file == from_folder
    assert from_file.name == "Llama-3.2-1B"
    preset = PRESETS["llama-3.2-1b"]
    assert dataclasses.replace(from_file, name=preset.name) == preset
    assert from_file.total_params == 1_235_814_400


def test_qwen2_config_with_bias_and_derived_head_dim(tmp_path):
    path = _write_config(tmp_path / "Qwen2.5-0.5B", QWEN2_5_0_5B_CONFIG)
    spec = model_from_hf_config(str(path))
    assert spec.architecture == "qwen2"
    assert spec.attention_bias and not spec.qk_norm
    assert spec.head_dim == 896 // 14 == 64
    assert spec.max_position_embeddings == 32768
    # layer: q 896^2 = 802,816; k, v 896*128 = 114,688 each; o 802,816 -> 1,835,008
    #   q/k/v biases 896 + 128 + 128 = 1,152; FFN 3*896*4864 = 13,074,432; norms 1,792
    #   -> 14,912,384; x24 = 357,897,216; tied embedding 151936*896 = 136,134,656; final 896
    # total 494,032,768 (the published Qwen2.5-0.5B count)
    assert spec.layer_params == 14_912_384
    assert spec.total_params == 494_032_768


def test_qwen3_config_sets_qk_norm_and_reads_head_dim(tmp_path):
    config = {
        "architectures": ["Qwen3ForCausalLM"],
        "model_type": "qwen3",
        "attention_bias": False,
        "head_dim": 128,
        "hidden_size": 4096,
        "intermediate_size": 12288,
        "max_position_embeddings": 40960,
        "num_attention_heads": 32,
        "num_hidden_layers": 36,
        "num_key_value_heads": 8,
        "tie_word_embeddings": False,
        "vocab_size": 151936,
    }
    spec = model_from_hf_config(_write_config(tmp_path / "q", config))
    assert dataclasses.replace(spec, name="qwen3-8b") == PRESETS["qwen3-8b"]


def test_unsupported_model_type(tmp_path):
    config = LLAMA_3_2_1B_CONFIG | {
        "model_type": "gpt_neox",
        "architectures": ["GPTNeoXForCausalLM"],
    }
    path = _write_config(tmp_path / "neox", config)
    with pytest.raises(ValueError, match="gpt_neox.*llama.*qwen2.*qwen3.*mistral"):
        model_from_hf_config(path)


def test_model_type_inferred_from_architectures(tmp_path):
    config = {k: v for k, v in LLAMA_3_2_1B_CONFIG.items() if k != "model_type"}
    assert model_from_hf_config(_write_config(tmp_path / "m", config)).architecture == "llama"


def test_missing_key_names_key_and_file(tmp_path):
    config = {k: v for k, v in LLAMA_3_2_1B_CONFIG.items() if k != "intermediate_size"}
    path = _write_config(tmp_path / "broken", config)
    with pytest.raises(ValueError, match=r"broken.*config\.json.*intermediate_size"):
        model_from_hf_config(path)


def test_missing_config_file(tmp_path):
    with pytest.raises(ValueError, match="config.json"):
        model_from_hf_config(tmp_path)


def test_invalid_shape_in_config_names_file(tmp_path):
    path = _write_config(tmp_path / "odd", LLAMA_3_2_1B_CONFIG | {"num_key_value_heads": 7})
    with pytest.raises(ValueError, match="odd.*num_key_value_heads"):
        model_from_hf_config(path)


# ---- resolve_model ----


def test_resolve_preset_case_insensitive():
    assert resolve_model("Llama-3.1-8B") is PRESETS["llama-3.1-8b"]


def test_resolve_path(tmp_path):
    path = _write_config(tmp_path / "m", LLAMA_3_2_1B_CONFIG)
    assert resolve_model(str(path.parent)).total_params == 1_235_814_400
    assert resolve_model(str(path)).num_layers == 16


def test_resolve_unknown_lists_presets():
    with pytest.raises(ValueError, match="llama-3.2-1b.*mistral-large-123b"):
        resolve_model("gpt-5")


def test_resolve_a_hub_model_id_from_huggingface_hubs_cache(offline_hub, tmp_path):
    from helpers import cache_hub_model

    path = _write_config(tmp_path / "m", LLAMA_3_2_1B_CONFIG)
    cache_hub_model(offline_hub, "meta-llama/Llama-3.2-1B", path.parent)
    spec = resolve_model("meta-llama/Llama-3.2-1B")
    assert (spec.name, spec.total_params) == ("Llama-3.2-1B", 1_235_814_400)
    with pytest.raises(ValueError, match=r"^model 'meta-llama/Llama-3.1-8B' is no preset or "
                                         r"path here, and as a Hugging Face Hub id it is not in "
                                         r"the cache.*HF_HUB_OFFLINE is set"):
        resolve_model("meta-llama/Llama-3.1-8B")
