"""`layerslide train --save-every N`: the model as an HF folder every N steps, beside --out
(OUT-step-N), the newest --keep-saves of them kept. Each is written atomically
(hf_io.save_hf_folder); the older ones go once a newer one is whole."""

from __future__ import annotations

import re
import shutil
from pathlib import Path

from layerslide.cli.options import UsageError


class ModelSaves:
    def __init__(self, out: str, every_steps: int, keep: int):
        if every_steps < 1:
            raise UsageError(f"--save-every {every_steps}: save at most every step (>= 1)")
        if keep < 1:
            raise UsageError(f"--keep-saves {keep}: keep at least 1")
        self.out, self.every_steps, self.keep = Path(out).expanduser(), every_steps, keep
        self._pattern = re.compile(re.escape(self.out.name) + r"-step-(\d+)")

    def folder_of(self, step: int) -> Path:
        return self.out.parent / f"{self.out.name}-step-{step}"

    def check_free(self, total_steps: int, overwrite: bool) -> None:
        """Refuse, before work, a run whose saves would land on folders already there."""
        taken = [self.folder_of(step) for step in range(self.every_steps, total_steps,
                                                        self.every_steps)
                 if self.folder_of(step).exists()]
        if taken and not overwrite:
            raise UsageError(f"--save-every {self.every_steps} would write {taken[0]}, which "
                             "exists: pass --overwrite or choose another --out")

    def existing(self) -> list[tuple[int, Path]]:
        """This run's saves on disk, oldest first."""
        found = []
        for path in self.out.parent.glob(f"{self.out.name}-step-*"):
            match = self._pattern.fullmatch(path.name)
            if match and path.is_dir():
                found.append((int(match[1]), path))
        return sorted(found)

    def save(self, trainer, step: int, extra_files: dict[str, Path], after_write=None) -> Path:
        saved = trainer.save(self.folder_of(step), overwrite=True, extra_files=extra_files)
        if after_write is not None:
            after_write(saved)
        for _, old in self.existing()[:-self.keep]:
            shutil.rmtree(old, ignore_errors=True)
        return saved
