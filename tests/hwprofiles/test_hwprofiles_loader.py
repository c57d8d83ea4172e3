"""Tests for strict TOML loading: load by path, and every rejection names the file and the field."""

import re
from pathlib import Path

import pytest

from layerslide.hwprofiles import ProfileError, load_profile
from layerslide.hwprofiles.loader import BUILTIN_DIR

H200 = (BUILTIN_DIR / "h200-bench.toml").read_text()


def _write(tmp_path: Path, text: str, name: str = "h200.toml") -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


def _sub(old: str, new: str, text: str = H200) -> str:
    """Replace exactly one line-level occurrence, so a broken test cannot pass by accident."""
    assert text.count(old) == 1, old
    return text.replace(old, new)


def _line(prefix: str) -> str:
    (line,) = [ln for ln in H200.splitlines() if ln.startswith(prefix)]
    return line


def _rejects(tmp_path: Path, text: str, field: str, *fragments: str) -> ProfileError:
    path = _write(tmp_path, text)
    with pytest.raises(ProfileError) as info:
        load_profile(path)
    message = str(info.value)
    assert "h200.toml" in message
    assert f": {field}:" in message, message
    for fragment in fragments:
        assert fragment in message, message
    assert info.value.field == field
    return info.value


def test_load_by_path_str_and_pathlike(tmp_path):
    path = _write(tmp_path, _sub('name = "h200-bench"', 'name = "my-box"'), "mine.toml")
    for arg in (path, str(path)):
        p = load_profile(arg)
        assert p.name == "my-box"
        assert p.path == str(path)
        assert p.link.h2d_bytes_per_s == pytest.approx(55.4e9)


def test_profile_error_is_a_value_error():
    assert issubclass(ProfileError, ValueError)


def test_unknown_name_lists_builtins():
    with pytest.raises(ProfileError, match="h200-bench.*rtx4090-256gb|rtx4090-256gb.*h200-bench"):
        load_profile("no-such-box")
    with pytest.raises(ProfileError, match="built-ins"):
        load_profile(Path("/nonexistent/box.toml"))


def test_missing_field(tmp_path):
    _rejects(tmp_path, _sub(_line("ram = ") + "\n", ""), "host.ram", "missing")


def test_missing_section(tmp_path):
    text = H200.split("[storage]")[0]
    _rejects(tmp_path, text, "storage", "missing")


def test_unknown_field_lists_known_ones(tmp_path):
    text = _sub("cores = {", "coers = {")
    _rejects(tmp_path, text, "host.coers", "unknown field", "cores", "memory_bandwidth")


def test_unknown_top_level_field(tmp_path):
    _rejects(tmp_path, "colour = 'green'\n" + H200, "colour", "unknown field")


def test_unknown_key_inside_a_quantity(tmp_path):
    old = 'h2d = { value = 55.4, unit = "GB/s",'
    text = _sub(old, 'h2d = { value = 55.4, units = "GB/s", unit = "GB/s",')
    _rejects(tmp_path, text, "link.h2d.units", "unknown field")


@pytest.mark.parametrize("value", ["-55.4", "0", "0.0"])
def test_non_positive_value(tmp_path, value):
    text = _sub("h2d = { value = 55.4,", f"h2d = {{ value = {value},")
    _rejects(tmp_path, text, "link.h2d.value", "> 0")


def test_a_copy_may_cost_host_memory_nothing_but_not_less(tmp_path):
    line = _line("dma_read_cost =")
    zero = _sub(line, line.replace("value = 0.483", "value = 0"))
    assert load_profile(_write(tmp_path, zero)).host.dma_read_cost == 0.0
    _rejects(tmp_path, _sub(line, line.replace("value = 0.483", "value = -0.1")),
             "host.dma_read_cost.value", ">= 0")


def test_missing_unit(tmp_path):
    text = _sub('h2d = { value = 55.4, unit = "GB/s",', "h2d = { value = 55.4,")
    _rejects(tmp_path, text, "link.h2d.unit", "missing")


def test_unknown_unit_lists_accepted_units(tmp_path):
    text = _sub('h2d = { value = 55.4, unit = "GB/s"', 'h2d = { value = 55.4, unit = "gb/s"')
    _rejects(tmp_path, text, "link.h2d.unit", "'gb/s'", "GB/s", "GiB", "TFLOP/s")


def test_wrong_unit_kind(tmp_path):
    text = _sub('memory = { value = 139, unit = "GiB"', 'memory = { value = 139, unit = "GB/s"')
    _rejects(tmp_path, text, "gpu.memory.unit", "'GB/s'", "bytes/s", "needs a bytes unit", "GiB")


