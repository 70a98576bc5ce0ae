"""Shared fixtures for the storage tests."""

from __future__ import annotations

import os
import random

import pytest


@pytest.fixture
def rng() -> random.Random:
    """A seeded generator; the seed is printed so a failure can be replayed (ZBK_SEED=...)."""
    seed = int(os.environ.get("ZBK_SEED", random.randrange(2**32)))
    print(f"ZBK_SEED={seed}")
    return random.Random(seed)
