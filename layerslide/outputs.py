"""Every path a command will write, checked before any work starts: a run must not train for
hours and then fail to save. A check creates nothing; it writes and removes one probe file in
the folder (for a folder not made yet: the nearest one above it that exists). free_bytes and
filesystem_of say how much room a path's disk has, for the checks of what will be written."""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path


class OutputPathError(ValueError):
    """A path a command would write that it cannot: the message says what to choose instead."""


def _nearest_existing(path: Path) -> Path:
    while not path.exists():
        path = path.parent
    return path


def free_bytes(path: str | Path) -> int:
    """Bytes free to this process on the filesystem that holds (or will hold) path: the one
    place every space check asks (tests patch it where they cannot make a small disk)."""
    return shutil.disk_usage(_nearest_existing(Path(path).expanduser().absolute())).free


def size(nbytes: int) -> str:
    """Bytes as a person reads them (decimal units, as disks are sold)."""
    for unit, scale in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if nbytes >= scale:
            return f"{nbytes / scale:.2f} {unit}"
    return f"{nbytes} B"


def filesystem_of(path: str | Path) -> tuple[int, Path]:
    """(device id, mount point) of the filesystem that holds (or will hold) path: outputs on
    one device share its free bytes."""
    place = _nearest_existing(Path(path).expanduser().absolute())
    device = place.stat().st_dev
    while place != place.parent and place.parent.stat().st_dev == device:
        place = place.parent
    return device, place


def _probe(flag: str, shown: str, folder: Path) -> None:
    """Refuse unless a file can be made in `folder` (or, where it does not exist yet, in the
    nearest folder above it that does)."""
    base = _nearest_existing(folder)
    if not base.is_dir():
        raise OutputPathError(f"{flag} {shown}: {base} is a file, not a folder: choose another path")
    try:
        fd, probe = tempfile.mkstemp(prefix=".layerslide-probe-", dir=base)
        os.close(fd)
        os.unlink(probe)
    except OSError as err:
        raise OutputPathError(f"{flag} {shown}: cannot write in {base} ({err.strerror or err}): "
                         "choose a writable location") from err


def writable_file(flag: str, path: str | None, *, overwrite: bool = True) -> None:
    """A file the command writes (or appends to): not a folder, its folder writable, and an
    existing one only where `overwrite`."""
    if not path:
        return
    target = Path(path).expanduser()
    if target.is_dir():
        raise OutputPathError(f"{flag} {path} is a folder: give a file path")
    if target.exists() and not overwrite:
        raise OutputPathError(f"{flag} {path} exists: pass --overwrite or another file")
    if target.exists() and not os.access(target, os.W_OK):
        raise OutputPathError(f"{flag} {path}: the file is not writable: choose another path")
    if not target.parent.exists():  # files go into a folder that is there (folders are made)
        raise OutputPathError(f"{flag} {path}: folder {target.parent} does not exist: make it or "
                         "choose another path")
    _probe(flag, path, target.parent)


def writable_folder(flag: str, path: str | None, *, overwrite: bool = True) -> None:
    """A folder the command makes or writes into: not a file, writable, and an existing one
    only where `overwrite`."""
    if not path:
        return
    target = Path(path).expanduser()
    if target.exists() and not target.is_dir():
        raise OutputPathError(f"{flag} {path} is a file: give a folder path")
    if target.exists() and not overwrite:
        raise OutputPathError(f"{flag} {path} exists: pass --overwrite or another folder")
    _probe(flag, path, target)
