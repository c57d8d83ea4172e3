"""Tests for profiles built on a base, cards, prices and BASE+CARD,key=value variants."""

from pathlib import Path

import pytest

from layerslide.hwprofiles import (
    ProfileError,
    load_profile,
    parse_profile_spec,
    resolve_profile,
)

GiB = 2**30


def _write(tmp_path: Path, text: str, name: str = "box.toml") -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


def _rejects(text_or_path, field: str, *fragments: str) -> None:
    with pytest.raises(ProfileError) as info:
        if isinstance(text_or_path, Path):
            load_profile(text_or_path)
        else:
            resolve_profile(text_or_path)
    message = str(info.value)
    assert info.value.field == field, message
    for fragment in fragments:
        assert fragment in message, message


def test_a_base_with_overrides_replaces_only_the_fields_it_names(tmp_path):
    path = _write(tmp_path, '''
base = "workstation-8ch"
name = "my-box"
[host]
ram = { value = 384, unit = "GiB", source = "override: what I have" }
[price.platform]
value = 0
unit = "USD"
basis = "user"
source = "I own it"
''')
    mine, base = load_profile(path), load_profile("workstation-8ch")
    assert mine.name == "my-box" and mine.description == base.description
    assert mine.host.ram_bytes == 384 * GiB
    assert mine.host.memory_bytes_per_s == base.host.memory_bytes_per_s  # kept
    assert mine.sources["host.ram"] == "override: what I have"
    assert mine.sources["host.memory_bandwidth"] == base.sources["host.memory_bandwidth"]
    assert mine.prices.platform.value == 0 and mine.prices.gpu == base.prices.gpu
    assert mine.cost() == pytest.approx(base.cost() - 9000 - 128 * 10)


def test_a_card_brings_its_gpu_link_and_price():
    p = load_profile("workstation-4ch", gpu="rtx4090")
    assert p.name == "workstation-4ch+rtx4090"
    assert p.gpu.name == "NVIDIA GeForce RTX 4090"
    assert p.link.h2d_bytes_per_s == pytest.approx(27.7e9)  # PCIe 4.0 x16
    assert p.prices.gpu.value == 1599
    assert load_profile("workstation-4ch").link.h2d_bytes_per_s == pytest.approx(55.4e9)
    # a card without a price takes the base's GPU price away with its GPU
    assert load_profile("workstation-4ch", gpu="rx7900xtx").prices.gpu is None


def test_variant_spec_applies_card_ram_and_drives():
    p = resolve_profile("workstation-8ch+rtx-pro-6000,ram=256GiB,drives=4")
    assert p.name == "workstation-8ch+rtx-pro-6000,ram=256GiB,drives=4"
    assert p.gpu.memory_bytes == 96 * GiB and p.host.ram_bytes == 256 * GiB
    assert p.storage.drives == 4 and p.sources["storage.drives"] == "override"
    base = load_profile("workstation-8ch", gpu="rtx-pro-6000")
    assert p.cost() == pytest.approx(base.cost() - 256 * 10 + 3 * 200)
    assert resolve_profile("desktop-ddr5,gpu=rtx4090").gpu.name == "NVIDIA GeForce RTX 4090"
    assert parse_profile_spec("x+rtx4090,ram=1GB").text() == "x+rtx4090,ram=1GB"


@pytest.mark.parametrize("spec, field, fragment", [
    ("nosuch+rtx4090", "", "unknown hardware profile"),
    ("desktop-ddr5+rtx9090", "gpu", "unknown GPU card 'rtx9090'"),
    ("desktop-ddr5,colour=red", "colour", "unknown override; known: gpu"),
    ("desktop-ddr5,ram", "ram", "expected key=value"),
    ("desktop-ddr5,ram=lots", "ram", "cannot read 'lots' as a size"),
    ("desktop-ddr5,drives=0", "drives", "whole number >= 1"),
    ("desktop-ddr5,drives=two", "drives", "whole number >= 1"),
    ("desktop-ddr5,ram=1GB,ram=2GB", "ram", "given twice"),
    ("desktop-ddr5+rtx4090,gpu=rtx5090", "gpu", "two cards"),
    ("desktop-ddr5,ram=256GiB", "", "more than this platform takes (ram_max 128 GiB)"),
    ("desktop-ddr5,drives=4", "", "drives_max 2"),
])
def test_bad_variants_say_what_is_wrong(spec, field, fragment):
    _rejects(spec, field, fragment)


@pytest.mark.parametrize("price, field, fragment", [
    ('value = -5\nunit = "USD"\nbasis = "user"\nsource = "x"', "price.gpu.value", ">= 0"),
    ('value = 5\nunit = "dollars"\nbasis = "user"\nsource = "x"', "price.gpu.unit",
     "currency code"),
    ('value = 5\nunit = "USD"\nbasis = "guess"\nsource = "x"', "price.gpu.basis",
     "list, user"),
    ('value = 5\nunit = "USD"\nbasis = "list"\nsource = "x"', "price.gpu.date",
     "a list price says when"),
    ('value = 5\nunit = "EUR"\nbasis = "user"\nsource = "x"', "price", "mix currencies"),
    ('value = 5\nunit = "USD"\nbasis = "user"', "price.gpu.source", "missing"),
])
def test_bad_prices_are_refused(tmp_path, price, field, fragment):
    path = _write(tmp_path, f'base = "desktop-ddr5"\nname = "x"\n[price.gpu]\n{price}\n')
    _rejects(path, field, fragment)


def test_bad_bases_are_refused(tmp_path):
    _rejects(_write(tmp_path, 'base = "no-such"\nname = "x"\n'), "base", "unknown base profile")
    _rejects(_write(tmp_path, 'base = "desktop-ddr5"\n'), "name", "names itself")
    _write(tmp_path, 'base = "b.toml"\nname = "a"\n', "a.toml")
    _write(tmp_path, 'base = "a.toml"\nname = "b"\n', "b.toml")
    _rejects(tmp_path / "a.toml", "base", "circle")
    _rejects(_write(tmp_path, 'base = "desktop-ddr5"\nname = "x"\ngpu = "nope"\n'), "gpu",
             "unknown GPU card")
    _rejects(_write(tmp_path, 'base = "desktop-ddr5"\nname = "x"\n[price]\ntax = 1\n'),
             "price.tax", "unknown field")


def test_builtin_sources_must_say_what_they_are(tmp_path, monkeypatch):
    from layerslide.hwprofiles import loader

    base = loader.BUILTIN_DIR / "desktop-ddr5.toml"
    monkeypatch.setattr(loader, "BUILTIN_DIR", tmp_path)  # the file below is then a built-in
    body = base.read_text().replace('source = "datasheet Samsung 990 PRO 2 TB" }',
                                    'source = "from a forum" }')
    (tmp_path / "bad.toml").write_text(body)
    _rejects(tmp_path / "bad.toml", "storage.capacity.source", "must start with what it is")
