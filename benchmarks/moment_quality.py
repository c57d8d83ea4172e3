"""Training quality of compact AdamW moments: fp32, bf16 and int8 m and v on real text.

One small Llama (about 30M parameters with the defaults) is initialised once from a fixed seed
and trained from those same weights once per moment precision (Residency.moment_precision, the
CLI's --moment-precision), on the same batches in the same order, through layerslide's executor
with the default policy otherwise (AdamW lr 1e-3, 100 warmup steps then cosine to 1e-4, weight
decay 0.1, gradients clipped at norm 1). What is measured, per precision: the training loss of
every optimizer step, and the mean next-token cross-entropy on a fixed set of held-out windows
every --eval-every steps and at the end, computed by transformers' own Llama (fp32) from the bf16
folder Trainer.save writes; summary.txt sets the final values against fp32's.

The text is the source of the Python standard library this interpreter runs on (its .py files
without the test suites and site-packages), so it needs no download; it differs between Python
versions, so results of different interpreters are not comparable (results.json records which).
Files go to train or held-out by a hash of their path (about 5% held out). A byte-level BPE
tokenizer (vocab 8192) is trained on the train split and saved with the model folder. With the
defaults (1200 steps of 16 x 512 tokens) a run reads the train split about 3.4 times (Python
3.11's: 690 files, 2.9M tokens), so the held-out loss may turn up late in the run.

A precision the executor refuses (or that fails mid-run) is recorded with its error, and the
others still run. Writes results.json, summary.txt and loss_curves.png (matplotlib) to --out.

    PYTHONPATH=. python3 benchmarks/moment_quality.py --out benchmarks/results/moment_quality_<date>
    PYTHONPATH=. python3 benchmarks/moment_quality.py --out /tmp/mq --device cpu --hidden 64 \\
        --layers 2 --heads 2 --intermediate 128 --vocab-size 1024 --seq-len 64 --micro-batch 2 \\
        --steps 30 --warmup-steps 5 --eval-every 10 --eval-windows 8 --precisions fp32,bf16
    # each precision in a call of its own (e.g. under a 10-minute limit), then one report:
    PYTHONPATH=. python3 benchmarks/moment_quality.py --out /tmp/mq_int8 --precisions int8
    PYTHONPATH=. python3 benchmarks/moment_quality.py --plot-only /tmp/mq_*/results.json --out /tmp/mq
"""

from __future__ import annotations

import argparse
import gc
import hashlib
import importlib.metadata
import json
import platform
import subprocess
import sys
import sysconfig
import tempfile
import time
import traceback
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

import torch
import torch.nn.functional as F

from layerslide.cli.options import with_env_overrides
from layerslide.data.files import RecordTable
from layerslide.data.formats import Corpus, Encoder, tokenize_tables
from layerslide.data.sources import DatasetTokens
from layerslide.executor.optim import OptimConfig
from layerslide.kernels.linear_cross_entropy import IGNORE_INDEX
from layerslide.planner.build import build_repeatable_plan
from layerslide.planner.model import resolve_model
from layerslide.planner.settings import MOMENT_PRECISIONS, Policy, TrainSpec
from layerslide.training.trainer import StepLog, Trainer

REPO = Path(__file__).resolve().parent.parent
# folders of the standard library that are not its own source: test suites and installed packages
EXCLUDED_FOLDERS = frozenset({"site-packages", "dist-packages", "test", "tests", "idle_test"})
BOS, EOS = "<|bos|>", "<|eos|>"
TEXT_FIELD = "text"
FINAL_TRAIN_STEPS = 50  # the final training loss is the mean of this many last steps
SMOOTH_STEPS = 20  # moving average of the plotted training loss


# --- corpus -------------------------------------------------------------------------------------
@dataclass(frozen=True)
class SourceFile:
    path: str  # relative to the standard library's folder, with '/' separators
    text: str


