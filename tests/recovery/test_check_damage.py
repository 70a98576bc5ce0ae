"""The periodic check and the in-place repair against damage that only reading finds: an
index that answers EIO, and entries damaged between a fragment's first and last (embedded
store, in-memory bookies)."""

from __future__ import annotations

import asyncio
import random
from collections.abc import Iterator
from typing import Any

import pytest

from zbk.client.bookkeeper import ClientContext
from zbk.client.digest import make_digest
from zbk.config import ClientConfig
from zbk.errors import BookieUnavailableError, ConfigError
from zbk.metadata.ledger import LedgerMetadata
from zbk.metadata.registry import BookieRegistration, LedgerStore, register_bookie
from zbk.metadata.store import MetadataStore
from zbk.metadata.uri import open_store
from zbk.recovery.checker import CheckReport, LedgerChecker
from zbk.recovery.copier import EntryCopier, RateLimiter
from zbk.recovery.repair import InPlaceRepairer, expected_entries
from zbk.recovery.underreplication import UnderReplicationRegistry
from zbk.wire import messages as w
from zbk.wire.entry import build_entry, parse_entry
from zbk.wire.ops import AddFlag
from zbk.wire.status import Status

PW = b"secret"
BOOKIES = ["127.0.0.1:1", "127.0.0.1:2", "127.0.0.1:3"]
ENTRIES = 30


class Bookies:
    """In-memory bookies. ``index_broken``: a bookie whose listing answers EIO, and whose
    reads of ``eio`` entries do too (damaged slots), until a RECOVERY_ADD rewrites them."""

    def __init__(self) -> None:
        self.held: dict[str, dict[tuple[int, int], bytes]] = {b: {} for b in BOOKIES}
        self.eio: dict[str, set[int]] = {b: set() for b in BOOKIES}
        self.index_broken: set[str] = set()
        self._rid = 0

    def next_rid(self) -> int:
        self._rid += 1
        return self._rid

    def suspect(self, bookie: str, within_s: float = 5.0) -> bool:
        return False

    async def request(self, bookie: str, msg: Any, timeout_s: float) -> Any:
        if bookie not in self.held:
            raise BookieUnavailableError(f"{bookie} is down")
        held = self.held[bookie]
        if isinstance(msg, w.ListEntriesRequest):
            if bookie in self.index_broken:
                return w.ListEntriesResponse(rid=msg.rid, status=Status.EIO, ledger_id=msg.ledger_id, entry_ranges=())
            ids = sorted(e for (lid, e) in held if lid == msg.ledger_id)
            return w.ListEntriesResponse(rid=msg.rid, status=Status.EOK, ledger_id=msg.ledger_id,
                                         entry_ranges=tuple((e, e) for e in ids))
        if isinstance(msg, w.ReadRequest):
            e = msg.first_entry_id
            if e in self.eio[bookie]:
                return w.ReadResponse(rid=msg.rid, status=Status.EIO, ledger_id=msg.ledger_id, first_entry_id=e,
                                      lac=-1, entries=())
            blob = held.get((msg.ledger_id, e))
            return w.ReadResponse(rid=msg.rid, status=Status.EOK if blob else Status.ENOENTRY, ledger_id=msg.ledger_id,
                                  first_entry_id=e, lac=-1, entries=(blob,) if blob else ())
        assert isinstance(msg, w.AddRequest) and msg.flags == AddFlag.RECOVERY_ADD
        for raw in msg.entries:
            blob = bytes(raw)
            e = parse_entry(blob, make_digest("crc32c", PW), ledger_id=msg.ledger_id).entry_id
            held[(msg.ledger_id, e)] = blob
            self.eio[bookie].discard(e)  # the slot is written anew
        return w.AddResponse(rid=msg.rid, status=Status.EOK, ledger_id=msg.ledger_id, first_entry_id=0, last_entry_id=0)

    async def close(self) -> None:
        pass


