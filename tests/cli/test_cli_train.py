"""`layerslide train` end to end on the CPU: HF folder + JSONL in, HF folder + logs out."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from helpers import WORDS, cache_hub_dataset, cache_hub_model, tiny_model_folder, tiny_text_data
from transformers import (
    AutoModelForCausalLM,
    AutoTokenizer,
)

from layerslide.cli.main import main
from layerslide.hwprofiles import load_profile
from layerslide.planner.build import build_plan, build_repeatable_plan
from layerslide.planner.model import model_from_hf_config
from layerslide.planner.settings import Policy, TrainSpec
from layerslide.trace import Trace


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return tiny_model_folder(tmp_path_factory.mktemp("tiny-llama"))


@pytest.fixture
def data_file(tmp_path):
    return tiny_text_data(tmp_path / "data.jsonl")


def test_train_saves_a_model_transformers_loads(model_dir, data_file, tmp_path, capsys):
    out = tmp_path / "tuned"
    rc = main(["train", "--model", str(model_dir), "--data", str(data_file), "--device", "cpu",
               "--steps", "3", "--micro-batch", "2", "--seq-len", "16", "--lr", "1e-3",
               "--out", str(out), "--log-jsonl", str(tmp_path / "log.jsonl"),
               "--trace-out", str(tmp_path / "trace.json"), "--max-grad-norm", "1.0",
               "--tensorboard", str(tmp_path / "tb")])
    assert rc == 0
    printed = capsys.readouterr().out
    assert "step 3/3" in printed and "saved the fine-tuned model" in printed
    logs = [json.loads(line) for line in (tmp_path / "log.jsonl").read_text().splitlines()]
    assert [log["step"] for log in logs] == [1, 2, 3]  # numbered as on stdout
    assert all(log["loss"] > 0 and log["grad_norm"] > 0 for log in logs)
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    events = EventAccumulator(str(tmp_path / "tb"))
    events.Reload()
    assert {"train/loss", "train/lr", "train/grad_norm", "speed/tokens_per_s",
            "memory/host_rss_gib"} <= set(events.Tags()["scalars"])
    losses = events.Scalars("train/loss")
    assert [e.step for e in losses] == [1, 2, 3]
    assert [e.value for e in losses] == pytest.approx([log["loss"] for log in logs])
    tuned = AutoModelForCausalLM.from_pretrained(out)
    original = AutoModelForCausalLM.from_pretrained(model_dir)
    changed = [n for n, p in tuned.named_parameters()
               if not torch.equal(p, original.state_dict()[n].to(p.dtype))]
    assert changed  # it trained
    assert (out / "tokenizer.json").is_file()
    assert Trace.load(tmp_path / "trace.json").events


def test_train_refuses_a_plan_for_another_model(model_dir, tmp_path, capsys):
    plan = build_plan(model_from_hf_config(model_dir).__class__(
        **{**model_from_hf_config(model_dir).to_dict(), "num_layers": 3}),
        TrainSpec(micro_batch=2, seq_len=16), Policy.of())
    plan.save(tmp_path / "plan.json")
    rc = main(["train", "--model", str(model_dir), "--plan", str(tmp_path / "plan.json"),
               "--device", "cpu", "--steps", "1", "--data", "synthetic"])
    assert rc == 2
    assert "is a plan for" in capsys.readouterr().err


def test_train_refuses_flags_a_plan_would_replace(model_dir, tmp_path, capsys):
    plan = build_repeatable_plan(model_from_hf_config(model_dir),
                                 TrainSpec(micro_batch=2, seq_len=16), Policy.of(window=1))
    plan.save(tmp_path / "plan.json")
    base = ["train", "--model", str(model_dir), "--plan", str(tmp_path / "plan.json"),
            "--device", "cpu", "--steps", "1", "--data", "synthetic"]
    assert main([*base, "--max-grad-norm", "1.0", "--window", "3"]) == 2
    err = capsys.readouterr().err
    assert "--max-grad-norm 1.0 (the plan has None)" in err and "--window 3 (the plan has 1)" in err
    assert Policy.of().residency.window == 2  # typed at the default's value, it still clashes
    assert main([*base, "--window", "2"]) == 2
    assert "--window 2 (the plan has 1)" in capsys.readouterr().err
    out = tmp_path / "out"
    assert main([*base, "--micro-batch", "2", "--seq-len", "16", "--out", str(out)]) == 0
    # a plan run's resolved options leave the plan's settings to the plan, and run again
    resolved = (out / "layerslide-train.toml").read_text()
    assert "plan = " in resolved and "window" not in resolved and "micro-batch" not in resolved
    assert main(["train", "--config", str(out / "layerslide-train.toml"), "--out",
                 str(tmp_path / "again")]) == 0


@pytest.mark.parametrize(("extra", "words"), [
    (["--data", "/no/such/data.jsonl"], "does not exist"),
    (["--seq-len", "4096"], "seq_len"),
    (["--steps", "0"], "at least one step"),
    (["--gpu-memory", "1MiB"], "GiB of GPU memory"),
    (["--moments-on-nvme", "0.5"], "--nvme-dir"),
    (["--moments-on-nvme", "0.5", "--nvme-dir", "/proc/no"], "cannot be written"),
    (["--activations", "nvme"], "--nvme-dir"),
    (["--model", "llama-3.1-70b"], "keep part of the state on NVMe"),  # more than this RAM
    # options that would change nothing: refused, not dropped
    (["--keep-checkpoints", "3"], "--keep-checkpoints acts only with --checkpoint-dir"),
    (["--checkpoint-sync"], "--checkpoint-sync acts only with --checkpoint-dir"),
    (["--keep-saves", "2"], "--keep-saves acts only with --save-every"),
    (["--resume-fallback"], "--resume-fallback acts only with --resume"),
    (["--eval-rows", "4"], "--eval-rows acts only with --eval-data or --eval-fraction"),
    (["--overwrite"], "--overwrite acts only with --out"),
    (["--tokenizer", "/no/such", "--packing", "off"],
     "--packing, --tokenizer: --data synthetic trains on random tokens"),
    (["--device", "cpu:3"], "use --device cpu"),
])
def test_train_refuses_bad_input_before_training(model_dir, extra, words, capsys):
    rc = main(["train", "--model", str(model_dir), "--device", "cpu", "--seq-len", "16",
               "--micro-batch", "2", "--steps", "1", "--data", "synthetic", *extra])
    assert rc == 2
    assert words in capsys.readouterr().err


def test_on_the_cpu_a_micro_batch_that_would_overflow_ram_is_refused(model_dir, monkeypatch,
                                                                    capsys):
    """The GPU's share of the plan (activations, workspaces) is RAM on --device cpu: a
    micro-batch of a million rows fits the host part of 16 GiB, not the whole."""
    monkeypatch.setattr("layerslide.calibrate.host.physical_ram_bytes", lambda: 16 * 2**30)
    assert main(["train", "--model", str(model_dir), "--device", "cpu", "--steps", "1",
                 "--seq-len", "16", "--micro-batch", "1000000", "--data", "synthetic"]) == 2
    err = capsys.readouterr().err
    assert "GiB of it the GPU's share, which --device cpu keeps in RAM), this machine has " \
           "16.0 GiB: lower --micro-batch or --seq-len" in err


def test_train_says_an_nvme_folder_the_plan_leaves_unused(model_dir, tmp_path, capsys):
    assert main(["train", "--model", str(model_dir), "--device", "cpu", "--steps", "1",
                 "--seq-len", "16", "--micro-batch", "2", "--data", "synthetic",
                 "--nvme-dir", str(tmp_path / "nvme")]) == 0
    assert "this plan keeps nothing on NVMe" in capsys.readouterr().err


def test_train_refuses_an_existing_output_folder(model_dir, tmp_path, capsys):
    (tmp_path / "out").mkdir()
    rc = main(["train", "--model", str(model_dir), "--device", "cpu", "--steps", "1",
               "--seq-len", "16", "--out", str(tmp_path / "out")])
    assert rc == 2
    assert "--overwrite" in capsys.readouterr().err


def test_train_runs_a_tuned_plan_with_its_settings(model_dir, tmp_path, capsys, monkeypatch):
    # tune may nice a GPU-bound pick's CPU kernels; their niceness is process-wide and would
    # outlive this test in the test process, so the environment keeps it at 0
    monkeypatch.setenv("LAYERSLIDE_CPU_NICE", "0")
    plan_file = tmp_path / "tuned.json"
    assert main(["tune", "--model", str(model_dir), "--seq-len", "16", "--micro-batches", "2",
                 "--windows", "1", "--no-nvme", "-o", str(plan_file)]) == 0
    tuned = json.loads(plan_file.read_text())
    assert tuned["policy"]["executor"]["cpu_nice"] == 0
    capsys.readouterr()
    rc = main(["train", "--model", str(model_dir), "--plan", str(plan_file), "--device", "cpu",
               "--steps", "2", "--data", "synthetic", "--log-jsonl", str(tmp_path / "log.jsonl")])
    assert rc == 0
    printed = capsys.readouterr().out
    assert f"micro-batch {tuned['train']['micro_batch']} x 16 tokens" in printed
    assert f"window {tuned['policy']['residency']['window']}" in printed
    assert len((tmp_path / "log.jsonl").read_text().splitlines()) == 2


def truncated_copy(model_dir, tmp_path):
    """The model folder with its safetensors cut in half."""
    copy = tmp_path / "truncated"
    copy.mkdir()
    for f in model_dir.iterdir():
        data = f.read_bytes()
        (copy / f.name).write_bytes(data[:len(data) // 2] if f.suffix == ".safetensors" else data)
    return copy


def nan_copy(model_dir, tmp_path):
    """The model folder with one NaN in its weights."""
    from safetensors.torch import load_file, save_file

    copy = tmp_path / "nan"
    copy.mkdir()
    for f in model_dir.iterdir():
        if f.suffix == ".safetensors":
            tensors = load_file(f)
            next(iter(tensors.values())).view(-1)[0] = float("nan")
            save_file(tensors, copy / f.name, metadata={"format": "pt"})
        else:
            (copy / f.name).write_bytes(f.read_bytes())
    return copy


# each refused before anything is trained (the cases of issue 25 that ran, or were silent)
@pytest.mark.parametrize(("case", "words"), [
    ("out under /proc", "cannot write in /proc"),
    ("out is a file", "is a file: give a folder path"),
    ("trace under /proc", "--trace-out /proc/x/trace.json: folder /proc/x does not exist"),
    ("log under /proc", "--log-jsonl /proc/log.jsonl: cannot write in /proc"),
    ("tensorboard is a file", "a_file is a file: give a folder path"),
    ("tpu", "--device tpu: not a device"),
    ("meta", "layerslide trains on cuda or cpu"),
    ("truncated weights", "is not a readable safetensors file"),
    ("NaN weights", "holds NaN or inf values"),
    ("weights without data", "--data is needed to train the weights in"),
    ("config.json of weights", "to train its weights (config.json alone"),
    ("warmup past the end", "--warmup-steps 100 is not below --steps 3"),
])
def test_train_refuses_what_would_fail_late_or_silently(model_dir, tmp_path, capsys, case, words):
    a_file = tmp_path / "a_file"
    a_file.write_text("x")
    model, extra = str(model_dir), ["--data", "synthetic"]
    if case == "out under /proc":
        extra += ["--out", "/proc/out"]
    elif case == "out is a file":
        extra += ["--out", str(a_file), "--overwrite"]
    elif case == "trace under /proc":
        extra += ["--trace-out", "/proc/x/trace.json"]
    elif case == "log under /proc":
        extra += ["--log-jsonl", "/proc/log.jsonl"]
    elif case == "tensorboard is a file":
        extra += ["--tensorboard", str(a_file)]
    elif case in ("tpu", "meta"):
        extra += ["--device", case]
    elif case == "truncated weights":
        model = str(truncated_copy(model_dir, tmp_path))
    elif case == "NaN weights":
        model = str(nan_copy(model_dir, tmp_path))
    elif case == "weights without data":
        extra = []
    elif case == "config.json of weights":
        model = str(model_dir / "config.json")
    elif case == "warmup past the end":
        extra += ["--warmup-steps", "100"]
    argv = ["train", "--model", model, "--seq-len", "16", "--micro-batch", "2", "--steps", "3",
            *(["--device", "cpu"] if "--device" not in extra else []), *extra]
    assert main(argv) == 2
    assert words in capsys.readouterr().err


def test_train_says_what_it_assumes(model_dir, tmp_path, capsys):
    """Random tokens, or no saved model, are said aloud, not silently done."""
    rc = main(["train", "--model", "llama-3.2-1b", "--device", "cpu", "--steps", "1",
               "--seq-len", "16", "--micro-batch", "1", "--gpu-memory", "1MiB"])
    assert rc == 2  # refused at the fit check, after the notes
    err = capsys.readouterr().err
    assert "no --data: training on random tokens" in err
    rc = main(["train", "--model", str(model_dir), "--device", "cpu", "--steps", "1",
               "--seq-len", "16", "--micro-batch", "2", "--data", "synthetic"])
    assert rc == 0
    err = capsys.readouterr().err
    assert "--data synthetic: training on random tokens" in err
    assert "no --out: the trained model will not be saved" in err


CHAT_TEMPLATE = ("{% for m in messages %}{{ m['role'] }} {{ m['content'] }} </s> {% endfor %}"
                 "{% if add_generation_prompt %}assistant {% endif %}")


def test_train_on_chat_data_masks_prompts_and_keeps_the_chat_template(model_dir, tmp_path,
                                                                      capsys):
    """messages records through the folder's chat template, replies trained on; the saved
    folder carries the template and transformers renders with it."""
    import shutil

    from transformers import AutoTokenizer

    chat_model = tmp_path / "chat-model"
    shutil.copytree(model_dir, chat_model)
    tokenizer = AutoTokenizer.from_pretrained(chat_model)
    tokenizer.chat_template = CHAT_TEMPLATE
    tokenizer.save_pretrained(chat_model)
    data = tmp_path / "chat.jsonl"
    data.write_text("\n".join(json.dumps({"messages": [
        {"role": "user", "content": " ".join(WORDS[i % 5:i % 5 + 3])},
        {"role": "assistant", "content": " ".join(WORDS[i % 4 + 5:i % 4 + 9])}]})
        for i in range(12)) + "\n")
    out = tmp_path / "tuned"
    rc = main(["train", "--model", str(chat_model), "--data", str(data), "--device", "cpu",
               "--steps", "2", "--micro-batch", "2", "--seq-len", "16", "--out", str(out)])
    assert rc == 0
    printed = capsys.readouterr().out
    assert "messages data from chat.jsonl: 12 examples" in printed and "unpacked" in printed
    saved = AutoTokenizer.from_pretrained(out)
    assert saved.chat_template == CHAT_TEMPLATE
    assert AutoModelForCausalLM.from_pretrained(out) is not None


def test_train_names_its_own_flags_in_data_errors(model_dir, tmp_path, capsys):
    data = tmp_path / "chat.jsonl"
    data.write_text(json.dumps({"messages": [{"role": "user", "content": "the cat"},
                                             {"role": "assistant", "content": "sat"}]}) + "\n")
    rc = main(["train", "--model", str(model_dir), "--data", str(data), "--device", "cpu",
               "--steps", "1", "--seq-len", "16"])
    assert rc == 2
    err = capsys.readouterr().err
    assert "has no chat template" in err and "train_on_prompt" not in err
    rc = main(["train", "--model", str(model_dir), "--data", str(data), "--device", "cpu",
               "--steps", "1", "--seq-len", "16", "--data-format", "poems"])
    assert rc == 2 and "--data-format must be one of" in capsys.readouterr().err


def test_train_scores_held_out_data_beside_the_training_loss(model_dir, data_file, tmp_path,
                                                             capsys):
    rc = main(["train", "--model", str(model_dir), "--data", str(data_file), "--device", "cpu",
               "--steps", "4", "--micro-batch", "2", "--seq-len", "16", "--lr", "3e-3",
               "--eval-fraction", "0.25", "--eval-every", "2", "--log-jsonl",
               str(tmp_path / "log.jsonl"), "--tensorboard", str(tmp_path / "tb")])
    assert rc == 0
    printed = capsys.readouterr().out
    assert "data: text data from data.jsonl: 30 examples" in printed
    assert "eval data: text data from data.jsonl: 10 examples" in printed
    lines = [json.loads(line) for line in (tmp_path / "log.jsonl").read_text().splitlines()]
    evals = [line for line in lines if "eval_loss" in line]
    assert [e["step"] for e in evals] == [0, 2, 4]
    assert [line["step"] for line in lines if "loss" in line] == [1, 2, 3, 4]
    assert evals[-1]["eval_loss"] < evals[0]["eval_loss"]  # it learns the held-out text too
    assert all(0 <= e["eval_accuracy"] <= 1 and e["eval_tokens"] > 0 for e in evals)
    assert "eval after step 4 | loss" in printed
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    events = EventAccumulator(str(tmp_path / "tb"))
    events.Reload()
    assert [e.step for e in events.Scalars("eval/loss")] == [0, 2, 4]
    assert [e.value for e in events.Scalars("eval/accuracy")] == pytest.approx(
        [e["eval_accuracy"] for e in evals])
    rc = main(["train", "--model", str(model_dir), "--data", str(data_file), "--device", "cpu",
               "--steps", "1", "--micro-batch", "2", "--seq-len", "16",
               "--eval-data", str(data_file), "--eval-rows", "3"])
    assert rc == 0
    assert "eval after step 1 | loss" in capsys.readouterr().out


@pytest.mark.parametrize(("flags", "words"), [
    (["--eval-fraction", "1.5"], "between 0 and 1"),
    (["--eval-fraction", "0.1", "--eval-data", "x.jsonl"], "give one"),
    (["--eval-every", "2"], "--eval-every needs eval data"),
    (["--eval-fraction", "0.2", "--eval-every", "0"], "at least every step"),
    (["--eval-data", "/no/such.jsonl"], "does not exist"),
])
def test_train_refuses_bad_eval_flags(model_dir, data_file, flags, words, capsys):
    rc = main(["train", "--model", str(model_dir), "--data", str(data_file), "--device", "cpu",
               "--steps", "1", "--micro-batch", "2", "--seq-len", "16", *flags])
    assert rc == 2
    assert words in capsys.readouterr().err


def test_a_run_config_file_sets_every_option_and_flags_override_it(model_dir, data_file,
                                                                   tmp_path, capsys):
    from layerslide.cli.main import build_parser
    from layerslide.cli.run_config import RESOLVED_NAME, load_run_config

    config = tmp_path / "run.toml"
    config.write_text(f'model = "{model_dir}"\ndata = "{data_file}"\ndevice = "cpu"\n'
                      'steps = 5\nmicro-batch = 2\nseq_len = 16\nlr = 2e-3\n'
                      'max-grad-norm = 1.0\ngpu-memory = "2GiB"\nactivations = "gpu"\n'
                      f'out = "{tmp_path / "out"}"\n')
    rc = main(["train", "--config", str(config), "--steps", "2",
               "--log-jsonl", str(tmp_path / "log.jsonl")])
    assert rc == 0
    printed = capsys.readouterr().out
    assert "step 2/2" in printed and "micro-batch 2 x 16 tokens" in printed
    assert "activations on gpu" in printed
    logs = [json.loads(line) for line in (tmp_path / "log.jsonl").read_text().splitlines()]
    assert logs[0]["lr"] == pytest.approx(2e-3)
    resolved = tmp_path / "out" / RESOLVED_NAME
    train_parser = build_parser()._subparsers._group_actions[0].choices["train"]
    values = load_run_config(str(resolved), train_parser)
    assert (values["steps"], values["micro_batch"], values["lr"]) == (2, 2, 2e-3)
    assert values["gpu_memory"] == 2 * 2**30 and values["max_grad_norm"] == 1.0
    assert values["out"] == str(tmp_path / "out") and "config" not in values
    # the resolved file runs again as it is (its options at their defaults given no meaning)
    assert main(["train", "--config", str(resolved), "--out", str(tmp_path / "again")]) == 0


@pytest.mark.parametrize(("data", "flags", "words"), [
    ("chat", ["--text-field", "body"],
     ("--text-field 'body' names the field text records keep their text in, and the data holds "
      "messages records, which are not read through it: drop --text-field")),
    ("txt", ["--text-field", "text"],
     "--text-field 'text' names the field of JSON text records, and the data is plain text"),
    ("chat", ["--attend-across-documents"],
     ("--attend-across-documents lets packed examples attend to each other, and these rows are "
      "not packed (messages data is not packed by default): each row holds one example, which "
      "attends only to itself; drop --attend-across-documents, or pass --packing on")),
    ("txt", ["--attend-across-documents", "--packing", "off"],
     ("--attend-across-documents lets packed examples attend to each other, and --packing off "
      "puts one example a row: drop one of them")),
])
def test_data_options_that_would_change_nothing_are_refused(model_dir, tmp_path, data, flags,
                                                            words, capsys):
    path = tmp_path / ("chat.jsonl" if data == "chat" else "book.txt")
    path.write_text(json.dumps({"messages": [{"role": "user", "content": "the cat"},
                                             {"role": "assistant", "content": "sat"}]}) + "\n"
                    if data == "chat" else "the cat sat\n\na dog ran\n")
    tokenizer = tmp_path / "tok"
    shutil.copytree(model_dir, tokenizer)
    chat = AutoTokenizer.from_pretrained(tokenizer)
    chat.chat_template = CHAT_TEMPLATE
    chat.save_pretrained(tokenizer)
    assert main(["train", "--model", str(model_dir), "--tokenizer", str(tokenizer), "--data",
                 str(path), "--device", "cpu", "--steps", "1", "--seq-len", "16", *flags]) == 2
    assert words in capsys.readouterr().err


def test_what_the_data_said_before_it_was_refused_is_said_with_the_refusal(model_dir, tmp_path,
                                                                           capsys):
    """A template whose generation prompt no reply renders as loses every turn: the warning
    that names the records comes with the refusal, which names the template (not --seq-len)."""
    chat_model = tmp_path / "chat-model"
    shutil.copytree(model_dir, chat_model)
    tokenizer = AutoTokenizer.from_pretrained(chat_model)
    tokenizer.chat_template = CHAT_TEMPLATE.replace("assistant {% endif %}",
                                                    "assistant to {% endif %}")
    tokenizer.save_pretrained(chat_model)
    data = tmp_path / "chat.jsonl"
    data.write_text(json.dumps({"messages": [{"role": "user", "content": "the cat"},
                                             {"role": "assistant", "content": "sat"}]}) + "\n")
    assert main(["train", "--model", str(chat_model), "--data", str(data), "--device", "cpu",
                 "--steps", "1", "--seq-len", "16"]) == 2
    err = capsys.readouterr().err
    assert "warning: 1 conversations lost assistant turns to the tokenizer's chat template" in err
    assert f"{data} line 1 lost 1 of 1;" in err
    assert ("error: no example has a token to train on: the tokenizer's chat template renders "
            "each assistant turn (1 in all) otherwise") in err and "--train-on-prompt" in err


def test_train_takes_a_hub_model_id_and_dataset_name_from_their_caches_offline(
        model_dir, offline_hub, tmp_path):
    """As a user types them, in a process of its own whose environment says offline (HF_HOME
    holding what earlier downloads left): the model's snapshot and the dataset's split."""
    cache_hub_model(offline_hub, "someone/tiny-llama", model_dir)
    records = [{"text": " ".join(WORDS[i % 7:i % 7 + 6])} for i in range(20)]
    cache_hub_dataset(offline_hub, "someone/tinytext", {"train": records, "test": records[:2]})
    out = tmp_path / "tuned"
    root = Path(__file__).resolve().parents[2]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(root), os.environ.get(
        "PYTHONPATH", "")])}
    result = subprocess.run(
        [sys.executable, "-m", "layerslide.cli.main", "train", "--model", "someone/tiny-llama",
         "--data", "someone/tinytext:train", "--device", "cpu", "--steps", "2",
         "--micro-batch", "2", "--seq-len", "16", "--out", str(out), "--checkpoint-dir",
         str(tmp_path / "ck"), "--checkpoint-every", "2"],
        env=env, cwd=tmp_path, capture_output=True, text=True, timeout=300, check=False)
    assert result.returncode == 0, result.stderr
    assert "text data from someone/tinytext:train: 20 examples" in result.stdout
    assert "tiny-llama: " in result.stdout and "step 2/2" in result.stdout
    assert AutoModelForCausalLM.from_pretrained(out) is not None
    assert (out / "tokenizer.json").is_file()
    resolved = (out / "layerslide-train.toml").read_text()  # a rerun names them the same way
    assert 'model = "someone/tiny-llama"' in resolved
    assert 'data = "someone/tinytext:train"' in resolved
    # its checkpoint exports with the Hub model's tokenizer, from the cache
    exported = subprocess.run(
        [sys.executable, "-m", "layerslide.cli.main", "export", str(tmp_path / "ck"), "--out",
         str(tmp_path / "exported")], env=env, cwd=tmp_path, capture_output=True, text=True,
        timeout=300, check=False)
    assert exported.returncode == 0, exported.stderr
    assert (tmp_path / "exported" / "tokenizer.json").read_bytes() == (
        out / "tokenizer.json").read_bytes()


@pytest.mark.parametrize(("flags", "words"), [
    (["--model", "someone/absent", "--data", "synthetic"],
     ("error: model 'someone/absent' is no preset or path here, and as a Hugging Face Hub id it "
      "is not in the cache")),
    (["--data", "someone/absent:train"],
     ("error: data 'someone/absent' is no path here, and as a Hugging Face Hub dataset it is "
      "not in datasets' cache")),
])
def test_train_refuses_hub_names_neither_cached_nor_reachable(model_dir, offline_hub, flags,
                                                              words, capsys):
    argv = ["train", "--model", str(model_dir), "--device", "cpu", "--steps", "1",
            "--seq-len", "16", *flags]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert words in err and "HF_HUB_OFFLINE" in err and "or pass a local path" in err


def test_the_datas_warnings_are_said_in_flags(model_dir, data_file, capsys):
    assert main(["train", "--model", str(model_dir), "--data", str(data_file), "--device", "cpu",
                 "--steps", "1", "--seq-len", "4", "--micro-batch", "2", "--packing", "off"]) == 0
    err = capsys.readouterr().err
    assert "were truncated; raise --seq-len or pass --packing on to keep them whole" in err


def test_a_refused_option_set_in_a_run_config_says_so(model_dir, tmp_path, capsys):
    config = tmp_path / "run.toml"
    config.write_text(f'model = "{model_dir}"\ndata = "synthetic"\nkeep-checkpoints = 3\n')
    assert main(["train", "--config", str(config), "--device", "cpu", "--steps", "1"]) == 2
    assert (f"--keep-checkpoints (in --config {config}) acts only with --checkpoint-dir"
            in capsys.readouterr().err)


@pytest.mark.parametrize(("text", "words"), [
    ("micro-bach = 2", "did you mean micro-batch?"),
    ('steps = "many"', "steps = 'many'"),
    ('activations = "disk"', "choose one of gpu, host, nvme"),
    ("serial = 1", "give true or false"),
    ("steps = [1, 2]", "give one value"),
    ('resume = "ckpt"', "a command-line-only option: pass --resume on the command line"),
    ("steps = ", "not a readable TOML file"),
    ("seq-len = 16\nseq_len = 32", "'seq-len' and 'seq_len' both set --seq-len: keep one"),
])
def test_a_bad_run_config_is_refused_with_what_to_change(tmp_path, text, words, capsys):
    config = tmp_path / "run.toml"
    config.write_text(text + "\n")
    assert main(["train", "--config", str(config)]) == 2
    assert words in capsys.readouterr().err
    assert main(["train", "--config", str(tmp_path / "none.toml")]) == 2
    assert "no such file" in capsys.readouterr().err


def test_a_save_every_that_would_never_save_is_refused(model_dir, tmp_path, capsys):
    """Saves come every N steps before the last; the last step's model goes to --out."""
    base = ["train", "--model", str(model_dir), "--device", "cpu", "--seq-len", "16",
            "--micro-batch", "2", "--data", "synthetic", "--out", str(tmp_path / "out")]
    for every, steps in (("5", "3"), ("3", "3")):
        assert main([*base, "--steps", steps, "--save-every", every]) == 2
        assert (f"--save-every {every} would never save: saves come every {every} steps "
                f"before the last of --steps {steps}, whose model goes to --out: give "
                f"--save-every below {steps}, or drop it") in capsys.readouterr().err
    config = tmp_path / "run.toml"
    config.write_text("save-every = 9\n")
    assert main([*base, "--steps", "3", "--config", str(config)]) == 2
    assert f"--save-every (in --config {config}) 9 would never save" in capsys.readouterr().err
    assert not (tmp_path / "out").exists()


