"""`layerslide calibrate`: the profile it writes reads back, measured fields replace the base's
with their sources, the rest stays the base's; the GPU part on the GPU machine."""

from __future__ import annotations

import dataclasses
import os
import types
from pathlib import Path

import pytest
import torch

from layerslide.calibrate import measure, merged_profile
from layerslide.calibrate.host import Measurement
from layerslide.cli.main import main
from layerslide.executor.native import load_kernels
from layerslide.hwprofiles import builtin_profile_names, load_profile
from layerslide.hwprofiles.writer import save_profile, to_toml
from layerslide.planner.model import resolve_model


@pytest.mark.parametrize("name", builtin_profile_names())
def test_written_profiles_read_back_equal(tmp_path, name):
    profile = load_profile(name)
    again = load_profile(save_profile(profile, tmp_path / f"{name}.toml"))
    assert dataclasses.replace(again, path=profile.path) == profile


@pytest.fixture(autouse=True)
def small_adamw_blocks(monkeypatch):
    """The CLI runs here measure AdamW over 4 Mi-param blocks: the real 256 Mi take seconds."""
    monkeypatch.setattr("layerslide.calibrate.ADAMW_BLOCK_PARAMS", 4 * 2**20)


def test_measured_fields_replace_the_base_with_their_sources():
    base = load_profile("h200-bench")
    found = [Measurement(key="host.adamw_throughput", value=2.5e9, how="a test"),
             Measurement(key="host.ram", value=1e11 + 0.4, how="pages"),
             Measurement(key="gpu.matmul_efficiency", value=((1024, 0.5), (8192, 0.7)),
                         how="gemms")]
    got = merged_profile(base, found, name="mine", quick=True)
    assert got.name == "mine" and got.host.adamw_params_per_s == 2.5e9
    assert got.host.ram_bytes == 100_000_000_000  # a whole number of bytes
    assert got.gpu.matmul_efficiency == ((1024, 0.5), (8192, 0.7))
    assert got.sources["host.adamw_throughput"].endswith("layerslide calibrate --quick: a test")
    assert got.host.cast_bytes_per_s == base.host.cast_bytes_per_s  # not measured: the base's
    assert got.sources["host.cast_throughput"] == base.sources["host.cast_throughput"]
    assert '"mine"' in to_toml(got)


