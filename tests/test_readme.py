"""README.md cannot drift: its quickstart commands run on the CPU against a tiny model folder
and data made here, and its results table is what scripts/results_table.py generates."""

import json
import math
import re
import shlex
import subprocess
import sys
from pathlib import Path

import torch
from tokenizers import Tokenizer, models, pre_tokenizers
from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

REPO = Path(__file__).resolve().parents[1]
README = REPO / "README.md"
WORDS = ["the", "cat", "sat", "on", "a", "mat", "and", "dog", "ran", "far", "away"]
MODEL, DATA = "path/to/Llama-3.2-3B", "train.jsonl"
# sizes a 2-core CPU trains in seconds; everything else runs as the README says
SMALLER = {"--seq-len 2048": "--seq-len 64", "--steps 1000": "--steps 3",
           "--warmup-steps 50": "--warmup-steps 1"}
TUNE_SPACE = ["--micro-batches", "1,2", "--grad-accums", "1,4"]


def quickstart_commands() -> list[list[str]]:
    text = README.read_text()
    begin = text.index("<!-- quickstart: begin")
    block = text[begin:text.index("<!-- quickstart: end -->")]
    code = re.search(r"```bash\n(.*?)```", block, re.DOTALL).group(1)
    return [shlex.split(line) for line in code.replace("\\\n", " ").splitlines() if line.strip()]


def tiny_folder(folder: Path) -> None:
    vocab = {w: i for i, w in enumerate(["[UNK]", "</s>", *WORDS])}
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="</s>",
                            unk_token="[UNK]").save_pretrained(folder)
    torch.manual_seed(0)
    LlamaForCausalLM(LlamaConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                                 num_attention_heads=4, num_key_value_heads=2, vocab_size=32,
                                 max_position_embeddings=2048)).save_pretrained(folder)


def test_quickstart_commands_are_the_readme_s():
    commands = quickstart_commands()
    assert [c[:2] for c in commands] == [["layerslide", "tune"], ["layerslide", "simulate"],
                                         ["layerslide", "train"]]
    assert all(MODEL in c for c in (commands[0], commands[2]))
    joined = " ".join(" ".join(c) for c in commands)
    assert all(flag in joined for flag in SMALLER), "the test's substitutions no longer match"


def test_readme_quickstart_runs_on_the_cpu(tmp_path):
    tiny_folder(tmp_path / "tiny-llama")
    (tmp_path / DATA).write_text("\n".join(
        json.dumps({"text": " ".join(WORDS[i % 5:i % 5 + 6])}) for i in range(200)) + "\n")
    outputs = []
    for argv in quickstart_commands():
        line = " ".join(argv)
        for old, new in SMALLER.items():
            line = line.replace(old, new)
        argv = [str(tmp_path / "tiny-llama") if a == MODEL else a for a in line.split()]
        if argv[1] == "tune":
            argv += TUNE_SPACE
        done = subprocess.run([sys.executable, "-m", "layerslide.cli.main", *argv[1:]],
                              cwd=tmp_path, capture_output=True, text=True, timeout=240,
                              check=False)
        assert done.returncode == 0, f"{line}\n{done.stdout[-2000:]}\n{done.stderr[-2000:]}"
        outputs.append(done.stdout)
    plan = json.loads((tmp_path / "tuned.json").read_text())
    assert plan["tasks"] and "best plan written to tuned.json" in outputs[0]
    assert "s/step" in outputs[1] or "step" in outputs[1]
    steps = [json.loads(line) for line in (tmp_path / "steps.jsonl").read_text().splitlines()]
    assert [s["step"] for s in steps] == [1, 2, 3]
    assert all(math.isfinite(s["loss"]) for s in steps)
    assert "step 3/3" in outputs[2] and "saved the fine-tuned model" in outputs[2]
    tuned = LlamaForCausalLM.from_pretrained(tmp_path / "tuned-model")
    before = LlamaForCausalLM.from_pretrained(tmp_path / "tiny-llama")
    assert not torch.equal(tuned.model.layers[0].mlp.up_proj.weight.float(),
                           before.model.layers[0].mlp.up_proj.weight.float())


def test_results_table_is_generated_from_the_result_files():
    done = subprocess.run([sys.executable, str(REPO / "scripts" / "results_table.py"),
                           "--check"], capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 0, done.stdout + done.stderr
    table = README.read_text().split("<!-- results-table: begin")[1]
    rows = [line for line in table.split("<!-- results-table: end")[0].splitlines()
            if line.startswith("| ") and not line.startswith(("| benchmark", "| ---"))]
    assert len(rows) >= 5
    for row in rows:
        file = re.search(r"\]\((benchmarks/results/[^)]+)\)", row).group(1)
        assert (REPO / file).is_file(), file
        assert re.search(r"\| [0-9a-f]{7} \|$", row), row  # a commit, not "uncommitted"


def several_gpu_commands() -> list[list[str]]:
    text = README.read_text()
    block = text[text.index("<!-- several gpus: begin"):text.index("<!-- several gpus: end -->")]
    code = re.search(r"```bash\n(.*?)```", block, re.DOTALL).group(1)
    return [shlex.split(line) for line in code.replace("\\\n", " ").splitlines() if line.strip()]


def test_the_several_gpu_commands_parse_as_layerslide_and_torchrun_read_them():
    from torch.distributed.run import get_args_parser

    from layerslide.cli.main import build_parser

    own, launched = several_gpu_commands()
    assert own[:2] == ["layerslide", "train"] and "--gpus" in own
    assert build_parser().parse_args(own[1:]).gpus == 4
    torchrun = get_args_parser().parse_args(launched[1:])  # its flags, then -m layerslide ...
    assert (torchrun.nnodes, torchrun.nproc_per_node, torchrun.module) == ("2", "4", True)
    assert torchrun.training_script == "layerslide"
    assert build_parser().parse_args(torchrun.training_script_args).command == "train"


def test_the_several_gpu_command_trains_as_two_ranks_on_the_cpu(tmp_path):
    tiny_folder(tmp_path / "tiny-llama")
    (tmp_path / DATA).write_text("\n".join(
        json.dumps({"text": " ".join(WORDS[i % 5:i % 5 + 6])}) for i in range(200)) + "\n")
    line = " ".join(several_gpu_commands()[0])
    for old, new in {**SMALLER, "--gpus 4": "--gpus 2"}.items():
        line = line.replace(old, new)
    argv = [str(tmp_path / "tiny-llama") if a == MODEL else a for a in line.split()]
    done = subprocess.run([sys.executable, "-m", "layerslide", *argv[1:], "--device", "cpu",
                           "--seq-len", "64"], cwd=tmp_path, capture_output=True, text=True,
                          timeout=400, check=False)
    assert done.returncode == 0, f"{line}\n{done.stdout[-2000:]}\n{done.stderr[-2000:]}"
    steps = [json.loads(line) for line in (tmp_path / "steps.jsonl").read_text().splitlines()]
    assert [s["step"] for s in steps] == [1, 2, 3]  # rank 0's log alone
    assert LlamaForCausalLM.from_pretrained(tmp_path / "tuned-model") is not None