def test_save_every_writes_rotated_model_folders_beside_out(model_dir, data_file, tmp_path,
                                                            capsys):
    from layerslide.cli.run_config import RESOLVED_NAME

    out = tmp_path / "tuned"
    argv = ["train", "--model", str(model_dir), "--data", str(data_file), "--device", "cpu",
            "--steps", "5", "--micro-batch", "2", "--seq-len", "16", "--lr", "1e-3",
            "--out", str(out), "--save-every", "2", "--keep-saves", "1"]
    assert main(argv) == 0
    printed = capsys.readouterr().out
    assert f"saved the model after step 2 to {tmp_path / 'tuned-step-2'}" in printed
    assert "saved the model after step 4" in printed
    assert sorted(p.name for p in tmp_path.iterdir() if p.name.startswith("tuned")) == [
        "tuned", "tuned-step-4"]
    step4 = tmp_path / "tuned-step-4"
    assert (step4 / "tokenizer.json").is_file() and (step4 / RESOLVED_NAME).is_file()
    final, middle = (AutoModelForCausalLM.from_pretrained(p) for p in (out, step4))
    assert any(not torch.equal(a, b) for a, b in zip(final.parameters(), middle.parameters(),
                                                     strict=True))
    out.rename(tmp_path / "other")
    assert main(argv) == 2  # tuned-step-4 is there
    assert "tuned-step-4, which exists" in capsys.readouterr().err
    without_out = argv[:-6] + ["--save-every", "2"]  # argv ends --out OUT --save-every ...
    assert main(without_out) == 2
    assert "--save-every saves beside --out" in capsys.readouterr().err



