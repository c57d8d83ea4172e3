"""Planner: model shapes + training settings + policy -> Plan, a DAG of tasks on lanes."""

from layerslide.planner.build import build_plan
from layerslide.planner.model import (
           PRESETS,
           ModelSpec,
           model_from_hf_config,
           preset_names,
           resolve_model,
)
from layerslide.planner.plan import EMBEDDING, LANES, Buffer, Plan, Task
from layerslide.planner.settings import Policy, TrainSpec

__all__ = ["EMBEDDING", "LANES", "PRESETS", "Buffer", "ModelSpec", "Plan", "Policy", "Task",
           "TrainSpec", "build_plan", "model_from_hf_config", "preset_names", "resolve_model"]
