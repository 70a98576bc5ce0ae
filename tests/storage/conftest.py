"""Shared fixtures for the storage tests."""

from __future__ import annotations

import os
import random

import pytest
from helpers.directio import direct_io_ok


@pytest.fixture
def rng() -> random.Random:
    """A seeded generator; the seed is printed so a failure can be replayed (ZBK_SEED=...)."""
    seed = int(os.environ.get("ZBK_SEED", random.randrange(2**32)))
    print(f"ZBK_SEED={seed}")
    return random.Random(seed)


@pytest.fixture
def ddir(tmp_path):
    """``tmp_path``, where its file system takes O_DIRECT writes; else the test is skipped."""
    if not direct_io_ok(str(tmp_path)):
        pytest.skip(f"{tmp_path}: the file system refuses O_DIRECT")
    return tmp_path