def test_saves_of_an_earlier_run_are_never_pruned_as_this_runs(model_dir, data_file, tmp_path):
    out = tmp_path / "run[1]"  # glob characters: pruning still finds this run's saves
    (tmp_path / "run[1]-step-90").mkdir()  # a crashed earlier run's save
    argv = ["train", "--model", str(model_dir), "--data", str(data_file), "--device", "cpu",
            "--steps", "4", "--micro-batch", "2", "--seq-len", "16", "--out", str(out),
            "--save-every", "1", "--keep-saves", "2"]
    assert main(argv) == 0  # step 90 was the highest: pruning by step kept it, not 2 and 3
    assert sorted(p.name for p in tmp_path.iterdir() if p.name.startswith("run")) == [
        "run[1]", "run[1]-step-2", "run[1]-step-3", "run[1]-step-90"]


def test_train_shows_the_prediction_beside_each_step_and_checks_it_at_the_end(
        model_dir, data_file, tmp_path, capsys, monkeypatch):
    # simulate predicts a GPU-bound plan as train runs it on a GPU, niced; on the CPU train
    # runs it at nice 0, which the environment asks of simulate here
    monkeypatch.setenv("LAYERSLIDE_CPU_NICE", "0")
    out = tmp_path / "tuned"
    args = ["--model", str(model_dir), "--micro-batch", "2", "--seq-len", "16"]
    assert main(["simulate", *args, "--json"]) == 0
    predicted = json.loads(capsys.readouterr().out)
    assert main(["train", *args, "--data", str(data_file), "--device", "cpu", "--steps", "5",
                 "--out", str(out), "--log-jsonl", str(tmp_path / "log.jsonl")]) == 0
    printed = capsys.readouterr().out
    shown = f"(predicted {predicted['step_s']:.3f})"
    assert sum(shown in line for line in printed.splitlines() if line.startswith("step ")) == 5
    logs = [json.loads(line) for line in (tmp_path / "log.jsonl").read_text().splitlines()]
    assert {log["predicted_step_s"] for log in logs} == {predicted["step_s"]}
    check = json.loads((out / "prediction-check.json").read_text())
    assert check["predicted_step_s"] == predicted["step_s"]
    assert check["predicted_gpu_allocated_bytes"] == predicted["gpu_allocated_peak_bytes"]
    assert check["predicted_host_bytes"] == predicted["peak_host_bytes"]
    assert (check["first_step"], check["last_step"]) == (3, 5)  # after the warm-up steps
    steady = sorted(log["step_s"] for log in logs[2:])
    assert check["measured_step_s"] == steady[1]  # their median
    assert check["errors"]["step_s"] == pytest.approx(
        predicted["step_s"] / check["measured_step_s"] - 1)
    assert check["errors"]["gpu_allocated_bytes"] is None  # a CPU run has no GPU peak
    assert "prediction on h200-bench" in printed and "median of steps 3-5" in printed
    assert "this run is on the CPU" in printed
    # the CPU AdamW with no copy beside it, where both traces had such a task (here the
    # h200-bench profile's AdamW against two CPU cores')
    alone = check["predicted_adamw_alone_params_per_s"], check["measured_adamw_alone_params_per_s"]
    if None in alone:
        assert "CPU AdamW alone" not in printed
    else:
        assert check["errors"]["adamw_alone_params_per_s"] == pytest.approx(
            alone[0] / alone[1] - 1)
        assert f"CPU AdamW alone {alone[0] / 1e9:.2f} against {alone[1] / 1e9:.2f}" in printed
    assert (out / "prediction-timeline.png").stat().st_size > 10_000


