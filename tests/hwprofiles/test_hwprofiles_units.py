"""Tests for unit conversion and parse_bytes."""

import pytest

from layerslide.hwprofiles import parse_bytes
from layerslide.hwprofiles.units import to_si


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("24GiB", 24 * 2**30),
        ("256 GB", 256 * 10**9),
        ("1.5TB", 1_500_000_000_000),
        ("1024", 1024),
        ("  2 KiB ", 2048),
        ("512B", 512),
        ("0.5MiB", 2**19),
        ("1e3 MB", 10**9),
        ("2TiB", 2 * 2**40),
    ],
)
def test_parse_bytes(text, expected):
    assert parse_bytes(text) == expected
    assert isinstance(parse_bytes(text), int)


def test_parse_bytes_gib_differs_from_gb():
    assert parse_bytes("24GiB") - parse_bytes("24GB") == 24 * (2**30 - 10**9)


@pytest.mark.parametrize("text", ["", "GB", "-5GB", "24 GiB/s", "abc", "1.2.3GB", "24 G B"])
def test_parse_bytes_rejects_garbage(text):
    with pytest.raises(ValueError, match="GiB"):
        parse_bytes(text)


def test_parse_bytes_suggests_the_right_case():
    with pytest.raises(ValueError, match="did you mean 'GB'"):
        parse_bytes("24gb")


def test_parse_bytes_rejects_non_strings():
    with pytest.raises(TypeError):
        parse_bytes(24)  # type: ignore[arg-type]


def test_to_si_converts_and_checks_kind():
    assert to_si(12, "us", "seconds") == pytest.approx(12e-6)
    assert to_si(3.7, "Gparam/s", "params/s") == pytest.approx(3.7e9)
    assert to_si(989, "TFLOP/s", "FLOP/s") == pytest.approx(989e12)
    assert to_si(1, "GiB/s", "bytes/s") == 2**30
    with pytest.raises(ValueError, match="expected a bytes unit"):
        to_si(1, "GB/s", "bytes")
    with pytest.raises(ValueError, match="unknown unit 'gb'"):
        to_si(1, "gb", "bytes")
