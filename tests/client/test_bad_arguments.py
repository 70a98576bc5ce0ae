"""Arguments of the wrong type to the client's calls are BadRequestErrors raised before
anything is written: a password or a custom metadata value that is not bytes (``bytes()``
would refuse a str with a TypeError, and take an int as a count of zero bytes), a custom
metadata key that is not str, custom metadata that is not a mapping."""

from __future__ import annotations

from typing import Any

import pytest

from zbk.errors import BadRequestError

from . import sim
from .sim import SimCluster


@pytest.mark.parametrize("kw, message", [
    ({"password": "pw"}, "password must be bytes, not str"),
    ({"password": 5}, "password must be bytes, not int"),
    ({"custom_metadata": {"owner": "billing"}}, "custom metadata 'owner' must be bytes, not str"),
    ({"custom_metadata": {7: b"x"}}, "keys must be str, not int"),
    ({"custom_metadata": [("owner", b"billing")]}, "custom_metadata must be a mapping"),
])
def test_create_ledger_refuses_arguments_of_the_wrong_type(kw: dict[str, Any], message: str) -> None:
    async def scenario() -> None:
        c = SimCluster(sim.seed_from_env(), bookies=3)
        bk = c.client("writer")
        with pytest.raises(BadRequestError, match=message):
            await bk.create_ledger(3, 2, 2, **kw)
        assert await bk.list_ledgers() == []  # nothing was created

    sim.run(scenario())


@pytest.mark.parametrize("recovery", [True, False])
def test_open_ledger_refuses_a_password_that_is_not_bytes(recovery: bool) -> None:
    async def scenario() -> None:
        c = SimCluster(sim.seed_from_env(), bookies=3)
        bk = c.client("writer")
        lh = await bk.create_ledger(3, 2, 2, password=b"pw")
        await lh.append(b"x")
        with pytest.raises(BadRequestError, match="password must be bytes, not str"):
            await bk.open_ledger(lh.ledger_id, password="pw", recovery=recovery)  # type: ignore[arg-type]
        assert (await bk.ledger_metadata(lh.ledger_id)).state == "OPEN"  # nothing was fenced
        rh = await bk.open_ledger(lh.ledger_id, password=bytearray(b"pw"), recovery=recovery)
        assert rh.ledger_id == lh.ledger_id

    sim.run(scenario())