class Env:
    def __init__(self, store: MetadataStore) -> None:
        self.store = store
        for b in BOOKIES:
            register_bookie(store, BookieRegistration(b), store.grant_lease(60))
        self.t = Bookies()
        self.ctx = ClientContext(store, self.t, ClientConfig(), random.Random(7))
        self.registry = UnderReplicationRegistry(store, "worker")
        md = LedgerMetadata(ledger_id=0, ensemble_size=3, write_quorum=2, ack_quorum=2, password=PW,
                            fragments=((0, tuple(BOOKIES)),))
        md, version = LedgerStore(store).create(md)
        self.md = md.closed(ENTRIES - 1, ENTRIES)
        LedgerStore(store).write(self.md, version)
        dg = make_digest(self.md.digest, PW)
        for e in range(ENTRIES):
            blob = build_entry(self.md.ledger_id, e, e - 1, bytes([e]) * 8, dg, ledger_length=8 * (e + 1))
            for b in self.md.write_set(e):
                self.t.held[b][(self.md.ledger_id, e)] = blob
        self.victim = BOOKIES[0]
        self.own = expected_entries(self.md, self.victim, closed_fragments_only=True)

    def check(self, percent: float = 0.0) -> CheckReport:
        report = CheckReport()
        checker = LedgerChecker(self.ctx, self.registry, verification_percent=percent, rng=random.Random(3))
        registered = {b: BookieRegistration(b) for b in BOOKIES}
        asyncio.run(checker.check_ledger(self.md.ledger_id, registered, report))
        return report

    def repair(self) -> int:
        repairer = InPlaceRepairer(self.ctx, self.registry, EntryCopier(self.ctx, RateLimiter(1e12)),
                                   self._registered)
        return asyncio.run(repairer.fill(self.md, self.victim, verify=True))

    async def _registered(self) -> set[str]:
        return set(BOOKIES)

    def damage(self, entry: int) -> None:
        """The victim's copy of ``entry`` answers with a bad digest."""
        key = (self.md.ledger_id, entry)
        blob = bytearray(self.t.held[self.victim][key])
        blob[-1] ^= 0xFF
        self.t.held[self.victim][key] = bytes(blob)


@pytest.fixture
def env(sqlite_uri: str) -> Iterator[Env]:
    store = open_store(sqlite_uri)
    try:
        yield Env(store)
    finally:
        store.close()


def test_a_replica_whose_index_answers_eio_is_marked_for_repair(env: Env) -> None:
    """The check counted a bookie that answered its listing with EIO as one that did not
    answer, and marked nothing: a damaged index was never repaired."""
    env.t.index_broken.add(env.victim)
    report = env.check()
    assert [(b, "cannot list" in what) for _, b, what in report.damaged] == [(env.victim, True)]
    assert report.unreachable == 0


def test_a_repair_rewrites_what_a_replica_behind_a_damaged_index_cannot_read(env: Env) -> None:
    """The repair needed the bookie's list of entries, and failed (and backed off, for
    ever) when its index answered EIO. It now reads each entry the bookie should hold."""
    env.t.index_broken.add(env.victim)
    damaged = {env.own[3], env.own[7]}
    env.t.eio[env.victim] |= damaged
    assert env.repair() == len(damaged)
    assert not env.t.eio[env.victim]


def test_damage_between_the_probes_is_found_only_by_reading_it(env: Env) -> None:
    middle = env.own[len(env.own) // 2]
    env.damage(middle)
    assert env.check(0).damaged == [], "the default reads only each replica's first and last entries"
    [(lid, bookie, what)] = env.check(100).damaged
    assert (lid, bookie) == (env.md.ledger_id, env.victim) and f"entry {middle}" in what
    assert env.repair() == 1 and env.check(100).damaged == []


def test_the_verification_percent_is_a_percentage() -> None:
    from zbk.config import AutoRecoveryConfig, load

    for bad in ("-1", "100.5"):
        with pytest.raises(ConfigError, match="auditor_ledger_verification_percent"):
            load(AutoRecoveryConfig, overrides=["metadata_uri=sqlite:///tmp/m.db",
                                                      f"auditor_ledger_verification_percent={bad}"]).validate()
    cfg = load(AutoRecoveryConfig, overrides=["metadata_uri=sqlite:///tmp/m.db",
                                              "auditor_ledger_verification_percent=25"]).validate()
    assert cfg.autorecovery.auditor_ledger_verification_percent == 25


def test_a_damaged_replica_is_marked_while_the_check_goes_on(env: Env) -> None:
    """A check of thousands of ledgers takes minutes; it marked what it found only at its
    end, so the replicators waited for the whole check. A ledger's damage is now marked as
    soon as that ledger is checked."""
    env.t.index_broken.add(env.victim)
    other = LedgerMetadata(ledger_id=0, ensemble_size=3, write_quorum=2, ack_quorum=2, password=PW,
                           fragments=((0, tuple(BOOKIES)),))
    other, version = LedgerStore(env.store).create(other)
    LedgerStore(env.store).write(other.closed(-1, 0), version)
    checker = LedgerChecker(env.ctx, env.registry, rng=random.Random(3))
    real = checker.check_ledger
    seen_during_check: list[bool] = []

    async def check_ledger(lid: int, registered: Any, report: CheckReport) -> None:
        if lid == other.ledger_id:
            for _ in range(100):  # the damaged ledger is checked meanwhile
                if env.registry.list_repairs():
                    break
                await asyncio.sleep(0.02)
            seen_during_check.append(bool(env.registry.list_repairs()))
        await real(lid, registered, report)

    checker.check_ledger = check_ledger  # type: ignore[method-assign]
    report = asyncio.run(checker.check_all())
    assert [b for _, b, _ in report.damaged] == [env.victim]
    assert seen_during_check == [True]
