"""Small helpers shared by the storage tests."""

from __future__ import annotations


def flip_byte(path: str, offset: int) -> None:
    """Invert one byte of a file in place (bit rot)."""
    with open(path, "r+b") as f:
        f.seek(offset)
        b = f.read(1)
        f.seek(offset)
        f.write(bytes([b[0] ^ 0xFF]))


def cut(path: str, size: int) -> None:
    """Truncate a file to ``size`` bytes (a torn write)."""
    with open(path, "r+b") as f:
        f.truncate(size)
