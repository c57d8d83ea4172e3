"""`layerslide train --resume` after kill -9: mid-step and mid-checkpoint-write. The resumed run
must log the same losses, bit for bit on the CPU, as a run that was never interrupted."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from transformers import LlamaConfig

from layerslide.cli.main import main
from layerslide.planner.build import build_repeatable_plan
from layerslide.planner.model import model_from_hf_config
from layerslide.planner.settings import Policy, TrainSpec
from layerslide.training.checkpoint_store import CheckpointStore

STEPS = 8


@pytest.fixture(scope="module")
def config_dir(tmp_path_factory):
    path = tmp_path_factory.mktemp("tiny-config")
    LlamaConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                num_attention_heads=4, num_key_value_heads=2, vocab_size=64,
                max_position_embeddings=64).save_pretrained(path)
    return path


def train_args(config_dir: Path, ckpt: Path, log: Path) -> list[str]:
    return ["train", "--model", str(config_dir), "--random-init", "--device", "cpu",
            "--steps", str(STEPS), "--micro-batch", "2", "--seq-len", "16", "--lr", "1e-3",
            "--warmup-steps", "2", "--max-grad-norm", "1.0", "--checkpoint-dir", str(ckpt),
            "--checkpoint-every", "2", "--log-jsonl", str(log)]


def losses(log: Path) -> dict[int, float]:
    """Loss by optimizer steps taken before it (the JSONL numbers the first step 1)."""
    return {r["step"] - 1: r["loss"] for r in map(json.loads, log.read_text().splitlines())}


@pytest.fixture(scope="module")
def uninterrupted(config_dir, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("whole")
    assert main(train_args(config_dir, tmp / "ckpt", tmp / "log.jsonl")) == 0
    return losses(tmp / "log.jsonl")


def test_checkpoints_beside_training_say_what_ram_their_copies_keep(config_dir, tmp_path,
                                                                    capsys):
    assert main(train_args(config_dir, tmp_path / "ckpt", tmp_path / "log.jsonl")) == 0
    out = capsys.readouterr().out
    assert re.search(r"checkpoints beside training: [0-9.]+ GB of RAM kept for copies of the "
                     r"state", out), out
    assert re.search(r"host peak [0-9.]+ \(with [0-9.]+ GiB kept for checkpoint copies\)", out)


def test_checkpoint_copy_ram_caps_the_copies_and_is_refused_where_nothing_is_copied(
        config_dir, tmp_path, capsys):
    args = train_args(config_dir, tmp_path / "ckpt", tmp_path / "log.jsonl")
    assert main([*args, "--checkpoint-copy-ram", "0"]) == 0
    out = capsys.readouterr().out
    assert "0.0 GB of RAM kept for copies of the" in out and "wait for their write" in out
    assert len(CheckpointStore(tmp_path / "ckpt").list()) == 2  # written all the same
    with pytest.raises(SystemExit) as exit_:
        main([*args, "--checkpoint-copy-ram", "-1"])
    assert exit_.value.code == 2
    assert main([*args, "--checkpoint-copy-ram", "1GiB", "--checkpoint-sync"]) == 2
    assert "it needs --checkpoint-dir, and not --checkpoint-sync" in capsys.readouterr().err


def test_a_new_run_is_refused_a_folder_holding_another_runs_checkpoints(config_dir, tmp_path,
                                                                        capsys):
    # two runs' steps would interleave there, and --resume would continue the other run
    args = train_args(config_dir, tmp_path / "ckpt", tmp_path / "log.jsonl")
    assert main(args) == 0
    saved = sorted(p.name for p in (tmp_path / "ckpt").iterdir())
    capsys.readouterr()
    assert main([*args[:-1], str(tmp_path / "again.jsonl")]) == 2
    err = capsys.readouterr().err
    assert f"--checkpoint-dir {tmp_path / 'ckpt'} holds another run's checkpoints" in err
    assert f"layerslide train --resume {tmp_path / 'ckpt'}" in err
    assert sorted(p.name for p in (tmp_path / "ckpt").iterdir()) == saved
    assert not (tmp_path / "again.jsonl").exists()  # refused before any work


# run the CLI in a child that SIGKILLs itself at a chosen point
def signal_at(step: int, sig: str = "SIGINT", once_whole: int | None = None) -> str:
    """A child patch: the signal to itself as step `step`'s first backward begins, delivered to
    the lane thread running it (a lane, not the main thread, is where a Ctrl-C may land); with
    `once_whole`, first waiting for that checkpoint (written beside training) to be whole."""
    return f"""
    import threading, time
    from pathlib import Path
    from layerslide.executor import runner
    from layerslide.training.checkpoint_store import CheckpointStore
    run = runner.TaskRunner.run
    sent = []
    def signalled_run(self, task):
        if self.step_offset + task.step == {step} and task.kind == "backward" and not sent:
            sent.append(True)
            if {once_whole!r} is not None:
                store = CheckpointStore(Path(os.environ["CHECKPOINT_DIR"]))
                deadline = time.monotonic() + 30
                while time.monotonic() < deadline and \\
                        [i.step for i in store.list()][-1:] != [{once_whole!r}]:
                    time.sleep(0.05)
            signal.pthread_kill(threading.get_ident(), signal.{sig})
            time.sleep(0.5)  # the main thread's handler runs within this step
        return run(self, task)
    runner.TaskRunner.run = signalled_run
    """


# mid-step 5 once checkpoint 4, written beside steps 4-5, is whole: a kill before that (a slow
# disk) resumes after step 2, which the writing kill below covers
KILL_MID_STEP_5 = signal_at(5, "SIGKILL", once_whole=4)
KILL_WRITING_CHECKPOINT_4 = """
    from layerslide.training import checkpoint_store
    write = checkpoint_store._write_group
    def dying_write(path, *args):
        if "step-000000004" in str(path) and "block_0" in str(path):
            os.kill(os.getpid(), signal.SIGKILL)
        return write(path, *args)
    checkpoint_store._write_group = dying_write
