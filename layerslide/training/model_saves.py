"""`layerslide train --save-every N`: the model as an HF folder every N steps, beside --out
(OUT-step-N), the newest --keep-saves of this run's kept (an earlier run's are left alone).
Each is written atomically (hf_io.save_hf_folder); the older ones go once a newer one is whole."""

from __future__ import annotations

import re
import shutil
from pathlib import Path

from layerslide.training.run import RunError


class ModelSaves:
    def __init__(self, out: str, every_steps: int, keep: int):
        if every_steps < 1:
            raise RunError(f"--save-every {every_steps}: save at most every step (>= 1)")
        if keep < 1:
            raise RunError(f"--keep-saves {keep}: keep at least 1")
        self.out, self.every_steps, self.keep = Path(out).expanduser(), every_steps, keep
        self._pattern = re.compile(re.escape(self.out.name) + r"-step-(\d+)")
        self._own: dict[int, Path] = {}  # the saves --keep-saves prunes: this run's alone

    def adopt_existing(self) -> None:
        """A resumed run's saves beside --out are its own, to prune as it saves on."""
        self._own.update(self.existing())

    def folder_of(self, step: int) -> Path:
        return self.out.parent / f"{self.out.name}-step-{step}"

    def check_free(self, total_steps: int, overwrite: bool) -> None:
        """Refuse, before work, a run whose saves would land on folders already there."""
        taken = [self.folder_of(step) for step in range(self.every_steps, total_steps,
                                                        self.every_steps)
                 if self.folder_of(step).exists()]
        if taken and not overwrite:
            raise RunError(f"--save-every {self.every_steps} would write {taken[0]}, which "
                             "exists: pass --overwrite or choose another --out")

    def existing(self) -> list[tuple[int, Path]]:
        """The saves on disk beside --out, any run's, oldest first."""
        found = []
        if not self.out.parent.is_dir():
            return found
        for path in self.out.parent.iterdir():  # not glob: --out may hold [, * or ?
            match = self._pattern.fullmatch(path.name)
            if match and path.is_dir():
                found.append((int(match[1]), path))
        return sorted(found)

    def save(self, trainer, step: int, extra_files: dict[str, Path],
             after_write=None) -> Path | None:
        """Save the model at `step` (every rank calls it: rank 0 writes, the others take part
        in its gathers and get None) and prune this run's older saves."""
        saved = trainer.save(self.folder_of(step), overwrite=True, extra_files=extra_files)
        if saved is None:  # not the rank that writes
            return None
        if after_write is not None:
            after_write(saved)
        self._own[step] = saved
        for old_step in sorted(self._own)[:-self.keep]:  # another run's saves stay
            shutil.rmtree(self._own.pop(old_step), ignore_errors=True)
        return saved
