"""Fixtures shared by the planner, simulator and tuner tests (see helpers.py)."""

import pytest
from helpers import make_round_profile, make_tiny_model

from layerslide.hwprofiles import HardwareProfile
from layerslide.planner import ModelSpec


@pytest.fixture
def tiny_model() -> ModelSpec:
    return make_tiny_model()


@pytest.fixture
def round_profile() -> HardwareProfile:
    return make_round_profile()
