"""Chat records from the Python standard library's docstrings (real text, offline) and a BPE
tokenizer with a chat template trained on them: the data of the packing benchmark."""

import argparse
import importlib
import inspect
import json
import pkgutil
import random
import sys
from pathlib import Path

TEMPLATE = ("{{ bos_token }}{% for m in messages %}<|{{ m['role'] }}|>\n{{ m['content'] }}"
            "{{ eos_token }}\n{% endfor %}{% if add_generation_prompt %}<|assistant|>\n{% endif %}")


def docstrings(limit: int):
    seen = set()
    for info in sorted(pkgutil.iter_modules(), key=lambda m: m.name):
        if info.name.startswith("_") or info.name in ("antigravity", "this", "idlelib", "tkinter",
                                                      "turtle", "turtledemo"):
            continue
        if info.name not in sys.stdlib_module_names:
            continue
        try:
            module = importlib.import_module(info.name)
        except (ImportError, OSError, RuntimeError):  # platform-only or side-effect modules
            continue
        members = []
        for name, obj in inspect.getmembers(module):
            members.append((name, obj))
            if inspect.isclass(obj) and getattr(obj, "__module__", "") == module.__name__:
                members += [(f"{name}.{n}", o) for n, o in vars(obj).items()
                            if inspect.isfunction(o)]
        for name, obj in members:
            if name.startswith("_") or not (inspect.isfunction(obj) or inspect.isclass(obj)):
                continue
            doc = inspect.getdoc(obj)
            if not doc or len(doc) < 80 or doc in seen:
                continue
            seen.add(doc)
            yield f"{info.name}.{name}", doc
            if len(seen) >= limit:
                return


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", required=True)
    parser.add_argument("--limit", type=int, default=6000)
    args = parser.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    questions = ["What does {} do?", "Explain {} from the Python standard library.",
                 "How do I use {}?", "Describe {}."]
    rng = random.Random(0)
    records = [{"messages": [{"role": "user", "content": rng.choice(questions).format(name)},
                             {"role": "assistant", "content": doc}]}
               for name, doc in docstrings(args.limit)]
    with open(out / "chat.jsonl", "w") as f:
        f.writelines(json.dumps(r) + "\n" for r in records)
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast
    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    specials = ["<unk>", "<s>", "</s>", "<pad>", "<|user|>", "<|assistant|>", "<|system|>"]
    trainer = trainers.BpeTrainer(vocab_size=8192, special_tokens=specials,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator((m["content"] for r in records for m in r["messages"]), trainer)
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<s>", eos_token="</s>",
                                   pad_token="<pad>", unk_token="<unk>")
    fast.chat_template = TEMPLATE
    fast.save_pretrained(out / "tokenizer")
    print(f"{len(records)} conversations in {out / 'chat.jsonl'}")


if __name__ == "__main__":
    main()