def test_train_says_when_short_segments_put_fills_into_every_measured_step(
        model_dir, data_file, tmp_path, capsys):
    args = ["train", "--model", str(model_dir), "--micro-batch", "2", "--seq-len", "16",
            "--data", str(data_file), "--device", "cpu", "--steps", "3"]
    assert main([*args, "--segment-steps", "1"]) == 0
    assert "drained its pipeline every 1 step(s)" in capsys.readouterr().out
    assert main(args) == 0
    assert "drained its pipeline" not in capsys.readouterr().out


def test_a_train_runs_check_refines_its_profiles_adamw(model_dir, data_file, tmp_path, capsys,
                                                        monkeypatch):
    monkeypatch.setenv("LAYERSLIDE_CPU_NICE", "0")
    out = tmp_path / "run"
    assert main(["train", "--model", str(model_dir), "--data", str(data_file), "--device", "cpu",
                 "--steps", "5", "--micro-batch", "2", "--seq-len", "16", "--out", str(out)]) == 0
    check = json.loads((out / "prediction-check.json").read_text())
    base = load_profile(check["profile"]).host.adamw_params_per_s
    assert check["profile_adamw_params_per_s"] == base  # the figure the prediction used
    capsys.readouterr()
    refined = tmp_path / "refined.toml"
    # a tiny model on two cores against the H200's profile is no machine's rate: forced
    rc = main(["refine", "--from-run", str(out), "--out", str(refined), "--force"])
    if check["measured_adamw_alone_params_per_s"] is None:  # no layer update without a copy
        assert rc == 2
        assert "no CPU AdamW rate" in capsys.readouterr().err
        return
    assert rc == 0
    ratio = (check["measured_adamw_alone_params_per_s"]
             / check["predicted_adamw_alone_params_per_s"])
    assert load_profile(str(refined)).host.adamw_params_per_s == pytest.approx(ratio * base)


