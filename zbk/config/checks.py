"""The range checks every config section's ``validate()`` uses; each raises ConfigError
naming the key as the user wrote it."""

from __future__ import annotations

from zbk.errors import ConfigError


def positive(name: str, value: float) -> None:
    if value <= 0:
        raise ConfigError(f"{name} must be > 0, got {value!r}")


def non_negative(name: str, value: float) -> None:
    if value < 0:
        raise ConfigError(f"{name} must be >= 0, got {value!r}")


def ratio(name: str, value: float) -> None:
    if not 0.0 < value <= 1.0:
        raise ConfigError(f"{name} must be in (0, 1], got {value!r}")


def percent(name: str, value: float) -> None:
    if not 0.0 <= value <= 100.0:
        raise ConfigError(f"{name} must be in [0, 100], got {value!r}")


def tcp_port(name: str, value: int) -> None:
    if not 0 <= value <= 65535:
        raise ConfigError(f"{name} must be a TCP port (0-65535), got {value!r}")