def read_stdlib(root: Path) -> list[SourceFile]:
    """The standard library's own .py files in path order, leaving out test suites, installed
    packages, files that are not UTF-8 and empty ones (bare __init__.py)."""
    files = []
    for path in sorted(root.rglob("*.py")):
        relative = path.relative_to(root)
        if EXCLUDED_FOLDERS & set(relative.parts[:-1]):
            continue
        try:
            text = path.read_text(encoding="utf-8")
        except (UnicodeDecodeError, OSError):
            continue
        if text.strip():
            files.append(SourceFile(relative.as_posix(), text))
    return files


def is_heldout(relative_path: str, heldout_percent: float) -> bool:
    """A file's split from a hash of its path alone: the same on every machine and run, and
    unchanged for the other files when one is added or removed."""
    digest = hashlib.sha256(relative_path.encode()).digest()
    return int.from_bytes(digest[:8], "big") / 2**64 * 100 < heldout_percent


def split_files(files: list[SourceFile], heldout_percent: float,
                ) -> tuple[list[SourceFile], list[SourceFile]]:
    train = [f for f in files if not is_heldout(f.path, heldout_percent)]
    heldout = [f for f in files if is_heldout(f.path, heldout_percent)]
    if not train or not heldout:
        raise SystemExit(f"--heldout-percent {heldout_percent} leaves a split of the "
                         f"{len(files)} files empty; choose a percentage between them")
    return train, heldout