def test_the_tokenizer_the_data_was_read_with_is_saved_with_the_model(model_dir, data_file,
                                                                      tmp_path):
    weights_only = tmp_path / "weights"
    weights_only.mkdir()
    for name in ("config.json", "model.safetensors", "generation_config.json"):
        if (model_dir / name).is_file():
            shutil.copy(model_dir / name, weights_only / name)
    out = tmp_path / "tuned"
    assert main(["train", "--model", str(weights_only), "--tokenizer", str(model_dir),
                 "--data", str(data_file), "--device", "cpu", "--steps", "1",
                 "--micro-batch", "2", "--seq-len", "16", "--out", str(out)]) == 0
    assert AutoTokenizer.from_pretrained(out).get_vocab() == AutoTokenizer.from_pretrained(
        model_dir).get_vocab()


def test_the_resolved_options_name_files_by_absolute_paths(model_dir, data_file, tmp_path,
                                                          monkeypatch):
    from layerslide.cli.run_config import RESOLVED_NAME

    shutil.copytree(model_dir, tmp_path / "model")
    monkeypatch.chdir(tmp_path)  # every path below relative to the run's working directory
    assert main(["train", "--model", "model", "--data", data_file.name, "--device", "cpu",
                 "--steps", "1", "--micro-batch", "2", "--seq-len", "16", "--out", "out"]) == 0
    resolved = (tmp_path / "out" / RESOLVED_NAME).read_text()
    for option, path in (("model", "model"), ("data", data_file.name), ("out", "out")):
        assert f'{option} = "{tmp_path / path}"' in resolved
    monkeypatch.chdir(tmp_path.parent)  # a rerun from elsewhere finds the same files
    assert main(["train", "--config", str(tmp_path / "out" / RESOLVED_NAME), "--out",
                 str(tmp_path / "again")]) == 0


