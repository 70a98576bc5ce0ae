"""Entry id ranges: canonical form and packed wire form."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from zbk.wire.ranges import count_ids, is_canonical, iter_ids, pack_ranges, ranges_from_ids, unpack_ranges

I64_MAX = 2**63 - 1
id_sets = st.one_of(st.sets(st.integers(0, 300), max_size=100), st.sets(st.integers(0, I64_MAX), max_size=10))


@settings(max_examples=300, deadline=None)
@given(id_sets)
def test_ranges_round_trip(ids: set[int]) -> None:
    ranges = ranges_from_ids(ids)
    assert is_canonical(ranges)
    assert set(iter_ids(ranges)) == ids and count_ids(ranges) == len(ids)
    packed = pack_ranges(ranges)
    assert len(packed) == 16 * len(ranges)
    assert unpack_ranges(packed) == ranges
    assert unpack_ranges(memoryview(packed)) == ranges


def test_examples() -> None:
    assert ranges_from_ids([5, 0, 1, 2, 2, 9, 10]) == ((0, 2), (5, 5), (9, 10))
    assert ranges_from_ids([]) == ()
    assert pack_ranges(((1, 2),)) == (1).to_bytes(8, "big") + (2).to_bytes(8, "big")
    assert unpack_ranges(b"") == ()


@pytest.mark.parametrize(
    "ranges",
    [((3, 2),), ((-1, 2),), ((0, 2), (3, 4)), ((0, 5), (2, 8)), ((5, 6), (0, 1)), ((0, 0), (0, 0))],
)
def test_non_canonical_ranges_are_refused(ranges: tuple[tuple[int, int], ...]) -> None:
    assert not is_canonical(ranges)
    assert unpack_ranges(pack_ranges(ranges)) is None


def test_bad_lengths_are_refused() -> None:
    assert unpack_ranges(b"\x00" * 8) is None
    assert unpack_ranges(b"\x00" * 17) is None
