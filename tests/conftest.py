"""Shared test configuration: bounded hypothesis profiles and a seeded rng."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, settings
from hypothesis.database import DirectoryBasedExampleDatabase

settings.register_profile(
    "default", max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow]
)
settings.register_profile(
    "fuzz", max_examples=int(os.environ.get("GRADCOMPILER_FUZZ_EXAMPLES", "2000")), deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
    # the repository's ignored cache, wherever pytest runs from: a failure replays next run
    database=DirectoryBasedExampleDatabase(Path(__file__).parent.parent / ".hypothesis" / "examples"),
)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "default"))


@pytest.fixture
def rng() -> np.random.Generator:
    return np.random.default_rng(1234)