def test_a_plan_is_predicted_on_the_profile_it_was_tuned_for(model_dir, tmp_path, capsys):
    plan = build_repeatable_plan(model_from_hf_config(model_dir),
                                 TrainSpec(micro_batch=2, seq_len=16), Policy.of(window=1))
    plan.meta.update({"tuned_for_profile": "rtx4090-256gb", "tuned_for_nvme_drives": 1})
    plan.save(tmp_path / "plan.json")
    base = ["train", "--model", str(model_dir), "--plan", str(tmp_path / "plan.json"),
            "--device", "cpu", "--steps", "3", "--data", "synthetic"]
    assert main([*base, "--out", str(tmp_path / "tuned")]) == 0
    check = json.loads((tmp_path / "tuned" / "prediction-check.json").read_text())
    assert check["profile"] == "rtx4090-256gb"
    assert main([*base, "--profile", "h200-bench", "--out", str(tmp_path / "other")]) == 0
    check = json.loads((tmp_path / "other" / "prediction-check.json").read_text())
    assert check["profile"] == "h200-bench"  # --profile given: it wins
    plan.meta["tuned_for_profile"] = "my-lab-box"  # a profile file's name, not found here
    plan.save(tmp_path / "plan.json")
    capsys.readouterr()
    assert main(base) == 2
    assert "was tuned for profile my-lab-box, which is not found here" in capsys.readouterr().err


