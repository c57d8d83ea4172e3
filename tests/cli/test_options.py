"""The training-settings and policy flags are made from TrainSpec's and Policy's fields: each
flag's name, default, choices, type and help are the field's, and policy_of/train_of read them."""

from __future__ import annotations

import argparse
from dataclasses import dataclass, fields
from typing import Literal, get_args, get_origin, get_type_hints

import pytest

from layerslide.cli import options
from layerslide.cli.main import _subcommand_parser, build_parser
from layerslide.cli.options import add_field_flags, add_policy, add_train, policy_of, train_of
from layerslide.planner import Policy, TrainSpec, settings
from layerslide.planner.settings import (
    POLICY_GROUPS,
    Schedule,
    doc_of,
    flag_fields,
    policy_flag_fields,
    setting,
)


def group_actions(parser: argparse.ArgumentParser, title: str) -> dict[str, argparse.Action]:
    group = next(g for g in parser._action_groups if g.title == title)
    return {a.dest: a for a in group._group_actions}


def owner_hints() -> dict[str, object]:
    """Each settings field's resolved type, by name."""
    return {name: hint for cls in (TrainSpec, *POLICY_GROUPS.values())
            for name, hint in get_type_hints(cls).items()}


@pytest.mark.parametrize("command", ["plan", "simulate", "train"])
def test_every_flag_field_has_its_flag_with_the_fields_default_choices_and_help(command):
    parser, hints = _subcommand_parser(build_parser(), command), owner_hints()
    for title, flagged in (("training settings", flag_fields(TrainSpec)),
                           ("policy", policy_flag_fields())):
        actions = group_actions(parser, title)
        assert [*actions] == [f.name for f in flagged]
        for f in flagged:
            action, hint = actions[f.name], hints[f.name]
            assert action.option_strings == ["--" + f.name.replace("_", "-")]
            assert action.default == f.default
            assert action.help == doc_of(f).replace("%", "%%")
            literal = get_args(hint) if get_origin(hint) is Literal else None
            assert action.choices == literal, f.name
    policy = group_actions(parser, "policy")
    assert "stream_run_ahead" not in policy and "cpu_threads" not in policy  # the environment's
    assert "nvme_prefetch" not in policy and "head_chunk_bytes" not in policy


def test_flags_parse_into_the_spec_and_policy_they_name():
    parser = argparse.ArgumentParser()
    add_train(parser)
    add_policy(parser)
    args = parser.parse_args(["--micro-batch", "2", "--max-grad-norm", "0.5", "--window", "4",
                              "--host-grad-buffers", "3", "--cast-worker", "--cast", "gpu",
                              "--moments-on-nvme", "0.25"])
    assert train_of(args) == TrainSpec(micro_batch=2, max_grad_norm=0.5)
    assert policy_of(args) == Policy.of(window=4, host_grad_buffers=3, cast_worker=True,
                                        cast="gpu", moments_on_nvme=0.25)
    assert policy_of(parser.parse_args([])) == Policy.of()  # every default the field's
    with pytest.raises(SystemExit):
        parser.parse_args(["--activations", "disk"])  # a Literal's values are the choices


@dataclass(frozen=True, kw_only=True)
class WiderSchedule(Schedule):
    """Schedule with fields a later change might add."""

    lookahead: Literal["near", "far"] = setting("near", "how far ahead to look (~5% more)")
    spare_slots: int | None = setting(None, "slots kept spare (default: none)")


def test_a_new_field_of_a_group_gets_a_flag_that_policy_of_reads(monkeypatch):
    monkeypatch.setitem(POLICY_GROUPS, "schedule", WiderSchedule)
    for f in fields(WiderSchedule):
        monkeypatch.setitem(settings._GROUP_OF, f.name, "schedule")
    parser = argparse.ArgumentParser()
    add_policy(parser)
    policy = group_actions(parser, "policy")
    assert policy["lookahead"].choices == ("near", "far") and policy["lookahead"].default == "near"
    assert policy["lookahead"].help == "how far ahead to look (~5%% more)"  # argparse's % escaped
    assert policy["spare_slots"].type is int and policy["spare_slots"].default is None
    schedule = policy_of(parser.parse_args(["--lookahead", "far", "--spare-slots", "2"])).schedule
    assert (schedule.lookahead, schedule.spare_slots) == ("far", 2)


def test_a_flag_field_without_a_doc_or_with_a_switch_on_by_default_is_refused():
    @dataclass(frozen=True, kw_only=True)
    class Undocumented:
        depth: int = 1

    @dataclass(frozen=True, kw_only=True)
    class OnByDefault:
        fast: bool = setting(True, "go fast")

    group = argparse.ArgumentParser().add_argument_group("policy")
    with pytest.raises(TypeError, match="Undocumented.depth is a command-line flag: declare"):
        add_field_flags(group, Undocumented)
    with pytest.raises(TypeError, match="OnByDefault.fast: a switch defaults to False"):
        add_field_flags(group, OnByDefault)


def test_progress_prints_a_line_a_tenth_with_the_time_left_off_a_terminal(monkeypatch, capsys):
    clock = iter(float(t) for t in range(0, 100, 2))  # a fake clock: 2 s a call
    monkeypatch.setattr(options.time, "monotonic", lambda: next(clock))
    show = options.progress_printer("tune: candidates", quiet_s=3)  # made at t=0
    for done in (1, 2, 5, 10):
        show(done, 10)
    lines = capsys.readouterr().err.splitlines()
    # at 2 s, under quiet_s: nothing; then 2/10 at 4 s, 5/10 at 6 s, the end at 8 s
    assert lines == ["tune: candidates: 2/10 (4 s, about 16 s left)",
                     "tune: candidates: 5/10 (6 s, about 6 s left)",
                     "tune: candidates: 10/10 (8 s)"]
