"""Tuning and what-if: search settings and hardware with the simulator."""

from layerslide.tuner.search import Candidate, SearchSpace, TuneResult, evaluate, tune

__all__ = ["Candidate", "SearchSpace", "TuneResult", "evaluate", "tune"]