"""


def run_killed(args: list[str], patch: str, checkpoint_dir: Path) -> int:
    return run_child(args, patch, {"CHECKPOINT_DIR": str(checkpoint_dir)}).returncode


@pytest.mark.parametrize(("patch", "resumes_after", "nvme"), [
    (KILL_MID_STEP_5, 4, False), (KILL_WRITING_CHECKPOINT_4, 2, False),
    (KILL_MID_STEP_5, 4, True)])
def test_resume_after_kill_9_logs_the_uninterrupted_losses(config_dir, tmp_path, uninterrupted,
                                                           patch, resumes_after, nvme, capsys):
    """With half the state on NVMe too: bit-identical to RAM, so the same losses."""
    ckpt, log = tmp_path / "ckpt", tmp_path / "log.jsonl"
    extra = (["--master-on-nvme", "0.5", "--moments-on-nvme", "0.5", "--nvme-dir",
              str(tmp_path / "nvme")] if nvme else [])
    assert run_killed([*train_args(config_dir, ckpt, log), *extra], patch, ckpt) == -signal.SIGKILL
    before = losses(log)
    assert set(before) >= set(range(resumes_after))  # steps logged before the kill
    # nothing partial is taken for complete: the newest complete checkpoint is the last whole one
    complete = sorted(p.name for p in ckpt.iterdir() if not p.name.startswith("."))
    assert complete[-1] == f"step-{resumes_after:09d}"

    resumed_log = tmp_path / "resumed.jsonl"
    assert main(["train", "--resume", str(ckpt), "--device", "cpu",
                 "--log-jsonl", str(resumed_log)]) == 0
    assert f"after step {resumes_after}" in capsys.readouterr().out
    after = losses(resumed_log)
    assert sorted(after) == list(range(resumes_after, STEPS))
    assert after == {s: uninterrupted[s] for s in after}  # bit for bit
    assert not any(p.name.startswith(".tmp") for p in ckpt.iterdir())  # the stale one is gone


def test_resume_refuses_a_folder_without_checkpoints(tmp_path, capsys):
    assert main(["train", "--resume", str(tmp_path), "--device", "cpu"]) == 2
    assert "no complete checkpoint there" in capsys.readouterr().err


def test_checkpoint_flags_need_a_folder(config_dir, capsys):
    assert main(["train", "--model", str(config_dir), "--random-init", "--device", "cpu",
                 "--checkpoint-every", "2"]) == 2
    assert "need --checkpoint-dir" in capsys.readouterr().err


def test_a_disk_filling_mid_run_stops_with_the_checkpoint_to_resume_from(config_dir, tmp_path,
                                                                         monkeypatch, capsys):
    from layerslide.executor import nvme

    real_pwritev, writes = nvme.os.pwritev, []

    def filling(fd, buffers, offset):  # room for the O_DIRECT probe and two steps' moment files
        writes.append(fd)
        if len(writes) > 1 + 2 * 4:
            raise OSError(28, "No space left on device")
        return real_pwritev(fd, buffers, offset)
    monkeypatch.setattr(nvme.os, "pwritev", filling)
    ckpt = tmp_path / "ckpt"
    rc = main([*train_args(config_dir, ckpt, tmp_path / "log.jsonl"), "--moments-on-nvme", "1",
               "--nvme-dir", str(tmp_path / "nvme")])
    err = capsys.readouterr().err
    assert rc == 1
    assert "training stopped" in err and "No space left" in err
    assert f"layerslide train --resume {ckpt}" in err
    assert [info.step for info in CheckpointStore(ckpt).list()] == [2]


def test_stored_arguments_name_folders_absolutely(config_dir, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # relative folders, as a user types them
    assert main(["train", "--model", str(config_dir), "--random-init", "--device", "cpu",
                 "--steps", "1", "--micro-batch", "1", "--seq-len", "16",
                 "--moments-on-nvme", "0.5", "--nvme-dir", "nvme", "--checkpoint-dir", "ckpt",
                 "--checkpoint-every", "1"]) == 0
    args = CheckpointStore(tmp_path / "ckpt").latest().meta["run"]["args"]
    assert args["nvme_dir"] == str(tmp_path / "nvme")
    assert args["checkpoint_dir"] == str(tmp_path / "ckpt")


def test_resume_names_the_flags_it_ignores_and_refuses_a_finished_run(config_dir, tmp_path,
                                                                       capsys):
    ckpt = tmp_path / "ckpt"
    base = ["--device", "cpu", "--micro-batch", "1", "--seq-len", "16", "--checkpoint-dir",
            str(ckpt)]
    assert main(["train", "--model", str(config_dir), "--random-init", "--steps", "3",
                 "--checkpoint-every", "1", *base]) == 0
    finished = CheckpointStore(ckpt).latest()
    # a checkpoint mid-run: resume it with flags that the checkpointed settings replace
    mid = CheckpointStore(ckpt).list()[0]
    assert mid.step < finished.step
    for info in CheckpointStore(ckpt).list()[1:]:
        shutil.rmtree(info.path)
    capsys.readouterr()
    assert main(["train", "--resume", str(ckpt), "--device", "cpu", "--model", "llama-3.2-1b",
                 "--lr", "5"]) == 0
    err = capsys.readouterr().err
    assert "--lr, --model ignored" in err
    # finished, without a model: the export command (it said "pass --overwrite", which resume
    # ignores, and pointed at a folder that did not exist)
    assert main(["train", "--resume", str(ckpt), "--device", "cpu"]) == 2
    err = capsys.readouterr().err
    assert (f"that run finished all its 3 steps but the run had no --out; its checkpoint of "
            f"step 3 holds the trained state: write the model with `layerslide export {ckpt} "
            f"--out FOLDER`, or `layerslide train --resume {ckpt} --steps N` with N above 3 "
            "trains on from its optimizer state") in err
    assert "--overwrite" not in err


def test_a_finished_run_trains_on_for_more_steps_into_a_new_out(config_dir, tmp_path, capsys):
    """--steps beyond the finished count continues from the checkpoint's optimizer state, the
    cosine decay stretched over the new count; --out names where the model goes."""
    from layerslide.executor.optim import OptimConfig

    ckpt, out = tmp_path / "ckpt", tmp_path / "tuned"
    assert main(["train", "--model", str(config_dir), "--random-init", "--device", "cpu",
                 "--steps", "4", "--micro-batch", "1", "--seq-len", "16", "--lr", "1e-3",
                 "--warmup-steps", "1", "--checkpoint-dir", str(ckpt), "--out", str(out)]) == 0
    capsys.readouterr()
    assert main(["train", "--resume", str(ckpt), "--device", "cpu"]) == 2
    assert (f"that run finished all its 4 steps and its model is in {out}: nothing to "
            f"resume; `layerslide train --resume {ckpt} --steps N`") in capsys.readouterr().err
    assert main(["train", "--resume", str(ckpt), "--device", "cpu", "--steps", "4"]) == 2
    assert (f"--steps 4: the checkpoint in {ckpt} is after step 4 already: to train on, give "
            "--steps above 4") in capsys.readouterr().err
    assert main(["train", "--resume", str(ckpt), "--device", "cpu", "--out",
                 str(tmp_path / "x")]) == 2
    assert (f"nothing to train; its checkpoint of step 4 holds the trained state: write its "
            f"model to {tmp_path / 'x'} with `layerslide export {ckpt} --out {tmp_path / 'x'}`"
            in capsys.readouterr().err)
    longer, log = tmp_path / "longer", tmp_path / "log.jsonl"
    assert main(["train", "--resume", str(ckpt), "--device", "cpu", "--steps", "8", "--out",
                 str(longer), "--log-jsonl", str(log)]) == 0
    captured = capsys.readouterr()
    stretched = OptimConfig(lr=1e-3, warmup_steps=1, decay_steps=7)
    old = OptimConfig(lr=1e-3, warmup_steps=1, decay_steps=3)
    assert ("note: --steps 8 (was 4): the learning rate's cosine decay now runs over steps 2-8 "
            f"instead of 2-4: step 5 runs at {stretched.lr_at(4):.2e} (the old schedule's "
            f"{old.lr_at(4):.2e}) and it ends at {stretched.lr_at(7):.2e} at step 8; the "
            "optimizer's moments go on from the checkpoint") in captured.err
    assert f"the resumed run saves its model to --out {longer} (was {out})" in captured.err
    assert "after step 4" in captured.out and "step 8/8" in captured.out
    records = losses(log)
    assert sorted(records) == [4, 5, 6, 7]
    assert [json.loads(r)["lr"] for r in log.read_text().splitlines()] == \
        pytest.approx([stretched.lr_at(s) for s in range(4, 8)])
    assert (longer / "config.json").is_file() and (out / "config.json").is_file()
    assert CheckpointStore(ckpt).latest().step == 8


# delivered to the writing thread, the worst case: a process-directed signal (Ctrl-C) may land on
# any thread, and the main thread, blocked waiting for the write, must still hear of it
AGAIN_WRITING_CHECKPOINT_4 = """
    import threading, time
    from layerslide.training import checkpoint_store
    write = checkpoint_store._write_group
    def interrupted_write(path, *args):
        if "step-000000004" in str(path) and "block_0" in str(path):
            signal.pthread_kill(threading.get_ident(), signal.SIGINT)
            time.sleep(2)  # the main thread's handler runs meanwhile
        return write(path, *args)
    checkpoint_store._write_group = interrupted_write
