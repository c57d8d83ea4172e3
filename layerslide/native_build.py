"""C sources compiled with the system C compiler on first use, cached per source, flags,
compiler and CPU under ~/.cache/layerslide (XDG_CACHE_HOME): the executor's AdamW kernels and
the simulator's engine. Where no compiler is found or the build fails, `build` returns None and
the caller keeps its Python (or torch) path; a failed build is said once and remembered
(`*.failed` beside where the library would be: deleting it tries again). LAYERSLIDE_NATIVE=0
builds nothing: every caller takes its other path."""

from __future__ import annotations

import hashlib
import os
import platform
import shlex
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path


def cache_dir() -> Path:
    root = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(root) / "layerslide"


def _cpu_flags() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            return next((line for line in f if line.startswith("flags")), "")
    except OSError:
        return ""


def build(source: Path, flags: tuple[str, ...], fallback: str) -> Path | None:
    """The shared library of `source` built with `flags` (linked with -lm), or None; fallback
    names what the caller uses instead, for the message a failed build prints."""
    if os.environ.get("LAYERSLIDE_NATIVE", "1") == "0":
        return None
    compiler = shlex.split(os.environ.get("CC", "")) or [
        c for c in (shutil.which("cc") or shutil.which("gcc"),) if c]
    if not compiler:
        return None
    # -march=native: a library built on one CPU may not run on another sharing this cache
    machine = f"{platform.machine()} {_cpu_flags()}".encode()
    digest = hashlib.sha256(source.read_bytes() + " ".join([*compiler, *flags]).encode()
                            + machine).hexdigest()[:16]
    target = cache_dir() / f"{source.stem}-{digest}.so"
    failed = target.with_suffix(".failed")
    if target.is_file():
        return target
    if failed.is_file():  # said when it failed; every process would try and say it again
        return None
    target.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=target.parent) as tmp:
        built = Path(tmp) / target.name
        try:
            result = subprocess.run([*compiler, *flags, str(source), "-o", str(built), "-lm"],
                                    capture_output=True, text=True, check=False)
        except OSError as err:
            print(f"layerslide: cannot run {compiler[0]} ({err}), {fallback}", file=sys.stderr)
            return None
        if result.returncode != 0:
            failed.write_text(result.stderr)
            print(f"layerslide: {source.name} did not compile, {fallback} (the compiler's "
                  f"messages are in {failed}; delete it to try again)", file=sys.stderr)
            return None
        os.replace(built, target)  # atomic: concurrent builders each land a whole file
    return target
