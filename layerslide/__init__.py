"""layerslide: fine-tune LLMs larger than GPU memory on one GPU by sliding a window over the layers.

The names a notebook needs, imported on first use (so that `import layerslide` needs no torch):
plan (`resolve_model`, `TrainSpec`, `Policy`, `build_repeatable_plan`), predict (`load_profile`,
`simulate`, `tune`), and train (`open_token_source`, `OptimConfig`, `Trainer`). The README's
"Python API" section shows them together.
"""

import importlib

__version__ = "0.1.0"

_EXPORTS = {
    "ModelSpec": "layerslide.planner.model", "PRESETS": "layerslide.planner.model",
    "resolve_model": "layerslide.planner.model",
    "Plan": "layerslide.planner.plan",
    "Policy": "layerslide.planner.settings", "TrainSpec": "layerslide.planner.settings",
    "build_plan": "layerslide.planner.build",
    "build_repeatable_plan": "layerslide.planner.build",
    "load_profile": "layerslide.hwprofiles",
    "simulate": "layerslide.simulator",
    "SearchSpace": "layerslide.tuner", "tune": "layerslide.tuner",
    "open_token_source": "layerslide.data.sources",
    "split_token_sources": "layerslide.data.sources", "eval_batches": "layerslide.data.sources",
    "OptimConfig": "layerslide.executor.optim",
    "CheckpointSchedule": "layerslide.training.train_state", "Trainer": "layerslide.training.trainer",
    "EvalSchedule": "layerslide.training.trainer",
}
__all__ = list(_EXPORTS)


def __getattr__(name: str):
    if name not in _EXPORTS:
        raise AttributeError(f"module 'layerslide' has no attribute {name!r}")
    value = getattr(importlib.import_module(_EXPORTS[name]), name)
    globals()[name] = value  # once imported, a plain attribute
    return value


def __dir__() -> list[str]:
    return sorted([*globals(), *_EXPORTS])
