"""`layerslide simulate --gpus N --hosts M`: every rank's tokens, the host's memory, the bound,
and a clear refusal where the profile cannot hold the ranks."""

import json

from layerslide.cli.main import main

ONE_B = ("--model", "llama-3.2-1b", "--micro-batch", "2", "--grad-accum", "2",
         "--accumulation", "layer_major")


def run(capsys, *argv):
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def summary(capsys, *argv):
    code, out, _ = run(capsys, "simulate", *ONE_B, "--json", *argv)
    assert code == 0, out
    return json.loads(out)


def test_several_gpus_count_every_ranks_tokens_and_the_hosts_memory(capsys):
    one = summary(capsys, "--profile", "h100-sxm-x4")
    four = summary(capsys, "--profile", "h100-sxm-x4", "--gpus", "4")
    assert (four["ranks_per_host"], four["hosts"]) == (4, 1)
    assert four["tokens_per_step"] == 4 * one["tokens_per_step"] == 4 * 2 * 2 * 1024
    assert four["tokens_per_s"] == four["tokens_per_step"] / four["step_s"]
    assert four["peak_host_bytes_per_host"] == 4 * four["peak_host_bytes"]
    assert four["bound"] is not None and 0 < four["bound_share_of_step"] <= 1


def test_two_hosts_all_reduce_over_the_network(capsys):
    two = summary(capsys, "--profile", "h100-sxm-x8", "--gpus", "8", "--hosts", "2")
    assert two["tokens_per_step"] == 16 * 2 * 2 * 1024
    assert two["floors_s"]["network"] > 0


def test_the_text_output_names_the_ranks_the_bound_and_the_memory_per_host(capsys):
    code, out, _ = run(capsys, "simulate", *ONE_B, "--profile", "h200-x2", "--gpus", "2")
    assert code == 0
    assert "2 ranks (2 GPUs per host x 1 hosts)" in out
    assert "bound: " in out and "per host (2 ranks" in out


def test_more_gpus_than_the_profile_holds_is_refused_with_what_to_change(capsys):
    code, _, err = run(capsys, "simulate", *ONE_B, "--profile", "h200-x2", "--gpus", "4")
    assert code == 2
    assert "runs 4 GPUs per host but profile h200-x2 holds 2" in err
    assert "--gpus 2 or fewer" in err


def test_several_hosts_without_a_network_are_refused(capsys):
    code, _, err = run(capsys, "simulate", *ONE_B, "--profile", "rtx4090x2-desktop",
                       "--gpus", "2", "--hosts", "2")
    assert code == 2 and "no [network] between hosts" in err and "--hosts 1" in err