def test_calibrate_on_a_machine_without_a_gpu_measures_host_and_disk(tmp_path, capsys,
                                                                     monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    out = tmp_path / "here.toml"
    (tmp_path / "disk").mkdir()
    assert main(["calibrate", "--quick", "--out", str(out), "--disk-dir",
                 str(tmp_path / "disk")]) == 0
    assert f"wrote {out}" in capsys.readouterr().out
    profile, base = load_profile(out), load_profile("h200-bench")
    assert profile.name == "here"
    for key in ("host.memory_bandwidth", "host.adamw_throughput", "host.cast_throughput",
                "host.cores", "host.ram", "storage.read", "storage.write", "storage.duplex",
                "storage.capacity"):
        assert "layerslide calibrate --quick" in profile.sources[key], key
    assert profile.host.adamw_params_per_s > 1e6 and profile.storage.read_bytes_per_s > 1e6
    assert profile.storage.duplex_bytes_per_s > 1e6  # reads and writes at once, written back
    assert 0 < profile.storage.read_share < 1  # and the reads' part of those bytes
    assert "layerslide calibrate --quick" in profile.sources["storage.duplex_read_share"]
    assert profile.gpu == base.gpu and profile.link == base.link  # no GPU: the base's
    assert not list((tmp_path / "disk").iterdir())  # the probe file is gone


def test_calibrate_refuses_a_disk_folder_it_cannot_write(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert main(["calibrate", "--quick", "--out", str(tmp_path / "p.toml"), "--disk-dir",
                 "/proc"]) == 2
    assert "pass a writable --disk-dir" in capsys.readouterr().err
    # one that is not there is not made (it would measure whatever disk holds its parent)
    assert main(["calibrate", "--quick", "--out", str(tmp_path / "p.toml"), "--disk-dir",
                 str(tmp_path / "no" / "disk")]) == 2
    assert "does not exist" in capsys.readouterr().err
    assert not (tmp_path / "p.toml").exists() and not (tmp_path / "no").exists()


def test_calibrate_refuses_bad_output_paths(tmp_path, capsys):
    assert main(["calibrate", "--out", str(tmp_path / "p.json")]) == 2
    assert "ends in .toml" in capsys.readouterr().err
    (tmp_path / "p.toml").write_text("")
    assert main(["calibrate", "--out", str(tmp_path / "p.toml")]) == 2
    assert "--overwrite" in capsys.readouterr().err


@pytest.mark.gpu
def test_gpu_measurements_are_plausible():
    found = {m.key: m.value for m in measure(
        quick=True, model=resolve_model("llama-3.2-1b"), peak_flops=989e12, disk_dir=None,
        gpu=True)}
    assert all(0.05 < e < 1.2 for _, e in found["gpu.matmul_efficiency"])
    assert all(0.01 < e < 1.5 for _, e in found["gpu.attention_forward_efficiency"])
    assert 1e10 < found["link.h2d"] < 2e11 and found["link.duplex"] > found["link.h2d"]
    assert 1e11 < found["gpu.hbm_bandwidth"] < 2e13 and 0 < found["gpu.kernel_launch"] < 1e-3
    busy = dict(found["gpu.busy_speedup"])
    assert sorted(busy) == [0.25, 0.5, 0.75, 0.9, 1.0] and all(0.7 < x < 1.6 for x in busy.values())


def test_attention_is_measured_at_whole_sequences_each_once():
    from layerslide.calibrate.gpu import attention_batches
    assert attention_batches([512, 1024, 2048, 65536], 1024) == [1, 2, 64]
    assert attention_batches([1024, 8192, 32768], 4096) == [1, 2, 8]


def test_host_bandwidth_is_the_fitted_capacity_else_the_largest_traffic():
    from layerslide.calibrate import _shared_host_bandwidth
    found = [Measurement(key="host.memory_bandwidth", value=30e9, how="copy"),
             Measurement(key="host.adamw_throughput", value=2e9, how="adamw"),
             Measurement(key="host.cast_throughput", value=20e9, how="cast")]
    bandwidth = {m.key: m for m in _shared_host_bandwidth(found)}["host.memory_bandwidth"]
    assert bandwidth.value == 56e9 and "(AdamW x 28 B)" in bandwidth.how
    # with a GPU the capacity fitted to AdamW beside the copies wins, even when lower
    with_dma = [*found, Measurement(key="shared_capacity_per_adamw", value=1.25, how="fitted")]
    got = {m.key: m for m in _shared_host_bandwidth(with_dma)}
    assert got["host.memory_bandwidth"].value == pytest.approx(1.25 * 56e9)
    assert "shared_capacity_per_adamw" not in got
    assert got["host.memory_bandwidth"].how.startswith("1.250 x AdamW x 28 B; fitted; the CPU ")


def test_a_profile_the_loader_refuses_is_not_written(tmp_path, capsys, monkeypatch):
    from layerslide import calibrate
    monkeypatch.setattr(calibrate, "measure", lambda **_kw: [Measurement(
        key="gpu.matmul_efficiency", value=((1024, 0.9), (8192, 1.03)), how="gemms")])
    assert main(["calibrate", "--out", str(tmp_path / "p.toml")]) == 2
    err = capsys.readouterr().err
    assert "do not make a valid profile" in err and "--base" in err
    assert list(tmp_path.iterdir()) == []


def test_ram_can_be_given_for_machines_whose_ram_grows_as_used(tmp_path, monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert main(["calibrate", "--quick", "--out", str(tmp_path / "p.toml"),
                 "--ram", "128GiB"]) == 0
    profile = load_profile(tmp_path / "p.toml")
    assert profile.host.ram_bytes == 128 * 2**30 and "given" in profile.sources["host.ram"]


def test_disk_probe_files_stop_where_told_and_count_what_they_moved(tmp_path):
    """The both-at-once probe counts bytes until the first direction is done: each side stops
    at its next 64 MiB call once told, and says how much it moved."""
    import threading

    from layerslide.calibrate.host import _read_file, _write_file
    from layerslide.executor.nvme import aligned_buffer
    from layerslide.executor.stripes import CHUNK_BYTES

    buf = memoryview(aligned_buffer(CHUNK_BYTES).numpy())
    path = tmp_path / "f.bin"
    assert _write_file(path, 2 * CHUNK_BYTES, 0, buf) == 2 * CHUNK_BYTES
    assert path.stat().st_size == 2 * CHUNK_BYTES
    assert _read_file(path, 2 * CHUNK_BYTES, 0, buf) == 2 * CHUNK_BYTES
    stopped = threading.Event()
    stopped.set()
    assert _read_file(path, 2 * CHUNK_BYTES, 0, buf, stop=stopped) == 0
    assert _write_file(tmp_path / "g.bin", 2 * CHUNK_BYTES, 0, buf, stop=stopped) == 0


def test_a_busy_speedup_table_is_written_and_read_back(tmp_path):
    base = load_profile("h200-bench")
    table = ((0.25, 1.18), (0.5, 1.17), (1.0, 1.0))
    profile = merged_profile(base, [Measurement(key="gpu.busy_speedup", value=table,
                                                how="bursts with idle gaps")],
                             name="mine", quick=True)
    again = load_profile(save_profile(profile, tmp_path / "mine.toml"))
    assert again.gpu.busy_speedup == table
    assert "bursts with idle gaps" in again.sources["gpu.busy_speedup"]


def test_adamw_blocks_take_at_most_a_quarter_of_the_ram(monkeypatch):
    from layerslide import calibrate
    from layerslide.calibrate import host
    seen = []
    monkeypatch.setattr(host, "adamw_throughput",
                        lambda numel, repeats, arrays: seen.append(numel) or Measurement(
                            key="host.adamw_throughput", value=1e9, how="stub"))
    monkeypatch.setattr(host, "machine_sizes", lambda *a: [])
    monkeypatch.setattr(host, "compact_adamw_throughput", lambda *a: [Measurement(
        key="host.adamw_bf16_throughput", value=3e9, how="stub")])
    monkeypatch.setattr(host, "memory_bandwidth", lambda *a: Measurement(
        key="host.memory_bandwidth", value=1e10, how="stub"))
    monkeypatch.setattr(host, "cast_throughput", lambda *a: Measurement(
        key="host.cast_throughput", value=1e9, how="stub"))
    monkeypatch.setattr(calibrate, "ADAMW_BLOCK_PARAMS", 64 * 2**20)
    model = resolve_model("llama-3.2-1b")
    # 4 blocks of 14 B/param within a quarter of 3.5 GiB (--ram): 16 Mi params each
    measure(quick=True, model=model, peak_flops=989e12, disk_dir=None, gpu=False,
            ram_bytes=224 * 16 * 2**20)
    # each sample at blocks of 16 Mi, then of 2 Mi (the call's fixed time)
    assert seen == [4 * 16 * 2**20, 4 * 2 * 2**20] * calibrate.ADAMW_SAMPLES_QUICK
    measure(quick=True, model=model, peak_flops=989e12, disk_dir=None, gpu=False,
            ram_bytes=2**40)  # plenty: the full 64 Mi
    assert seen[-2] == 4 * 64 * 2**20


def _stub_host_steps(monkeypatch, adamw_rates):
    from layerslide.calibrate import host
    rates, calls = iter(adamw_rates), []

    def adamw(numel, repeats, arrays):  # a sample's large blocks, then its small ones alike
        calls.append(next(rates) if len(calls) % 2 == 0 else calls[-1])
        return Measurement(key="host.adamw_throughput", value=calls[-1], how="4 arrays in turn")
    monkeypatch.setattr(host, "adamw_throughput", adamw)
    monkeypatch.setattr(host, "machine_sizes", lambda *a: [])
    monkeypatch.setattr(host, "compact_adamw_throughput", lambda *a: [Measurement(
        key="host.adamw_bf16_throughput", value=3e9, how="stub")])
    monkeypatch.setattr(host, "memory_bandwidth", lambda *a: Measurement(
        key="host.memory_bandwidth", value=1e10, how="stub"))
    monkeypatch.setattr(host, "cast_throughput", lambda *a: Measurement(
        key="host.cast_throughput", value=1e9, how="stub"))
    monkeypatch.setattr(host, "disk", lambda folder, nbytes: [Measurement(
        key="storage.read", value=1e9, how="stub")])


def test_the_adamw_rate_is_the_median_of_samples_spread_over_the_calibration(monkeypatch,
                                                                             tmp_path):
    from layerslide import calibrate
    monkeypatch.setattr(calibrate, "ADAMW_SPACING_S", 0.0)
    # median 4, mean 4.2, first 9, last 5: only the median gives 4
    _stub_host_steps(monkeypatch, [9e9, 1e9, 4e9, 2e9, 5e9])
    steps: list[str] = []
    found = measure(quick=False, model=resolve_model("llama-3.2-1b"), peak_flops=989e12,
                    disk_dir=tmp_path, gpu=False, progress=steps.append)
    adamw = next(m for m in found if m.key == "host.adamw_throughput")
    assert adamw.value == pytest.approx(4e9)
    assert adamw.how.startswith("4 arrays in turn; the median of 5 such runs")
    # both sizes ran at one rate: no fixed time a call
    call = next(m for m in found if m.key == "host.adamw_call_overhead")
    assert call.value == pytest.approx(0.0, abs=1e-12)
    assert "9.00, 1.00, 4.00, 2.00, 5.00 Gparam/s" in adamw.how
    # the later steps (cast, disk) lie between the samples, the last sample at the end
    assert steps == ["sizes", "host memory bandwidth", "CPU AdamW", "CPU AdamW again (2 of 5)",
                     "CPU AdamW with compact moments", "CPU AdamW again (3 of 5)",
                     "fp32->bf16 cast", "CPU AdamW again (4 of 5)", "disk",
                     "CPU AdamW again (5 of 5)"]
    assert next(m for m in found if m.key == "host.adamw_bf16_throughput").value == 3e9
    # the host bandwidth without a GPU is the largest CPU traffic: AdamW's at the median
    bandwidth = next(m for m in found if m.key == "host.memory_bandwidth")
    assert bandwidth.value == pytest.approx(4e9 * 28)


def test_adamw_samples_back_to_back_wait_their_spacing(monkeypatch):
    from layerslide import calibrate
    _stub_host_steps(monkeypatch, [1e9, 2e9, 3e9])
    clock = [100.0]
    slept: list[float] = []
    monkeypatch.setattr(calibrate.time, "monotonic", lambda: clock[0])
    monkeypatch.setattr(calibrate.time, "sleep", slept.append)
    samples = calibrate.AdamwSamples(numel=4, repeats=1, wanted=3, spacing_s=3.0)
    samples.sample()
    clock[0] += 1.0  # another step ran for 1 s in between
    samples.sample()
    samples.sample()  # right after the last
    assert slept == [2.0, 3.0]
    assert samples.measurements()[0].value == pytest.approx(2e9)
    with pytest.raises(ValueError, match="at least one AdamW sample"):
        calibrate.AdamwSamples(numel=4, repeats=1, wanted=0)


@pytest.mark.parametrize("native", ["1", "0"])
def test_adamw_blocks_update_their_own_arrays_with_or_without_the_native_kernel(
        monkeypatch, native):
    from layerslide.calibrate.host import adamw_blocks
    monkeypatch.setenv("LAYERSLIDE_NATIVE", native)
    steps, kernel = adamw_blocks(4096, 2)
    assert len(steps) == 2 and ("native" in kernel) == (native == "1" and load_kernels() is not None)
    from layerslide.calibrate.host import native_workers_nice
    assert native_workers_nice() == 0  # nothing in this test process niced the workers
    for step in steps:
        step()  # runs: calibrate's sharing step needs no compiler either


def test_the_read_share_is_the_reads_part_of_the_bytes_moved_at_once(monkeypatch, tmp_path):
    from layerslide.calibrate import host

    monkeypatch.setattr(host, "_write_file", lambda *a, stop=None: 1 * host.CHUNK_BYTES)
    monkeypatch.setattr(host, "_read_file", lambda *a, stop=None: 3 * host.CHUNK_BYTES)
    rate, read_share = host._both_at_once(tmp_path / "a", tmp_path / "b", 4 * host.CHUNK_BYTES,
                                          0, [None, None])
    assert read_share == 0.75 and rate > 0


def test_several_disk_folders_record_the_slowest_drive_and_their_count(tmp_path, monkeypatch):
    """An even stripe waits for the slowest drive and fills the smallest: per field the least
    of the folders' figures, each folder's kept in the source, and the drive count."""
    from layerslide import calibrate
    from layerslide.calibrate.host import Measurement

    rates = {"a": 3e9, "b": 2e9, "c": 4e9}

    def fake_disk(folder, nbytes):
        r = rates[folder.name]
        return [Measurement(key="storage.write", value=r, how="w"),
                Measurement(key="storage.read", value=2 * r, how="r"),
                Measurement(key="storage.capacity", value=10 * r if folder.name != "c" else 1e9,
                            how="free")]

    monkeypatch.setattr(calibrate.host, "disk", fake_disk)
    found = {m.key: m for m in calibrate._disk([tmp_path / n for n in "abc"], 2**30)}
    assert found["storage.write"].value == 2e9 and found["storage.read"].value == 4e9
    assert found["storage.capacity"].value == 1e9
    assert found["storage.drives"].value == 3
    assert "the least of 3 drives" in found["storage.write"].how
    assert f"{tmp_path / 'c'}: 4" in found["storage.write"].how
    one = calibrate._disk([tmp_path / "a"], 2**30)
    assert [m.key for m in one] == ["storage.write", "storage.read", "storage.capacity",
                                    "storage.drives"]


def test_a_calls_fixed_time_comes_from_two_block_sizes_and_leaves_the_rate_of_the_rest():
    from layerslide import calibrate
    # blocks of 64 Mi and 8 Mi params at call 2 ms + n / 5e9
    large, small = 64 * 2**20, 8 * 2**20
    rate = {n: n / (2e-3 + n / 5e9) for n in (large, small)}
    call = calibrate.adamw_call_s((large, small), (rate[large], rate[small]))
    assert call == pytest.approx(2e-3)
    assert calibrate.without_call(rate[large], large, call) == pytest.approx(5e9)
    # noise: the small blocks ran faster, so no fixed time; nor more than a small call's time
    assert calibrate.adamw_call_s((large, small), (4e9, 4.4e9)) == 0.0
    assert calibrate.adamw_call_s((large, small), (4e9, 1e6)) == pytest.approx(small / 1e6)
    assert calibrate.without_call(4e9, large, 1.0) == 4e9  # a call longer than its block


def test_adamw_samples_give_the_rate_without_the_call_and_the_call(monkeypatch):
    from layerslide import calibrate
    from layerslide.calibrate import host
    numel = 4 * 64 * 2**20
    monkeypatch.setattr(host, "adamw_throughput", lambda n, repeats, arrays: Measurement(
        key="host.adamw_throughput", value=(n / arrays) / (2e-3 + n / arrays / 5e9), how="x"))
    samples = calibrate.AdamwSamples(numel=numel, repeats=1, wanted=1)
    samples.sample()
    rate, call = samples.measurements()
    assert (rate.key, call.key) == ("host.adamw_throughput", "host.adamw_call_overhead")
    assert rate.value == pytest.approx(5e9) and call.value == pytest.approx(2e-3)
    assert "less 2.00 ms a call" in rate.how and "at 64 Mi params a block" in call.how


def test_the_sharing_runs_are_fitted_on_adamws_bytes_without_its_calls():
    from layerslide import calibrate
    block = 100 * 2**20
    runs = {"adamw": {"adamw": 120e9}, "h2d": {"h2d": 55e9}, "adamw+h2d": {"adamw": 100e9,
                                                                           "h2d": 38e9}}
    out = calibrate.without_call_in_sharing(runs, block, 2e-3)
    for mode in ("adamw", "adamw+h2d"):
        block_s = block * 28 / runs[mode]["adamw"]
        assert out[mode]["adamw"] == pytest.approx(block * 28 / (block_s - 2e-3))
    assert out["h2d"] == runs["h2d"] and out["adamw+h2d"]["h2d"] == 38e9
    assert calibrate.without_call_in_sharing(runs, block, 0.0) == runs


def test_the_launch_time_is_the_median_round_after_a_warm_up(monkeypatch):
    from layerslide.calibrate import gpu
    durations = iter([50.0, 1.0, 2.0, 3.0, 4.0, 100.0])  # the warm-up round, then 5 rounds
    clock = []

    def perf_counter():  # start and end of each round
        if len(clock) % 2 == 0:
            clock.append(0.0)
        else:
            clock.append(next(durations))
        return clock[-1]
    monkeypatch.setattr(gpu, "time", types.SimpleNamespace(perf_counter=perf_counter))
    monkeypatch.setattr(gpu.torch.cuda, "synchronize", lambda: None)
    assert gpu.median_launch_s(torch.zeros(1), launches=10, rounds=5) == pytest.approx(0.3)


def test_a_launch_price_beside_the_cpu_kernels_is_written_and_read_back(tmp_path):
    base = load_profile("rtx4090-256gb")
    assert base.host.kernel_launch_beside_kernels_s is None  # not measured there
    profile = merged_profile(base, [Measurement(key="host.kernel_launch_beside_kernels",
                                                value=19e-6, how="beside AdamW")],
                             name="mine", quick=True)
    again = load_profile(save_profile(profile, tmp_path / "mine.toml"))
    assert again.host.kernel_launch_beside_kernels_s == pytest.approx(19e-6)
    assert "beside AdamW" in again.sources["host.kernel_launch_beside_kernels"]


def test_launches_beside_the_cpu_kernels_leave_no_thread_and_the_switch_interval_behind():
    import sys
    import threading

    from layerslide.calibrate.gpu import launch_beside_kernels

    switch_s, threads = sys.getswitchinterval(), threading.active_count()
    tiny = torch.zeros(1)  # on the CPU its op's dispatch is what is timed
    found = launch_beside_kernels(tiny, 2**16, launches=200, rounds=2, pollers=2)
    assert found.key == "host.kernel_launch_beside_kernels" and found.value > 0
    assert "2 threads polling" in found.how
    assert tiny.item() == 3 * 200  # a warm-up round and two timed ones ran beside them
    assert sys.getswitchinterval() == switch_s and threading.active_count() == threads


def test_launches_beside_an_adamw_that_fails_are_refused_not_taken_for_beside_it(monkeypatch):
    from layerslide.calibrate import gpu

    def broken():
        raise MemoryError("no room for the block")
    monkeypatch.setattr(gpu, "adamw_blocks",
                        lambda size, arrays, nice: ([broken], "a broken AdamW"))
    with pytest.raises(RuntimeError, match="not timed beside it: MemoryError"):
        gpu.launch_beside_kernels(torch.zeros(1), 2**10, launches=10, rounds=1, pollers=1)


NICED_LAUNCH_SCRIPT = """
import torch
from layerslide.calibrate.gpu import launch_beside_kernels
from layerslide.executor.native import load_kernels
found = launch_beside_kernels(torch.zeros(1), 2**16, nice=19, launches=50, rounds=1, pollers=1)
print(found.key, load_kernels().worker_nice, "(its workers at nice 19)" in found.how)
"""


def test_the_launch_price_beside_niced_kernels_is_timed_with_their_workers_niced():
    """In a child: the workers' niceness is process-wide and not lowered again. (That each
    worker takes it, and the calling thread not: test_native.)"""
    import subprocess
    import sys

    if load_kernels() is None:
        pytest.skip("no C compiler for the native kernels")
    ran = subprocess.run([sys.executable, "-c", NICED_LAUNCH_SCRIPT], capture_output=True,
                         text=True, check=True, env={**os.environ, "OMP_NUM_THREADS": "2"})
    assert ran.stdout.split() == ["host.kernel_launch_beside_niced_kernels", "19", "True"]


NICED_THEN_PLAIN_SCRIPT = """
import torch
from layerslide.calibrate.gpu import launch_beside_kernels
launch_beside_kernels(torch.zeros(1), 2**12, nice=19, launches=10, rounds=1, pollers=0)
try:
    launch_beside_kernels(torch.zeros(1), 2**12, nice=0, launches=10, rounds=1, pollers=0)
except RuntimeError as err:
    print(err)
"""


@pytest.mark.skipif(not Path("/proc/self/task").is_dir(), reason="per-thread niceness: Linux")
def test_a_plain_launch_price_after_a_niced_one_in_one_process_is_refused():
    import subprocess
    import sys

    if load_kernels() is None:
        pytest.skip("no C compiler for the native kernels")
    ran = subprocess.run([sys.executable, "-c", NICED_THEN_PLAIN_SCRIPT], capture_output=True,
                         text=True, check=True, env={**os.environ, "OMP_NUM_THREADS": "2"})
    assert "run at nice 19, not 0" in ran.stdout and "time the price at nice 0 first" in ran.stdout


def test_calibrates_adamw_ignores_the_environments_niceness(monkeypatch):
    """Its workers stay at 0 for every step but the last (niceness is not lowered again)."""
    from layerslide.calibrate.host import _kernel_knobs

    monkeypatch.setenv("LAYERSLIDE_CPU_NICE", "19")
    assert _kernel_knobs()["nice"] == 0 and _kernel_knobs(19)["nice"] == 19


def test_a_launch_price_beside_workers_at_a_niceness_no_profile_field_holds_is_refused():
    from layerslide.calibrate.gpu import launch_beside_kernels

    with pytest.raises(ValueError, match="nice=10.*0 and 19 only"):
        launch_beside_kernels(torch.zeros(1), 2**10, nice=10)


def test_a_lanes_first_launch_price_is_written_and_read_back(tmp_path):
    profile = merged_profile(load_profile("h200-bench"), [Measurement(
        key="host.kernel_launch_beside_niced_kernels", value=22e-6, how="beside niced AdamW")],
        name="mine", quick=True)
    again = load_profile(save_profile(profile, tmp_path / "mine.toml"))
    assert again.host.kernel_launch_beside_niced_kernels_s == pytest.approx(22e-6)


def test_watched_lanes_are_measured_without_pollers(monkeypatch):
    from layerslide.calibrate.gpu import launch_beside_kernels

    monkeypatch.setenv("LAYERSLIDE_LANE_WAITS", "watch")
    found = launch_beside_kernels(torch.zeros(1), 2**12, launches=20, rounds=1)
    assert "0 threads polling" in found.how


def test_an_optional_field_that_fails_to_measure_is_left_out_with_a_warning(capsys):
    from layerslide.calibrate import _optional

    def fails():
        raise RuntimeError("workers run at nice 19, not 0")
    assert _optional("host.kernel_launch_beside_niced_kernels", fails) == []
    assert "kernel_launch_beside_niced_kernels not measured (workers run" in capsys.readouterr().err
    found = [Measurement(key="host.kernel_launch_beside_niced_kernels", value=2e-5, how="x")]
    assert _optional("host.kernel_launch_beside_niced_kernels", lambda: found) == found