"""


def run_child(args: list[str], patch: str,
              env_extra: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    script = textwrap.dedent("""
        import os, signal, sys
    """) + textwrap.dedent(patch) + textwrap.dedent(f"""
        from layerslide.cli.main import main
        sys.exit(main({args!r}))
    """)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path), **(env_extra or {})}
    return subprocess.run([sys.executable, "-c", script], check=False, env=env,
                          capture_output=True, text=True, timeout=300)


@pytest.mark.parametrize(("sig", "code"), [("SIGINT", 130), ("SIGTERM", 143)])
def test_a_signal_stops_after_the_step_in_flight_checkpoints_and_resumes_exactly(
        config_dir, tmp_path, uninterrupted, capsys, sig, code):
    ckpt, log = tmp_path / "ckpt", tmp_path / "log.jsonl"
    args = train_args(config_dir, ckpt, log)
    args = args[:args.index("--checkpoint-every")] + args[args.index("--checkpoint-every") + 2:]
    child = run_child(args, signal_at(step=3, sig=sig))  # one segment of all 8 steps
    assert child.returncode == code, child.stderr
    assert f"{sig}: stopping after the step in flight" in child.stderr
    assert f"layerslide train --resume {ckpt}" in child.stderr
    (saved,) = CheckpointStore(ckpt).list()
    assert 3 <= saved.step < STEPS  # cut inside the segment, after the step in flight
    assert sorted(losses(log)) == list(range(saved.step))
    resumed_log = tmp_path / "resumed.jsonl"
    assert main(["train", "--resume", str(ckpt), "--device", "cpu",
                 "--log-jsonl", str(resumed_log)]) == 0
    after = losses(resumed_log)
    assert sorted(after) == list(range(saved.step, STEPS))
    assert {**losses(log), **after} == uninterrupted  # bit for bit, data position included


def test_a_second_signal_exits_at_once_leaving_no_partial_checkpoint(config_dir, tmp_path):
    """The first stops the run in step 3 (its segment ends there), the second comes while the
    stop's checkpoint of step 4 is being written: the child exits at once, and the newest
    complete checkpoint is the one before."""
    ckpt, log = tmp_path / "ckpt", tmp_path / "log.jsonl"
    child = run_child(train_args(config_dir, ckpt, log),
                      signal_at(step=3) + AGAIN_WRITING_CHECKPOINT_4)
    assert child.returncode == 130, child.stderr
    assert "SIGINT again: exiting now" in child.stderr
    assert [info.step for info in CheckpointStore(ckpt).list()] == [2]


def test_resume_takes_a_new_schedule_and_keeps_the_state_layout(config_dir, tmp_path,
                                                                 capsys):
    ckpt = tmp_path / "ckpt"
    assert main(["train", "--model", str(config_dir), "--random-init", "--device", "cpu",
                 "--steps", "4", "--micro-batch", "2", "--seq-len", "16", "--checkpoint-dir",
                 str(ckpt), "--checkpoint-every", "2"]) == 0
    shutil.rmtree(CheckpointStore(ckpt).latest().path)  # as if it stopped after step 2
    capsys.readouterr()
    # the same tokens a step in two micro-batches, the layers two at a time, layer-major
    assert main(["train", "--resume", str(ckpt), "--device", "cpu", "--micro-batch", "1",
                 "--grad-accum", "2", "--accumulation", "layer_major", "--window", "1"]) == 0
    captured = capsys.readouterr()
    assert ("resuming under a new schedule: --accumulation layer_major (was step_major), "
            "--grad-accum 2 (was 1), --micro-batch 1 (was 2), --window 1 (was 2)") in captured.err
    assert "micro-batch 1 x 16 tokens x 2; window 1" in captured.out
    assert "after step 2" in captured.out and "step 4/4" in captured.out
    shutil.rmtree(CheckpointStore(ckpt).latest().path)
    assert main(["train", "--resume", str(ckpt), "--device", "cpu", "--moments-on-nvme",
                 "0.5"]) == 0  # the layout is kept
    assert "--moments-on-nvme ignored" in capsys.readouterr().err


def test_resume_moves_the_nvme_state_to_a_new_nvme_dir(config_dir, tmp_path, uninterrupted,
                                                       capsys):
    """The old folder's drive is gone (a file in its place): the state goes to the new one,
    from the checkpoint, and the run goes on bit for bit."""
    ckpt, log, old = tmp_path / "ckpt", tmp_path / "log.jsonl", tmp_path / "old"
    assert main([*train_args(config_dir, ckpt, log), "--master-on-nvme", "0.5",
                 "--moments-on-nvme", "0.5", "--nvme-dir", str(old)]) == 0
    shutil.rmtree(CheckpointStore(ckpt).latest().path)  # as if it stopped 2 steps earlier
    shutil.rmtree(old)
    old.write_text("")
    capsys.readouterr()
    new, resumed_log = tmp_path / "new", tmp_path / "resumed.jsonl"
    assert main(["train", "--resume", str(ckpt), "--device", "cpu", "--nvme-dir", str(new),
                 "--log-jsonl", str(resumed_log)]) == 0
    assert (f"note: the NVMe state moves to --nvme-dir {new} (was {old}, no longer read or "
            "written): restored there from the checkpoint") in capsys.readouterr().err
    after = losses(resumed_log)
    assert sorted(after) == [STEPS - 2, STEPS - 1]
    assert after == {s: uninterrupted[s] for s in after}  # bit for bit
    latest = CheckpointStore(ckpt).latest()
    assert latest.step == STEPS and latest.meta["run"]["args"]["nvme_dir"] == str(new)


def test_resume_takes_a_flag_typed_at_its_default_and_refuses_what_a_plan_replaces(
        config_dir, tmp_path, capsys):
    ckpt = tmp_path / "ckpt"
    assert main(["train", "--model", str(config_dir), "--random-init", "--device", "cpu",
                 "--steps", "4", "--micro-batch", "2", "--seq-len", "16", "--window", "1",
                 "--checkpoint-dir", str(ckpt), "--checkpoint-every", "2"]) == 0
    shutil.rmtree(CheckpointStore(ckpt).latest().path)  # as if it stopped after step 2
    capsys.readouterr()
    # a plan whose settings replace the flags: one that would change them is refused
    plan = tmp_path / "plan.json"
    build_repeatable_plan(model_from_hf_config(config_dir), TrainSpec(micro_batch=2, seq_len=16),
                          Policy.of(window=1)).save(plan)
    assert main(["train", "--resume", str(ckpt), "--device", "cpu", "--plan", str(plan),
                 "--max-grad-norm", "1.0"]) == 2
    assert "--max-grad-norm 1.0 (the plan has None)" in capsys.readouterr().err
    # --window 2 is the default's value, and not the checkpointed run's 1: it is taken; options
    # the resume ignores (said so) are not then refused for what they would need
    assert main(["train", "--resume", str(ckpt), "--device", "cpu", "--window", "2",
                 "--keep-saves", "3", "--packing", "off"]) == 0
    captured = capsys.readouterr()
    assert "resuming under a new schedule: --window 2 (was 1)" in captured.err
    assert "--keep-saves, --packing ignored" in captured.err
    assert "window 2" in captured.out


SIGINT_WHILE_SAVING = """
    from layerslide.training import trainer
    save = trainer.Trainer.save
    def interrupted_save(self, folder, **kwargs):
        os.kill(os.getpid(), signal.SIGINT)  # a Ctrl-C as the final model is written
        return save(self, folder, **kwargs)
    trainer.Trainer.save = interrupted_save
"""


def test_a_ctrl_c_while_the_trained_model_is_saved_lets_the_save_finish(config_dir, tmp_path):
    out = tmp_path / "tuned"
    args = train_args(config_dir, tmp_path / "ckpt", tmp_path / "log.jsonl")
    child = run_child([*args, "--out", str(out)], SIGINT_WHILE_SAVING)
    assert child.returncode == 130, child.stderr
    assert f"SIGINT: stopping after the model's save to {out}" in child.stderr
    assert f"saved the fine-tuned model to {out}" in child.stdout
    assert (out / "config.json").is_file() and any(out.glob("*.safetensors"))
