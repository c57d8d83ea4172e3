"""What a stopped run says (cli/stopping.py): where to resume from, whatever count of ranks
wrote its checkpoints."""

from __future__ import annotations

from types import SimpleNamespace

import torch

from layerslide.cli.stopping import stopped_status
from layerslide.training.checkpoint_store import CheckpointStore
from layerslide.training.rank_checkpoints import RANK_FOLDER, newest_checkpoint


def test_a_stopped_run_of_two_ranks_names_their_checkpoint(tmp_path, capsys):
    root = CheckpointStore(tmp_path / "ckpt")
    schedule = SimpleNamespace(store=root)
    assert stopped_status(SimpleNamespace(step=3), schedule, None) == 130
    assert "no checkpoint is kept" in capsys.readouterr().err
    layout = {"gpus": 2, "hosts": 1, "numel": {"0": 4}, "slice_numel": {"0": 2048}}
    for rank in (0, 1):  # rank 1 has not finished step 4: step 2 is the newest whole one
        store = CheckpointStore(root.root / RANK_FOLDER.format(rank))
        for step in (2, 4)[:2 - rank]:
            store.save(step, {"block_0": {"master": torch.zeros(2048)}},
                       {"ranks": {**layout, "local_rank": rank}})
    newest = newest_checkpoint(root)
    assert newest.step == 2 and newest.path.parent.name == RANK_FOLDER.format(0)
    assert stopped_status(SimpleNamespace(step=3), schedule, 15) == 143
    assert (f"checkpoint {newest.path} holds it: continue with `layerslide train --resume "
            f"{root.root}`") in capsys.readouterr().err