def test_missing_source(tmp_path):
    line = _line("d2h = ")
    text = _sub(line, re.sub(r', source = ".*" }', " }", line))
    _rejects(tmp_path, text, "link.d2h.source", "missing")


def test_empty_source(tmp_path):
    line = _line("d2h = ")
    text = _sub(line, re.sub(r'source = ".*" }', 'source = "" }', line))
    _rejects(tmp_path, text, "link.d2h.source", "non-empty string")


def test_bare_number_instead_of_table(tmp_path):
    _rejects(tmp_path, _sub(_line("d2h = "), "d2h = 55.3"), "link.d2h", "must be a table", "unit")


def test_value_of_wrong_type(tmp_path):
    text = _sub("h2d = { value = 55.4,", 'h2d = { value = "55.4",')
    _rejects(tmp_path, text, "link.h2d.value", "must be a number")
    text = _sub("h2d = { value = 55.4,", "h2d = { value = true,")
    _rejects(tmp_path, text, "link.h2d.value", "must be a number")


def test_fractional_core_count(tmp_path):
    text = _sub("cores = { value = 16,", "cores = { value = 16.5,")
    _rejects(tmp_path, text, "host.cores.value", "whole")


def test_section_of_wrong_type(tmp_path):
    # Top-level keys must come before the first [table], so put it first.
    text = 'storage = "nvme"\n' + H200.split("[storage]")[0]
    _rejects(tmp_path, text, "storage", "must be a table")


def test_name_of_wrong_type(tmp_path):
    _rejects(tmp_path, _sub('name = "NVIDIA H200"', "name = 200"), "gpu.name", "non-empty string")


EFF = "gpu.matmul_efficiency"
ALL_EFF = "efficiency = [0.31, 0.46, 0.58, 0.67, 0.69, 0.70, 0.70, 0.68]"


@pytest.mark.parametrize(
    ("old", "new", "field", "fragment"),
    [
        ("efficiency = [0.31,", "efficiency = [1.31,", f"{EFF}.efficiency", "(0, 1]"),
        ("efficiency = [0.31,", "efficiency = [0.0,", f"{EFF}.efficiency", "(0, 1]"),
        ("efficiency = [0.31, ", "efficiency = [", EFF, "entries"),
        ("tokens = [512, 1024,", "tokens = [1024, 512,", f"{EFF}.tokens", "increasing"),
        ("tokens = [512,", "tokens = [-512,", f"{EFF}.tokens", "positive"),
        (ALL_EFF, "efficiency = []", f"{EFF}.efficiency", "non-empty"),
    ],
)
def test_bad_matmul_efficiency(tmp_path, old, new, field, fragment):
    _rejects(tmp_path, _sub(old, new), field, fragment)


def test_matmul_efficiency_missing_source(tmp_path):
    text = _sub(_line('source = "measured 2026-11-29 benchmarks/h200_probe.py (torch 2.11)') + "\n", "")
    _rejects(tmp_path, text, "gpu.matmul_efficiency.source", "missing")


def test_malformed_toml_names_the_file(tmp_path):
    path = _write(tmp_path, H200 + "\n[host\ncores = \n")
    with pytest.raises(ProfileError, match=r"h200\.toml.*malformed TOML"):
        load_profile(path)


def _storage_without_duplex() -> str:
    """h200-bench's profile without its storage.duplex and duplex_read_share lines."""
    storage = H200[H200.index("[storage]"):]
    kept = [line for line in storage.splitlines(keepends=True)
            if not line.startswith(("duplex = ", "duplex_read_share = "))]
    return H200[:H200.index("[storage]")] + "".join(kept)


def test_storage_duplex_is_optional_and_read_when_given(tmp_path):
    base = _storage_without_duplex()
    assert load_profile(_write(tmp_path, base)).storage.duplex_bytes_per_s is None  # turns
    assert load_profile("h200-bench").storage.duplex_bytes_per_s == pytest.approx(1.53e9)
    duplex = 'duplex = { value = 1.79, unit = "GB/s", source = "measured: both at once" }\n'
    text = _sub(_line("capacity = ") + "\n", _line("capacity = ") + "\n" + duplex, base)
    profile = load_profile(_write(tmp_path, text))
    assert profile.storage.duplex_bytes_per_s == pytest.approx(1.79e9)
    assert profile.sources["storage.duplex"] == "measured: both at once"
    _rejects(tmp_path, text.replace('unit = "GB/s", source = "measured: both',
                                    'unit = "GiB", source = "measured: both'),
             "storage.duplex.unit", "bytes/s")


