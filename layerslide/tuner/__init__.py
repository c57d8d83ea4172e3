"""Tuning and what-if: search settings and hardware with the simulator.

tune (tuner.search) over a SearchSpace (tuner.space); one candidate's NVMe placement
(tuner.placement) and later stages (tuner.stages); the searches (tuner.best_first with its
bounds, tuner.bounds and tuner.levels; tuner.exhaustive); whatif and purchase on top."""

from layerslide.tuner.search import TuneResult, tune
from layerslide.tuner.space import Candidate, SearchSpace
from layerslide.tuner.stages import evaluate

__all__ = ["Candidate", "SearchSpace", "TuneResult", "evaluate", "tune"]
