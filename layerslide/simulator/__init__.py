"""Simulator: runs a Plan on a HardwareProfile in SimPy and predicts time and memory.

Never imports the executor: both read the same Plan and write the same Trace.
"""

from layerslide.simulator.costmodel import CostModel
from layerslide.simulator.engine import run_plan
from layerslide.simulator.predict import (
    Overflow,
    Prediction,
    memory_limits,
    simulate,
    static_rejection,
)

__all__ = ["CostModel", "Overflow", "Prediction", "memory_limits", "run_plan", "simulate",
           "static_rejection"]
