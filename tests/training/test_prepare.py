"""prepare() for one rank of several: the launch's ranks are the run's, a --gpus/--hosts or a
plan made for other ranks is refused naming both, each rank takes its own GPU, NVMe folders
and share of the cores (in-process: the ranks are given, no process group is needed)."""

from __future__ import annotations

from dataclasses import replace
from types import SimpleNamespace

import pytest
import torch
from helpers import tiny_model_folder, tiny_text_data

from layerslide.executor.ranks import SINGLE, Ranks
from layerslide.planner.build import build_repeatable_plan
from layerslide.planner.model import model_from_hf_config
from layerslide.planner.settings import Policy, TrainSpec
from layerslide.training import inputs
from layerslide.training.plan_checks import with_rank_threads
from layerslide.training.prepare import prepare
from layerslide.training.run import RunConfig, RunError

TWO = Ranks(rank=1, gpus=2)  # the second of two ranks on one host


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return tiny_model_folder(tmp_path_factory.mktemp("tiny-llama"))


def config(model_dir, tmp_path, given=(), **changes) -> RunConfig:
    """A tiny CPU run's config; given: the options typed."""
    data = tiny_text_data(tmp_path / "data.jsonl")
    return RunConfig(model=str(model_dir), data=str(data), device="cpu", steps=2,
                     train=TrainSpec(micro_batch=2, seq_len=16),
                     given=frozenset(given)).with_(**changes)


@pytest.mark.parametrize(("flags", "said"), [
    ({"gpus": 3}, ("--gpus 3, but torchrun launched 2 rank(s) on each host (--nproc-per-node "
                   "2): drop --gpus (the launch sets it) or launch with --nproc-per-node 3")),
    ({"hosts": 2}, "--hosts 2, but torchrun launched 1 host(s) (--nnodes 1)"),
])
def test_a_gpus_or_hosts_unlike_the_launch_is_refused_naming_both(model_dir, tmp_path, flags,
                                                                  said):
    with pytest.raises(RunError) as refused:
        prepare(config(model_dir, tmp_path, **flags, given=flags), ranks=TWO)
    assert said in str(refused.value)


def test_the_launch_sets_the_runs_ranks_where_the_flags_leave_them(model_dir, tmp_path):
    run_config = config(model_dir, tmp_path)
    assert inputs.with_ranks(run_config, Ranks(rank=5, gpus=4, hosts=2)).train.ranks == 8
    assert inputs.with_ranks(run_config.with_(gpus=2), SINGLE).train.gpus == 1  # not given


def test_hosts_asked_of_a_process_alone_says_how_to_launch_them(model_dir, tmp_path):
    with pytest.raises(RunError, match="runs alone, not under torchrun: start `torchrun "
                                       "--nnodes M --node-rank I"):
        inputs.with_ranks(config(model_dir, tmp_path, hosts=2, given={"hosts"}), SINGLE)


def test_a_plan_made_for_other_ranks_is_refused(model_dir, tmp_path):
    spec = model_from_hf_config(model_dir)
    plan_file = tmp_path / "plan.json"
    build_repeatable_plan(spec, TrainSpec(micro_batch=2, seq_len=16), Policy.of()).save(plan_file)
    with pytest.raises(RunError) as refused:
        prepare(config(model_dir, tmp_path, plan=str(plan_file)), ranks=TWO)
    assert (f"--plan {plan_file} is a plan for 1 GPU(s) per host x 1 host(s), and this run has "
            "2 GPU(s) per host x 1 host(s): make one for them (`layerslide plan ... --gpus 2 "
            "--hosts 1 -o PLAN`), or launch the plan's ranks (one process: "
            "`layerslide train ...` without torchrun)"
            ) in str(refused.value)


def test_each_rank_of_a_gpu_run_takes_the_gpu_of_its_local_rank(monkeypatch):
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    assert inputs.rank_device("cuda", Ranks(rank=3, gpus=2, hosts=2), torch) == "cuda:1"
    assert inputs.rank_device("cpu", TWO, torch) == "cpu"
    assert inputs.rank_device("cuda:1", SINGLE, torch) == "cuda:1"
    with pytest.raises(RunError, match="--device cuda:1: each rank of a run of several takes "
                                       "the GPU of its local rank"):
        inputs.rank_device("cuda:1", TWO, torch)
    with pytest.raises(RunError, match=r"4 ranks on this host need a GPU each, and torch sees "
                                       r"2 CUDA GPU\(s\)"):
        inputs.rank_device("cuda", Ranks(rank=0, gpus=4), torch)


def test_each_rank_has_its_own_nvme_folders_and_is_given_its_ranks(model_dir, tmp_path,
                                                                   monkeypatch):
    made = []

    def trainer(**kwargs):
        made.append(kwargs)
        return SimpleNamespace(checkpointing=SimpleNamespace())
    monkeypatch.setattr("layerslide.training.trainer.Trainer", trainer)
    run = prepare(config(model_dir, tmp_path))  # one rank: prepared as ever
    nvme = f"{tmp_path}/n0,{tmp_path}/n1"
    replace(run, config=replace(run.config, nvme_dir=nvme)).trainer()
    replace(run, config=replace(run.config, nvme_dir=nvme), ranks=TWO).trainer()
    assert made[0]["nvme_dir"] == nvme and "ranks" not in made[0]
    assert made[1]["nvme_dir"] == f"{tmp_path}/n0/rank1,{tmp_path}/n1/rank1"
    assert made[1]["ranks"] is TWO


def test_ranks_sharing_a_host_split_its_cores_unless_told_otherwise(model_dir, monkeypatch):
    spec = model_from_hf_config(model_dir)
    plan = build_repeatable_plan(spec, TrainSpec(micro_batch=2, seq_len=16, gpus=2), Policy.of())
    assert with_rank_threads(plan, 8).policy.executor.cpu_threads == 8
    assert with_rank_threads(plan, None) is plan  # one rank: every core, as ever
    chosen = replace(plan, policy=plan.policy.with_(cpu_threads=3))  # a plan file's count
    assert with_rank_threads(chosen, 8).policy.executor.cpu_threads == 3
    monkeypatch.setenv("LAYERSLIDE_CPU_THREADS", "0")  # the user's choice, 0 (OpenMP's) too
    assert with_rank_threads(plan, 8) is plan