def test_storage_duplex_read_share_is_optional_and_must_lie_between_0_and_1(tmp_path):
    base = _storage_without_duplex()
    assert load_profile(_write(tmp_path, base)).storage.read_share == 0.5  # an even split
    share = ('duplex_read_share = { value = 0.6, unit = "ratio", source = "measured: reads" }'
             "\n")
    text = _sub(_line("capacity = ") + "\n", _line("capacity = ") + "\n" + share, base)
    profile = load_profile(_write(tmp_path, text))
    assert profile.storage.read_share == pytest.approx(0.6)
    assert profile.sources["storage.duplex_read_share"] == "measured: reads"
    _rejects(tmp_path, text.replace("value = 0.6", "value = 1.2"), "storage",
             "duplex_read_share must lie in")


def test_host_dispatch_cores_is_optional_and_must_lie_within_the_cores(tmp_path):
    from layerslide.hwprofiles.writer import save_profile

    assert load_profile("h200-bench").host.dispatch_cores == 1.0  # not given: one thread's
    cores = 'dispatch_cores = { value = 2.5, unit = "ratio", source = "measured: beside" }\n'
    text = _sub(_line("adamw_throughput = ") + "\n", _line("adamw_throughput = ") + "\n" + cores)
    profile = load_profile(_write(tmp_path, text))
    assert profile.host.dispatch_cores == 2.5
    assert profile.sources["host.dispatch_cores"] == "measured: beside"
    again = load_profile(save_profile(profile, tmp_path / "again.toml"))
    assert again.host.dispatch_cores == 2.5 and again.sources == profile.sources
    _rejects(tmp_path, text.replace("value = 2.5", "value = 17.0"), "host",
             "dispatch_cores must lie in (0, cores=16]")


BUSY_SECTION = H200[H200.index("[gpu.busy_speedup]"):H200.index("[link]")]


def test_gpu_busy_speedup_is_optional_and_read_when_given(tmp_path):
    assert load_profile("h200-bench").gpu.busy_speedup == ((0.25, 1.18), (0.5, 1.18), (1.0, 1.0))
    assert load_profile(_write(tmp_path, _sub(BUSY_SECTION, ""))).gpu.busy_speedup is None
    text = _sub(BUSY_SECTION, '[gpu.busy_speedup]\nbusy = [0.5, 1.0]\nspeedup = [1.2, 1.0]\n'
                              'source = "measured: bursts with idle gaps"\n\n')
    profile = load_profile(_write(tmp_path, text))
    assert profile.gpu.busy_speedup == ((0.5, 1.2), (1.0, 1.0))
    assert profile.sources["gpu.busy_speedup"] == "measured: bursts with idle gaps"


@pytest.mark.parametrize(("old", "new", "field", "fragment"), [
    ("busy = [0.25, 0.5, 1.0]", "busy = [0.25, 0.5, 1.5]", "gpu.busy_speedup.busy", "(0, 1]"),
    ("busy = [0.25, 0.5, 1.0]", "busy = [0.5, 0.25, 1.0]", "gpu.busy_speedup.busy",
     "increasing"),
    ("busy = [0.25, 0.5, 1.0]", "busy = [0.5, 1.0]", "gpu.busy_speedup", "busy has 2 entries"),
    ("speedup = [1.18, 1.18, 1.0]", "speedup = [1.18, 0, 1.0]", "gpu.busy_speedup.speedup",
     "positive"),
])
def test_bad_gpu_busy_speedup(tmp_path, old, new, field, fragment):
    _rejects(tmp_path, _sub(old, new), field, fragment)


def test_gpu_busy_speedup_needs_its_source(tmp_path):
    source = next(ln for ln in BUSY_SECTION.splitlines() if ln.startswith("source"))
    _rejects(tmp_path, _sub(source + "\n", ""), "gpu.busy_speedup.source", "missing")


def test_storage_drives_is_optional_a_whole_count_and_written_back(tmp_path):
    from layerslide.hwprofiles.writer import to_toml

    assert load_profile("h200-bench").storage.drives == 1  # left out: one drive
    drives = 'drives = { value = 4, unit = "count", source = "four alike, one folder each" }\n'
    text = _sub(_line("capacity = ") + "\n", _line("capacity = ") + "\n" + drives, H200)
    profile = load_profile(_write(tmp_path, text))
    assert profile.storage.drives == 4
    assert profile.sources["storage.drives"] == "four alike, one folder each"
    again = tmp_path / "again.toml"
    again.write_text(to_toml(profile))
    assert load_profile(again).storage == profile.storage
    _rejects(tmp_path, text.replace("value = 4, unit", "value = 2.5, unit"), "storage.drives.value",
             "whole number")