# outputs on a disk without room: refused before work, or (a disk that fills mid-run) nothing
# trained is lost
def tiny_run(model_dir, data_file, *extra: str) -> list[str]:
    return ["train", "--model", str(model_dir), "--data", str(data_file), "--device", "cpu",
            "--seq-len", "16", "--micro-batch", "2", "--lr", "1e-3", *extra]


def test_outputs_a_disk_has_no_room_for_are_refused_before_any_work(model_dir, data_file,
                                                                   small_disk, capsys):
    disk = small_disk(2_000_000)
    out, ckpt, log = disk.path / "tuned", disk.path / "ckpt", disk.path / "log.jsonl"
    assert main(tiny_run(model_dir, data_file, "--steps", "4", "--out", str(out),
                         "--checkpoint-dir", str(ckpt), "--checkpoint-every", "1",
                         "--log-jsonl", str(log))) == 2
    err = capsys.readouterr().err
    assert f"not enough room for the run's outputs: --out {out} needs " in err
    said = re.search(rf"--checkpoint-dir {re.escape(str(ckpt))} needs ([0-9.]+) MB \(3 "
                     r"checkpoint\(s\) of ([0-9.]+) MB: --keep-checkpoints 2 and the one being "
                     r"written, and ([0-9.]+) MB the store keeps free while it writes one\)", err)
    assert said, err
    need, one, slack = map(float, said.groups())
    assert need == pytest.approx(3 * one + slack, abs=0.02)  # the parts add up on the page
    assert f"--log-jsonl {log} needs 1.0" in err and "where the disk of" in err
    assert "or keep fewer checkpoints (--keep-checkpoints)" in err
    assert list(disk.path.iterdir()) == []  # nothing written, no --checkpoint-dir left
    assert main(tiny_run(model_dir, data_file, "--steps", "4", "--out", str(out),
                         "--save-every", "1", "--keep-saves", "3")) == 2
    assert ("(the model folder and 3 --save-every save(s) of it kept beside it, "
            in capsys.readouterr().err)


