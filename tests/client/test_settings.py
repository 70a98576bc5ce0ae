"""Client settings as keywords: ``zbk.BookKeeper(uri, add_timeout_ms=...)`` and the same
for ``zbk.AsyncBookKeeper``, alone or over the fields of a ``config=``."""

from __future__ import annotations

import asyncio
import dataclasses
import threading
from pathlib import Path

import pytest

import zbk
from zbk.config import ClientConfig
from zbk.errors import ConfigError


def _client_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name == "zbk-client"]


# Fields whose default + 1 is not a valid value: the value to try instead.
_VALID_OTHER = {"explicit_lac_interval_ms": 200}  # 0 is off, and on means at least 10 ms


def test_async_client_takes_every_field_as_a_keyword() -> None:
    for f in dataclasses.fields(ClientConfig):
        default = getattr(ClientConfig(), f.name)
        if isinstance(default, (bool, int)):
            value = not default if isinstance(default, bool) else _VALID_OTHER.get(f.name, default + 1)
            bk = zbk.AsyncBookKeeper("sqlite:///unused.db", **{f.name: value})
            assert getattr(bk.config, f.name) == value, f.name
    bk = zbk.AsyncBookKeeper("sqlite:///unused.db", add_timeout_ms=1234, read_timeout_ms=567)
    assert bk.config == ClientConfig(add_timeout_ms=1234, read_timeout_ms=567)


def test_async_keywords_override_the_fields_of_config() -> None:
    base = ClientConfig(add_timeout_ms=1000, read_timeout_ms=2000, speculative_read_ms=300)
    bk = zbk.AsyncBookKeeper("sqlite:///unused.db", config=base, read_timeout_ms=9000)
    assert bk.config == dataclasses.replace(base, read_timeout_ms=9000)
    assert base.read_timeout_ms == 2000  # the caller's config is left as it was


@pytest.mark.parametrize("kw, message", [
    ({"add_timeout": 5}, "unknown keyword 'add_timeout'; did you mean add_timeout_ms"),
    ({"speculative_read": 5}, "did you mean speculative_read_ms"),
    ({"add_timeout_ms": "200"}, "keyword 'add_timeout_ms' expects int"),
    ({"add_timeout_ms": 0}, "add_timeout_ms must be > 0"),
    ({"tail_long_polls": 0}, r"tail_long_polls must be in \[1, 64\], got 0"),
    ({"tail_long_polls": 65}, r"tail_long_polls must be in \[1, 64\]"),
    ({"curve_secret_key_file": "/k"}, "CURVE"),  # the merged config is validated as a whole
])
def test_async_bad_keywords_are_config_errors(kw: dict[str, object], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        zbk.AsyncBookKeeper("sqlite:///unused.db", **kw)  # type: ignore[arg-type]


def test_async_client_with_keywords_starts_and_closes(tmp_path: Path) -> None:
    async def main() -> ClientConfig:
        async with zbk.AsyncBookKeeper(f"sqlite:///{tmp_path}/meta.db", add_timeout_ms=4321) as bk:
            assert bk.ctx is not None
            return bk.ctx.config

    assert asyncio.run(main()).add_timeout_ms == 4321


def test_sync_client_takes_keywords_over_config(tmp_path: Path) -> None:
    base = ClientConfig(add_timeout_ms=1000, read_timeout_ms=2000)
    with zbk.BookKeeper(f"sqlite:///{tmp_path}/meta.db", config=base, add_timeout_ms=3000,
                        ensemble_change_attempts_max=7) as bk:
        assert bk.async_client.config == dataclasses.replace(base, add_timeout_ms=3000,
                                                             ensemble_change_attempts_max=7)
    with zbk.BookKeeper(f"sqlite:///{tmp_path}/meta.db", pending_adds_max=10) as bk:
        assert bk.async_client.config == ClientConfig(pending_adds_max=10)


def test_sync_unknown_keyword_is_a_config_error_and_leaves_no_thread(tmp_path: Path) -> None:
    before = len(_client_threads())
    with pytest.raises(ConfigError, match="unknown keyword 'read_timeout'; did you mean read_timeout_ms"):
        zbk.BookKeeper(f"sqlite:///{tmp_path}/meta.db", read_timeout=5)
    assert len(_client_threads()) == before
