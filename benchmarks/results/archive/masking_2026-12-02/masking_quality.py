"""Replies-only loss against training on every token, on real text: chat records made from the
standard library's docstrings (make_chat_data.py), a small Llama trained from the same random
weights twice, with the loss on the replies (the default) and with --train-on-prompt. Every
--save-every folder of both runs is scored on the held-out conversations' replies with
transformers itself, so both curves measure the same thing. With --pretrain-steps N both start
instead from a base trained N steps on other text of the same language (the Python reference
topics the stdlib ships in pydoc_data.topics), as fine-tuning starts from a pretrained model."""

import argparse
import json
import subprocess
import sys
from pathlib import Path

import torch

HERE = Path(__file__).resolve().parent


def train(out: Path, data: Path, model: Path, tokenizer: Path, extra: list[str], args,
          name: str | None = None, steps: int | None = None) -> Path:
    run = out / (name or ("all_tokens" if extra else "replies"))
    cmd = [sys.executable, "-m", "layerslide.cli.main", "train", "--model", str(model),
           "--tokenizer", str(tokenizer), "--data", str(data), "--device", "cpu",
           "--steps", str(steps or args.steps), "--micro-batch", "8", "--seq-len", "256",
           "--packing", "on", "--lr", str(args.lr), "--warmup-steps", "10",
           "--eval-fraction", "0.05", "--eval-every", str(args.every), "--seed", "0",
           "--out", str(run / "final"), "--save-every", str(args.every),
           "--keep-saves", "1000", "--log-jsonl", str(run / "log.jsonl"), *extra]
    run.mkdir(parents=True, exist_ok=True)
    print(" ".join(cmd), flush=True)
    with open(run / "stdout.txt", "w") as stdout:
        subprocess.run(cmd, check=True, stdout=stdout, stderr=subprocess.STDOUT)
    return run


def pretrain(args, init: Path, tokenizer: Path) -> Path:
    """The base both runs start from: init trained on the stdlib's reference topics (English
    about Python, none of it the docstrings the chat records hold)."""
    from pydoc_data.topics import topics
    corpus = args.out / "pretrain.jsonl"
    with open(corpus, "w") as f:
        f.writelines(json.dumps({"text": text}) + "\n" for text in topics.values())
    run = train(args.out, corpus, init, tokenizer, [], args, name="pretrain",
                steps=args.pretrain_steps)
    return run / "final"


def held_out_reply_loss(folder: Path, batches) -> float:
    from transformers import AutoModelForCausalLM
    model = AutoModelForCausalLM.from_pretrained(folder, torch_dtype=torch.float32).eval()
    total, count = 0.0, 0
    with torch.no_grad():
        for ids, labels, *_ in batches:  # scored unpacked: one conversation a row
            logits = model(input_ids=ids).logits
            valid = labels != -100
            total += float(torch.nn.functional.cross_entropy(logits[valid], labels[valid],
                                                             reduction="sum"))
            count += int(valid.sum())
    return total / count


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--steps", type=int, default=150)
    parser.add_argument("--every", type=int, default=25)
    parser.add_argument("--lr", type=float, default=2e-3)
    parser.add_argument("--pretrain-steps", type=int, default=0,
                        help="first train the base this many steps on the reference topics")
    args = parser.parse_args()
    data_dir = args.out / "data"
    subprocess.run([sys.executable, str(HERE / "make_chat_data.py"), "--out", str(data_dir)],
                   check=True)
    from transformers import LlamaConfig, LlamaForCausalLM
    model = args.out / "init"
    torch.manual_seed(0)
    LlamaForCausalLM(LlamaConfig(hidden_size=256, intermediate_size=688, num_hidden_layers=4,
                                 num_attention_heads=4, num_key_value_heads=2,
                                 vocab_size=8192, max_position_embeddings=512,
                                 tie_word_embeddings=True)).save_pretrained(model)
    data, tokenizer = data_dir / "chat.jsonl", data_dir / "tokenizer"
    if args.pretrain_steps:
        model = pretrain(args, model, tokenizer)
    runs = {"replies": train(args.out, data, model, tokenizer, [], args),
            "all_tokens": train(args.out, data, model, tokenizer, ["--train-on-prompt"], args)}
    from layerslide.executor.data import eval_batches, split_token_sources
    _, held = split_token_sources(data, eval_fraction=0.05, tokenizer_dir=tokenizer,
                                  vocab_size=8192, seq_len=256, seed=0, packing=False)
    batches = eval_batches(held, micro_batch=8, max_rows=10_000)
    results = {"held_out_conversations": held.num_examples, "held_out_reply_tokens":
               held.num_trained, "steps": args.steps, "curves": {}}
    for name, run in runs.items():
        folders = sorted(run.glob("final-step-*"), key=lambda p: int(p.name.rsplit("-", 1)[1]))
        points = [(0, model)] + [(int(p.name.rsplit("-", 1)[1]), p) for p in folders] + [
            (args.steps, run / "final")]
        curve = [(step, held_out_reply_loss(folder, batches)) for step, folder in points]
        train_log = [json.loads(line) for line in (run / "log.jsonl").read_text().splitlines()]
        results["curves"][name] = {
            "held_out_reply_loss": curve,
            "train_loss": [(r["step"], r["loss"]) for r in train_log if "loss" in r]}
        print(name, "held-out reply loss", [(s, round(v, 4)) for s, v in curve], flush=True)
    (args.out / "results.json").write_text(json.dumps(results, indent=1))
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, (left, right) = plt.subplots(1, 2, figsize=(10, 4))
    labels = {"replies": "loss on replies (default)", "all_tokens": "--train-on-prompt"}
    for name, curve in results["curves"].items():
        steps, losses = zip(*curve["held_out_reply_loss"], strict=True)
        left.plot(steps, losses, marker="o", label=labels[name])
        steps, losses = zip(*curve["train_loss"], strict=True)
        right.plot(steps, losses, label=labels[name])
    left.set(title="held-out replies: loss (transformers)", xlabel="step", ylabel="nats/token")
    right.set(title="training loss (of the tokens each trains on)", xlabel="step")
    left.legend()
    right.legend()
    fig.tight_layout()
    fig.savefig(args.out / "masking.png", dpi=120)


if __name__ == "__main__":
    main()