# --- tokenizer and model ------------------------------------------------------------------------
def train_tokenizer(texts: list[str], vocab_size: int):
    """A byte-level BPE (GPT-2's pre-tokenisation, so any text encodes) trained on `texts`, as a
    transformers fast tokenizer that brackets each document with BOS and EOS ids."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    bpe = Tokenizer(models.BPE())
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    bpe.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=[BOS, EOS],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  show_progress=False)
    bpe.train_from_iterator(texts, trainer=trainer, length=len(texts))
    return PreTrainedTokenizerFast(tokenizer_object=bpe, bos_token=BOS, eos_token=EOS,
                                   model_max_length=1 << 30)


def llama_config(args, tokenizer):
    from transformers import LlamaConfig

    return LlamaConfig(
        vocab_size=args.vocab_size, hidden_size=args.hidden, intermediate_size=args.intermediate,
        num_hidden_layers=args.layers, num_attention_heads=args.heads,
        num_key_value_heads=args.kv_heads or args.heads, max_position_embeddings=args.seq_len,
        rope_theta=10000.0, rms_norm_eps=1e-5, tie_word_embeddings=not args.untied_embeddings,
        attention_dropout=0.0,  # the executor recomputes forwards and refuses dropout
        bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id,
        pad_token_id=None)


def write_model_folder(folder: Path, args, tokenizer) -> dict:
    """The initial weights every run starts from (HF's initialisation, seeded), as an HF folder
    with the tokenizer beside them, for Trainer.load_checkpoint and AutoTokenizer."""
    from transformers import LlamaForCausalLM

    torch.manual_seed(args.seed)
    model = LlamaForCausalLM(llama_config(args, tokenizer))
    params = sum(p.numel() for p in model.parameters())  # a tied head is counted once
    model.save_pretrained(folder)  # safetensors: transformers 5's only format
    tokenizer.save_pretrained(folder)
    del model
    return {"params": params, "weights_sha256": _file_sha256(folder / "model.safetensors"),
            "tokenizer_sha256": _file_sha256(folder / "tokenizer.json")}


def load_tokenizer(folder: Path):
    """The folder's tokenizer as layerslide's data module loads it, checked to have kept the
    BOS and EOS ids that bracket each document."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(folder, local_files_only=True)
    if tokenizer.bos_token != BOS or tokenizer.eos_token != EOS:
        raise SystemExit(f"{folder}: the saved tokenizer lost its BOS/EOS tokens "
                         f"({tokenizer.bos_token!r}, {tokenizer.eos_token!r})")
    return tokenizer


def _file_sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


# --- tokens -------------------------------------------------------------------------------------
def encode_files(tokenizer, files: list[SourceFile], name: str) -> Corpus:
    """The files tokenised by layerslide's own text encoder (BOS + text + EOS, one document a
    file), as `layerslide train` does a text data file's records. In memory: a .jsonl file would
    need the `datasets` library, which the GPU machine's image lacks."""
    records = [{TEXT_FIELD: f.text} for f in files]
    table = RecordTable(path=Path(name), columns=(TEXT_FIELD,),
                        batches=lambda: (records[i:i + 64] for i in range(0, len(records), 64)),
                        where=lambda index: files[index].path, plain_text=True)
    encoder = Encoder(tokenizer, "text", TEXT_FIELD, train_on_prompt=False)
    return tokenize_tables([table], encoder)


def train_stream(corpus: Corpus, tokenizer, seq_len: int, seed: int) -> DatasetTokens:
    """A fresh stream of the train split's packed windows; the same seed gives every run the
    same batches in the same order."""
    return DatasetTokens(corpus, vocab_size=len(tokenizer), seq_len=seq_len, seed=seed,
                         packing=True, pad_id=tokenizer.eos_token_id, data_format="text",
                         train_on_prompt=False, files=["stdlib-train"])


def heldout_windows(corpus: Corpus, seq_len: int, count: int,
                    ) -> tuple[torch.Tensor, torch.Tensor]:
    """`count` windows of the held-out stream (files in path order, end to end), spread evenly
    over it so that no few files dominate, as (input_ids, labels) shaped like training rows:
    labels are the next tokens, IGNORE_INDEX where training puts no loss (the BOS ids)."""
    available = (len(corpus.ids) - 1) // seq_len
    if available < 1:
        raise SystemExit(f"the held-out split has {len(corpus.ids)} tokens, fewer than one "
                         f"window of --seq-len {seq_len} + 1: raise --heldout-percent")
    picked = sorted({round(i * (available - 1) / max(count - 1, 1))
                     for i in range(min(count, available))})
    rows = [slice(w * seq_len, w * seq_len + seq_len + 1) for w in picked]
    ids = torch.stack([corpus.ids[r] for r in rows]).to(torch.int64)
    trained = torch.stack([corpus.trained[r] for r in rows])
    labels = torch.where(trained[:, 1:], ids[:, 1:], IGNORE_INDEX)
    return ids[:, :-1].contiguous(), labels.contiguous()


@torch.no_grad()
def heldout_loss(folder: Path, windows: tuple[torch.Tensor, torch.Tensor], *, device: str,
                 dtype: torch.dtype, batch: int) -> float:
    """Mean next-token cross-entropy (nats) of an HF folder's model over the held-out windows,
    by transformers' own Llama: an evaluation independent of the executor that trained it."""
    from transformers import LlamaForCausalLM

    model = LlamaForCausalLM.from_pretrained(folder, dtype=dtype).to(device).eval()
    inputs, labels = windows
    total, counted = 0.0, 0
    for start in range(0, len(inputs), batch):
        x = inputs[start:start + batch].to(device)
        y = labels[start:start + batch].to(device)
        logits = model(input_ids=x).logits.float()
        total += float(F.cross_entropy(logits.flatten(0, 1), y.flatten(),
                                       ignore_index=IGNORE_INDEX, reduction="sum"))
        counted += int((y != IGNORE_INDEX).sum())
    del model
    return total / counted


# --- one training run ---------------------------------------------------------------------------
@dataclass(frozen=True)
class Setup:
    """What every run shares: the model folder, the data and the settings."""

    model_dir: Path
    snapshot_dir: Path  # scratch: each evaluation's weights
    train_corpus: Corpus
    windows: tuple[torch.Tensor, torch.Tensor]
    tokenizer: object
    args: argparse.Namespace


def optim_of(args) -> OptimConfig:
    """AdamW and the schedule as `layerslide train` makes them from the same flags."""
    return OptimConfig(lr=args.lr, weight_decay=args.weight_decay,
                       warmup_steps=args.warmup_steps, min_lr_ratio=args.min_lr_ratio,
                       decay_steps=max(1, args.steps - args.warmup_steps))


def make_trainer(setup: Setup, precision: str) -> Trainer:
    """A Trainer for the model folder as `layerslide train` builds one: the folder's spec, a
    repeatable plan of the default policy with this moment precision, the same optimizer."""
    from transformers import AutoConfig

    args = setup.args
    spec = resolve_model(setup.model_dir)
    config = AutoConfig.from_pretrained(setup.model_dir, local_files_only=True)
    train = TrainSpec(micro_batch=args.micro_batch, seq_len=args.seq_len,
                      grad_accum=args.grad_accum, max_grad_norm=args.max_grad_norm)
    policy = with_env_overrides(Policy.of(moment_precision=precision))
    plan = build_repeatable_plan(spec, train, policy)
    return Trainer(config=config, plan=plan, optim=optim_of(args), device=args.device,
                   segment_steps=args.segment_steps, keep_trace=False)


def eval_steps(steps: int, every: int) -> list[int]:
    """The steps after which the held-out loss is measured: 0 (the initial weights), every
    `every` steps, and the last."""
    return sorted({0, *range(every, steps, every), steps})


class StepRecorder:
    """Keeps every step's log as it drains (so a run that fails keeps the steps it made) and
    prints a progress line every `every` steps."""

    def __init__(self, precision: str, total: int, every: int):
        self.precision, self.total, self.every = precision, total, every
        self.logs: list[StepLog] = []

    def __call__(self, log: StepLog) -> None:
        self.logs.append(log)
        done = log.step + 1
        if done % self.every == 0 or done == self.total or log.skipped:
            skipped = " SKIPPED (non-finite grads)" if log.skipped else ""
            norm = "" if log.grad_norm is None else f" | grad norm {log.grad_norm:.3f}"
            print(f"[{self.precision}] step {done}/{self.total} | loss {log.loss:.4f} | "
                  f"lr {log.lr:.2e}{norm} | {log.step_s * 1e3:.1f} ms{skipped}", flush=True)

    def columns(self) -> dict[str, list]:
        """The logs column by column (results.json stays small and plots read it directly)."""
        return {"step": [log.step + 1 for log in self.logs],
                "loss": [log.loss for log in self.logs], "lr": [log.lr for log in self.logs],
                "grad_norm": [log.grad_norm for log in self.logs],
                "skipped": [log.skipped for log in self.logs],
                "step_s": [log.step_s for log in self.logs],
                "tokens_per_s": [log.tokens_per_s for log in self.logs]}


def run_precision(setup: Setup, precision: str) -> dict:
    """Train the initial weights with one moment precision; the held-out loss at eval_steps.
    Any failure is returned as the run's error, with what was measured before it."""
    args = setup.args
    recorder = StepRecorder(precision, args.steps, args.log_every)
    evals: list[dict] = []
    started = time.perf_counter()
    snapshot = setup.snapshot_dir / precision
    dtype = {"bf16": torch.bfloat16, "fp32": torch.float32}[args.eval_dtype]
    try:
        with make_trainer(setup, precision) as trainer:
            trainer.load_checkpoint(setup.model_dir)
            stream = train_stream(setup.train_corpus, setup.tokenizer, args.seq_len, args.seed)
            for step in eval_steps(args.steps, args.eval_every):
                if step > trainer.step:  # fit() goes on from the trainer's step and the stream's
                    trainer.fit(stream, step - trainer.step, on_step=recorder)
                eval_started = time.perf_counter()
                trainer.save(snapshot, overwrite=True)  # bf16, as `layerslide train --out`
                loss = heldout_loss(snapshot, setup.windows, device=args.device, dtype=dtype,
                                    batch=args.micro_batch)
                evals.append({"step": step, "heldout_loss": loss,
                              "eval_s": time.perf_counter() - eval_started})
                print(f"[{precision}] eval after step {step}: held-out loss {loss:.4f}",
                      flush=True)
        status, error = "ok", None
    except Exception as err:  # noqa: BLE001 (recorded: the other precisions still run)
        status = "failed"
        error = {"type": type(err).__name__, "message": str(err),
                 "traceback": traceback.format_exc()}
        print(f"[{precision}] FAILED: {type(err).__name__}: {err}", flush=True)
    finally:
        _release_memory()
    steps = recorder.columns()
    return {"precision": precision, "status": status, "error": error,
            "wall_s": time.perf_counter() - started, "steps": steps, "evals": evals,
            "final_train_loss": _mean_tail(steps["loss"], FINAL_TRAIN_STEPS),
            "final_heldout_loss": evals[-1]["heldout_loss"] if status == "ok" else None,
            "median_step_s": _median(steps["step_s"][1:] or steps["step_s"])}


def _release_memory() -> None:
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


def _mean_tail(values: list[float], count: int) -> float | None:
    tail = values[-count:]
    return sum(tail) / len(tail) if tail else None


def _median(values: list[float]) -> float | None:
    ordered = sorted(values)
    return ordered[len(ordered) // 2] if ordered else None


# --- the whole benchmark ------------------------------------------------------------------------
def prepare(args, work: Path) -> tuple[Setup, dict]:
    """Corpus, tokenizer, initial model and held-out windows; returns the setup and what it
    measured of them (sizes, hashes, seconds) for results.json."""
    timings = {}
    clock = time.perf_counter()
    root = Path(sysconfig.get_paths()["stdlib"])
    train_files, heldout_files = split_files(read_stdlib(root), args.heldout_percent)
    timings["read_corpus_s"] = time.perf_counter() - clock
    print(f"corpus: {root}: {len(train_files)} train and {len(heldout_files)} held-out files "
          f"({timings['read_corpus_s']:.1f} s)", flush=True)

    clock = time.perf_counter()
    tokenizer = train_tokenizer([f.text for f in train_files], args.vocab_size)
    timings["train_tokenizer_s"] = time.perf_counter() - clock
    if len(tokenizer) > args.vocab_size:
        raise SystemExit(f"the tokenizer has {len(tokenizer)} ids, more than --vocab-size "
                         f"{args.vocab_size}")
    print(f"tokenizer: byte-level BPE of {len(tokenizer)} ids "
          f"({timings['train_tokenizer_s']:.1f} s)", flush=True)

    model_dir = work / "initial_model"
    model = write_model_folder(model_dir, args, tokenizer)
    tokenizer.save_pretrained(args.out / "tokenizer")  # small: kept with the results
    tokenizer = load_tokenizer(model_dir)  # from here on, what `layerslide train` would read

    clock = time.perf_counter()
    train_corpus = encode_files(tokenizer, train_files, "stdlib-train")
    heldout_corpus = encode_files(tokenizer, heldout_files, "stdlib-heldout")
    timings["encode_s"] = time.perf_counter() - clock
    windows = heldout_windows(heldout_corpus, args.seq_len, args.eval_windows)
    train_tokens = len(train_corpus.ids)
    epochs = args.steps * args.micro_batch * args.grad_accum * args.seq_len / train_tokens
    print(f"tokens: {train_tokens:,} train, {len(heldout_corpus.ids):,} held-out "
          f"({timings['encode_s']:.1f} s); {model['params'] / 1e6:.1f}M params; "
          f"{epochs:.2f} epochs of the train split; {len(windows[0])} held-out windows of "
          f"{args.seq_len} tokens", flush=True)

    corpus = {"stdlib": str(root), "python": platform.python_version(),
              "heldout_percent": args.heldout_percent,
              "train": _split_stats(train_files, train_corpus),
              "heldout": _split_stats(heldout_files, heldout_corpus),
              "train_epochs": epochs, "eval_windows": len(windows[0]),
              "eval_tokens": int((windows[1] != IGNORE_INDEX).sum())}
    setup = Setup(model_dir=model_dir, snapshot_dir=work / "snapshots",
                  train_corpus=train_corpus, windows=windows, tokenizer=tokenizer, args=args)
    return setup, {"corpus": corpus, "model": model, "timings": timings}


def _split_stats(files: list[SourceFile], corpus: Corpus) -> dict:
    return {"files": len(files), "chars": sum(len(f.text) for f in files),
            "tokens": len(corpus.ids)}


def environment() -> dict:
    import layerslide

    def version(name: str) -> str | None:
        try:
            return importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            return None

    return {"python": platform.python_version(), "torch": torch.__version__,
            "transformers": version("transformers"), "tokenizers": version("tokenizers"),
            "layerslide": layerslide.__version__, "git_commit": _git("rev-parse", "HEAD"),
            "git_changes": bool(_git("status", "--porcelain", "--untracked-files=no")),
            "cuda_device": (torch.cuda.get_device_name() if torch.cuda.is_available() else None),
            "host": platform.node(), "date": datetime.now(UTC).isoformat(timespec="seconds")}


def _git(*command: str) -> str | None:
    """A git command's output in the repository, or None (e.g. a copy of the tree without .git)."""
    try:
        return subprocess.run(["git", *command], cwd=REPO, capture_output=True, text=True,
                              check=True, timeout=10).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return None


def settings_of(args) -> dict:
    """The flags that define the experiment (not where its outputs go)."""
    skipped = {"out", "work_dir", "plot_only", "precisions", "log_every"}
    return {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()
            if k not in skipped}


def run_benchmark(args) -> dict:
    args.out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="moment-quality-") as scratch:
        work = args.work_dir or Path(scratch)
        setup, prepared = prepare(args, work)
        results = {"settings": settings_of(args), "environment": environment(), **prepared,
                   "runs": {}}
        for precision in args.precisions:
            print(f"== {precision} moments", flush=True)
            # each run's own copy: runs made in separate calls keep theirs when merged
            results["runs"][precision] = {**run_precision(setup, precision),
                                          "environment": results["environment"]}
            write_outputs(results, args.out)  # after each run: a later failure loses nothing
    return results


# --- outputs ------------------------------------------------------------------------------------
def summary_table(results: dict) -> str:
    """Precision, final train loss, final held-out loss, and the held-out loss against fp32."""
    runs = results["runs"]
    base = runs.get("fp32", {}).get("final_heldout_loss")
    header = (f"{'precision':<10} {'status':<7} {'train loss':>11} {'held-out':>9} "
              f"{'vs fp32':>9} {'vs fp32 %':>10} {'ms/step':>8} {'wall s':>8}")
    note = (f"train loss: mean of the last {FINAL_TRAIN_STEPS} steps; held-out: mean "
            "next-token cross-entropy (nats) after the last step")
    lines = [note, header, "-" * len(header)]
    for precision, run in runs.items():
        heldout = run["final_heldout_loss"]
        diff = None if heldout is None or base is None else heldout - base
        percent = None if diff is None else 100 * diff / base
        step_ms = None if run["median_step_s"] is None else 1e3 * run["median_step_s"]
        lines.append(
            f"{precision:<10} {run['status']:<7} {_num(run['final_train_loss'], 11)} "
            f"{_num(heldout, 9)} {_num(diff, 9, sign='+')} {_num(percent, 10, '.3f', '+')} "
            f"{_num(step_ms, 8, '.1f')} {run['wall_s']:>8.0f}")
    for precision, run in runs.items():
        if run["error"]:
            lines.append(f"{precision} failed: {run['error']['type']}: {run['error']['message']}")
    return "\n".join(lines) + "\n"


def _num(value: float | None, width: int, spec: str = ".4f", sign: str = "") -> str:
    return f"{'-':>{width}}" if value is None else format(value, f"{sign}{width}{spec}")


def moving_average(values: list[float], window: int) -> list[float]:
    """Trailing mean over up to `window` values (the first points average fewer)."""
    out, total = [], 0.0
    for i, value in enumerate(values):
        total += value
        if i >= window:
            total -= values[i - window]
        out.append(total / min(i + 1, window))
    return out


def plot_curves(results: dict, path: Path) -> bool:
    """Training loss (smoothed), held-out loss, and both minus fp32's, by step."""
    try:
        import matplotlib
    except ImportError:
        print("matplotlib is not installed: no loss_curves.png (results.json holds the curves; "
              "redraw with --plot-only where it is)", file=sys.stderr)
        return False
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    runs = {p: r for p, r in results["runs"].items() if r["steps"]["step"]}
    fig, (train_ax, heldout_ax, diff_ax) = plt.subplots(1, 3, figsize=(16, 4.8))
    fp32 = runs.get("fp32")
    base_heldout = {e["step"]: e["heldout_loss"] for e in fp32["evals"]} if fp32 else {}
    base_train = moving_average(fp32["steps"]["loss"], SMOOTH_STEPS) if fp32 else []
    for precision, run in runs.items():
        color = f"C{MOMENT_PRECISIONS.index(precision)}"  # one colour a precision, every panel
        label = precision + ("" if run["status"] == "ok" else " (failed)")
        steps, evals = run["steps"], run["evals"]
        smoothed = moving_average(steps["loss"], SMOOTH_STEPS)
        train_ax.plot(steps["step"], smoothed, color=color, label=label)
        heldout_ax.plot([e["step"] for e in evals], [e["heldout_loss"] for e in evals],
                        color=color, marker="o", markersize=3, label=label)
        if precision == "fp32":
            continue
        # the runs see the same batches in the same order: step by step differences are paired
        paired = [(e["step"], e["heldout_loss"] - base_heldout[e["step"]]) for e in evals
                  if e["step"] in base_heldout]
        if paired:
            diff_ax.plot(*zip(*paired, strict=True), color=color, marker="o", markersize=3,
                         label=f"{label} held-out")
        shared = min(len(smoothed), len(base_train))
        diff_ax.plot(steps["step"][:shared],
                     [a - b for a, b in zip(smoothed[:shared], base_train, strict=False)],
                     color=color, linestyle="--", linewidth=0.8, label=f"{label} train (smoothed)")
    train_ax.set(title=f"training loss ({SMOOTH_STEPS}-step moving average)", xlabel="step",
                 ylabel="cross-entropy (nats)")
    heldout_ax.set(title="held-out loss", xlabel="step", ylabel="cross-entropy (nats)")
    diff_ax.axhline(0.0, color="grey", linewidth=0.8)
    diff_ax.set(title="loss minus fp32's", xlabel="step", ylabel="nats")
    for ax in (train_ax, heldout_ax, diff_ax):
        ax.grid(alpha=0.3)
        if ax.get_legend_handles_labels()[0]:
            ax.legend()
    # the first steps' loss (about ln(vocab)) would flatten the rest of the curves
    later = [v for r in runs.values() for v in r["steps"]["loss"][len(r["steps"]["loss"]) // 10:]]
    if later:
        train_ax.set_ylim(min(later) - 0.1, max(later) + 0.1)
    model = results.get("model", {})
    fig.suptitle(f"AdamW moment precision: {model.get('params', 0) / 1e6:.1f}M-param Llama on "
                 f"the Python {results['corpus']['python']} standard library")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return True


def write_outputs(results: dict, out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    (out / "results.json").write_text(json.dumps(results, indent=1) + "\n")
    (out / "summary.txt").write_text(summary_table(results))
    plot_curves(results, out / "loss_curves.png")


def merge_results(paths: list[Path]) -> dict:
    """One results dict from the results.json of runs made separately (e.g. a precision a call):
    they must share the experiment (settings, corpus, initial weights) to be compared."""
    merged = None
    for path in paths:
        results = json.loads(path.read_text())
        if merged is None:
            merged = {**results, "runs": dict(results["runs"]), "merged_from": [str(path)]}
            continue
        for key in ("settings", "corpus", "model"):
            if results[key] != merged[key]:
                raise SystemExit(f"{path} is of another experiment than {paths[0]} (its {key} "
                                 "differ): only runs of the same settings, corpus and initial "
                                 "weights compare")
        merged["runs"].update(results["runs"])
        merged["merged_from"].append(str(path))
    order = {p: i for i, p in enumerate(MOMENT_PRECISIONS)}
    merged["runs"] = dict(sorted(merged["runs"].items(), key=lambda kv: order.get(kv[0], 99)))
    return merged


# --- command line -------------------------------------------------------------------------------
def precision_list(text: str) -> tuple[str, ...]:
    values = tuple(v.strip() for v in text.split(",") if v.strip())
    unknown = [v for v in values if v not in MOMENT_PRECISIONS]
    if not values or unknown:
        raise argparse.ArgumentTypeError(f"{text!r}: give some of {', '.join(MOMENT_PRECISIONS)}")
    return values


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", type=Path, help="folder for results.json, summary.txt, "
                   "loss_curves.png and the tokenizer (required but with --plot-only)")
    p.add_argument("--plot-only", type=Path, nargs="+", metavar="RESULTS_JSON",
                   help="train nothing: write summary.txt and loss_curves.png of these "
                        "results.json (several: merged, also into --out's results.json)")
    p.add_argument("--precisions", type=precision_list, default=MOMENT_PRECISIONS,
                   help=f"moment precisions to train, comma-separated (default: "
                        f"{','.join(MOMENT_PRECISIONS)})")
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--work-dir", type=Path, help="folder for the initial model and the "
                   "evaluated weights (default: a temporary one, deleted at the end)")
    g = p.add_argument_group("model (Llama)")
    g.add_argument("--hidden", type=int, default=512)
    g.add_argument("--layers", type=int, default=8)
    g.add_argument("--heads", type=int, default=8)
    g.add_argument("--kv-heads", type=int, default=None, help="default: --heads (no GQA)")
    g.add_argument("--intermediate", type=int, default=1408)
    g.add_argument("--vocab-size", type=int, default=8192, help="also the BPE's size")
    g.add_argument("--untied-embeddings", action="store_true",
                   help="an LM head of its own (default: tied to the embedding)")
    g = p.add_argument_group("training (as `layerslide train`'s flags)")
    g.add_argument("--steps", type=int, default=1200)
    g.add_argument("--seq-len", type=int, default=512)
    g.add_argument("--micro-batch", type=int, default=16)
    g.add_argument("--grad-accum", type=int, default=1)
    g.add_argument("--lr", type=float, default=1e-3)
    g.add_argument("--warmup-steps", type=int, default=100)
    g.add_argument("--min-lr-ratio", type=float, default=0.1)
    g.add_argument("--weight-decay", type=float, default=0.1)
    g.add_argument("--max-grad-norm", type=float, default=1.0,
                   help="global clipping (0: off); a loss spike in one run would otherwise "
                        "read as a difference of precisions")
    g.add_argument("--segment-steps", type=int, default=16)
    g.add_argument("--seed", type=int, default=0, help="initial weights and data order")
    g = p.add_argument_group("evaluation")
    g.add_argument("--eval-every", type=int, default=100)
    g.add_argument("--eval-windows", type=int, default=64,
                   help="held-out windows of --seq-len tokens, spread over the split")
    g.add_argument("--eval-dtype", choices=("bf16", "fp32"), default="fp32",
                   help="dtype the evaluated model computes in (default fp32: bf16's rounding "
                        "moves the loss by ~1e-4, the size of the differences at stake); its "
                        "weights are the bf16 ones Trainer.save writes either way")
    g.add_argument("--heldout-percent", type=float, default=5.0)
    g.add_argument("--log-every", type=int, default=10, help="steps between progress lines")
    args = p.parse_args(argv)
    if args.plot_only is None and args.out is None:
        p.error("--out is required (but with --plot-only)")
    if args.plot_only is None and not 0 <= args.warmup_steps < args.steps:
        p.error(f"--warmup-steps {args.warmup_steps} must be below --steps {args.steps}")
    for name in ("eval_every", "log_every", "eval_windows"):
        if getattr(args, name) < 1:
            p.error(f"--{name.replace('_', '-')} must be at least 1")
    args.max_grad_norm = args.max_grad_norm or None  # TrainSpec's "off"
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.plot_only:
        results = merge_results(args.plot_only)
        out = args.out or args.plot_only[0].parent
        out.mkdir(parents=True, exist_ok=True)
        if len(args.plot_only) > 1:
            (out / "results.json").write_text(json.dumps(results, indent=1) + "\n")
        (out / "summary.txt").write_text(summary_table(results))
        plot_curves(results, out / "loss_curves.png")
    else:
        from transformers.utils import logging as hf_logging

        hf_logging.disable_progress_bar()  # a bar per save and load would bury the progress
        results = run_benchmark(args)
        out = args.out
    print(summary_table(results), end="")
    print(f"written to {out}")
    failed = [p for p, r in results["runs"].items() if r["status"] != "ok"]
    return 1 if failed and len(failed) == len(results["runs"]) else 0


if __name__ == "__main__":
    sys.exit(main())
