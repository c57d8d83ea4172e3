"""RunConfig: one field per train option, with the flags' defaults; built from flat options."""

from __future__ import annotations

import argparse

import pytest

from layerslide.cli.main import build_parser
from layerslide.planner.settings import Policy, TrainSpec
from layerslide.training.run import RunConfig, flag_of


def _train_parser() -> argparse.ArgumentParser:
    parser = build_parser()
    subparsers = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return subparsers.choices["train"]


def test_every_train_flag_is_an_option_with_the_same_default():
    flags = {a.dest: a.default for a in _train_parser()._actions
             if a.option_strings and a.dest not in ("help", "config")}
    defaults = RunConfig().options()
    assert set(flags) == set(defaults)
    assert {k: v for k, v in flags.items() if defaults[k] != v} == {}


def test_from_options_drops_what_it_does_not_know_and_defaults_the_rest():
    config = RunConfig.from_options({"command": "train", "argv": ["x"], "steps": 5,
                                     "window": 3, "micro_batch": 4})
    assert (config.steps, config.policy.residency.window, config.train.micro_batch) == (5, 3, 4)
    assert config.train.seq_len == RunConfig().train.seq_len
    assert RunConfig.from_options(config.options()) == config


def test_with_changes_run_train_and_policy_options_by_name():
    config = RunConfig().with_(steps=7, seq_len=64, cast="gpu")
    assert (config.steps, config.train.seq_len, config.policy.schedule.cast) == (7, 64, "gpu")
    assert isinstance(config.train, TrainSpec) and isinstance(config.policy, Policy)
    with pytest.raises(TypeError):
        RunConfig().with_(no_such_option=1)


def test_a_flag_says_when_it_came_from_the_config_file():
    config = RunConfig(config="run.toml", given=frozenset({"lr", "steps"}),
                       from_config=frozenset({"lr"}))
    assert config.flag("lr") == "--lr (in --config run.toml)"
    assert config.flag("steps") == flag_of("steps") == "--steps"