def test_a_disk_that_fills_costs_the_logs_and_trace_never_the_run_or_the_model(
        model_dir, data_file, tmp_path, small_disk, monkeypatch, capsys):
    disk = small_disk(8 << 20)
    log, trace, tb = disk.path / "log.jsonl", disk.path / "trace.json", disk.path / "tb"
    import layerslide.cli.train as train_cli
    start = train_cli._start

    def start_then_fill(run, trainer):  # another process takes the room once the run began
        start(run, trainer)
        disk.fill()
    monkeypatch.setattr(train_cli, "_start", start_then_fill)
    out = tmp_path / "tuned"
    assert main(tiny_run(model_dir, data_file, "--steps", "3", "--out", str(out),
                         "--log-jsonl", str(log), "--trace-out", str(trace),
                         "--tensorboard", str(tb))) == 0
    captured = capsys.readouterr()
    assert "step 3/3" in captured.out and f"saved the fine-tuned model to {out}" in captured.out
    assert captured.err.count(f"--log-jsonl {log}: writing failed (No space left on device); "
                              "the run goes on without it (its last whole record is of no "
                              "step)") == 1
    assert captured.err.count(f"--tensorboard {tb}: writing failed") == 1
    assert f"--trace-out {trace}: writing the trace failed (No space left on device)" \
        in captured.err
    assert "Traceback" not in captured.err
    assert not trace.exists() and log.read_text() == ""  # no half record, no partial trace
    assert AutoModelForCausalLM.from_pretrained(out) is not None


def test_a_full_disk_at_the_final_save_keeps_the_checkpoint_and_says_the_way_back(
        model_dir, data_file, small_disk, monkeypatch, capsys):
    from layerslide.training.checkpoint_store import CheckpointStore
    from layerslide.training.trainer import Trainer

    disk = small_disk(32 << 20)
    out, ckpt = disk.path / "tuned", disk.path / "ckpt"
    save = Trainer.save

    def fill_then_save(self, folder, **kwargs):  # the disk fills once the last checkpoint is in
        disk.fill()
        return save(self, folder, **kwargs)
    monkeypatch.setattr(Trainer, "save", fill_then_save)
    assert main(tiny_run(model_dir, data_file, "--steps", "3", "--out", str(out),
                         "--checkpoint-dir", str(ckpt))) == 1
    err = capsys.readouterr().err
    assert f"writing the model to {out} failed: the disk is full" in err
    assert "the partial copy is deleted" in err
    assert (f"nothing trained is lost: checkpoint {ckpt / 'step-000000003'} holds the state of "
            f"step 3; free ") in err
    assert f"write it with `layerslide export {ckpt} --out {out}`" in err
    latest = CheckpointStore(ckpt).latest()
    assert latest.step == 3
    CheckpointStore(ckpt).verify(latest)  # whole: every checksum holds
    assert not out.exists() and not list(disk.path.glob(".tuned.tmp-*"))
    disk.free()  # room again: the command it said writes the trained model
    assert main(["export", str(ckpt), "--out", str(out)]) == 0
    assert f"exported step 3 ({latest.path}) to {out}" in capsys.readouterr().out
    assert AutoModelForCausalLM.from_pretrained(out).num_parameters() > 0


def test_a_save_along_the_way_that_finds_no_room_is_said_and_training_goes_on(
        model_dir, data_file, small_disk, monkeypatch, capsys):
    from layerslide.training.model_saves import ModelSaves

    disk = small_disk(8 << 20)
    out = disk.path / "tuned"
    save = ModelSaves.save

    def save_on_a_full_disk(self, trainer, step, *args, **kwargs):
        disk.fill()
        try:
            return save(self, trainer, step, *args, **kwargs)
        finally:
            disk.free()
    monkeypatch.setattr(ModelSaves, "save", save_on_a_full_disk)
    assert main(tiny_run(model_dir, data_file, "--steps", "3", "--out", str(out),
                         "--save-every", "2")) == 0
    captured = capsys.readouterr()
    assert (f"warning: --save-every: writing the model to {disk.path / 'tuned-step-2'} failed: "
            "the disk is full") in captured.err
    assert "training goes on" in captured.err and "step 3/3" in captured.out
    assert (out / "config.json").is_file() and not (disk.path / "tuned-step-2").exists()
    assert not list(disk.path.glob(".tuned-step-2.tmp-*"))
