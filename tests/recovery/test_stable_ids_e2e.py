"""Auto-recovery with stable bookie ids (BP-41), real processes: bookies with name ids (one of
them moved to another port before) and one with a host:port id; a name-id bookie is killed
and `zbk autorecovery` re-replicates its ledgers, its replicators reading from name-id
bookies, the moved one included, and writing to whichever bookie placement picks."""

from __future__ import annotations

from collections import Counter

from helpers.procs import free_port
from helpers.wait import wait_until

import zbk
from zbk.client.raw import BookieConnection
from zbk.config import ClientConfig
from zbk.metadata import layout
from zbk.metadata.ledger import LedgerMetadata
from zbk.metadata.registry import LedgerStore, read_registration
from zbk.metadata.resolver import BookieResolver
from zbk.metadata.store import MetadataStore
from zbk.metadata.uri import open_store
from zbk.recovery.replicator import positions_held
from zbk.wire import messages as w

PW = b"pw"
FAST = ClientConfig(add_timeout_ms=3000, read_timeout_ms=3000, speculative_read_ms=300)
LEDGERS = 8
ENTRIES = 60
NAMES = ["bookie-a", "bookie-b", "bookie-c", "bookie-d"]


def data(lid: int, i: int) -> bytes:
    return b"%d:%d|" % (lid, i) * 16


def held(resolver: BookieResolver, bookie: str, lid: int) -> set[int]:
    with BookieConnection(bookie, timeout_s=5, address=resolver.address(bookie)) as c:
        resp = c.call(w.ListEntriesRequest(rid=c.next_rid(), ledger_id=lid))
    return {e for first, last in resp.entry_ranges for e in range(first, last + 1)}


def assert_fully_replicated(resolver: BookieResolver, md: LedgerMetadata) -> None:
    for index, (first, ensemble) in enumerate(md.fragments):
        last = md.fragment_end(index)
        for position, bookie in enumerate(ensemble):
            missing = set(positions_held(md, position, first, last)) - held(resolver, bookie, md.ledger_id)
            assert not missing, f"ledger {md.ledger_id}: {bookie} lacks {len(missing)} entries"


def registered_at(store: MetadataStore, bookie_id: str, address: str) -> bool:
    reg = read_registration(store, bookie_id)
    return reg is not None and reg.wire_address == address


def test_name_id_bookies_are_rereplicated_and_serve_as_sources(rcluster) -> None:
    bookies = rcluster.start_bookies(5, ids=[*NAMES, None])
    plain = bookies[-1].bookie_id
    assert plain == bookies[-1].address  # the host:port one, beside the named ones
    store = open_store(rcluster.uri)
    try:
        assert registered_at(store, plain, plain), "a host:port bookie registers its id as its address"
        with zbk.BookKeeper(rcluster.uri, config=FAST) as bk:
            ledgers: dict[int, tuple[str, ...]] = {}
            for _ in range(LEDGERS):
                lh = bk.create_ledger(3, 2, 2, password=PW)
                futs = [lh.append_async(data(lh.ledger_id, i)) for i in range(ENTRIES)]
                assert [f.result(30) for f in futs] == list(range(ENTRIES))
                lh.close()
                ledgers[lh.ledger_id] = tuple(lh.metadata.ensembles[0])
        counts = Counter(b for ensemble in ledgers.values() for b in ensemble if b in NAMES)
        victim = counts.most_common(1)[0][0]
        victim_ledgers = {lid for lid, ensemble in ledgers.items() if victim in ensemble}
        # Another named bookie that shares a ledger with the victim moves to a new port first,
        # so that the replicators must find it at its registered address to copy from it.
        mover_id = next(b for lid in sorted(victim_ledgers) for b in ledgers[lid] if b in NAMES and b != victim)
        mover = rcluster.by_id(mover_id)
        assert mover.stop() == 0
        mover.port = free_port()
        mover.start()
        wait_until(lambda: registered_at(store, mover_id, mover.address), timeout_s=30,
                   message=f"{mover_id} registered at {mover.address}")

        ar = rcluster.start_autorecovery(lost_bookie_recovery_delay_s=0, replicator_workers=2)
        wait_until(lambda: ar.get("/api/v1/autorecovery/who_is_auditor")["auditor"], timeout_s=15,
                   message="an auditor")
        rcluster.by_id(victim).kill9()

        meta = LedgerStore(store)

        def repaired() -> bool:
            if store.list(layout.UNDERREPLICATED_LEDGERS):
                return False
            return all(victim not in meta.read(lid)[0].all_bookies() for lid in victim_ledgers)

        wait_until(repaired, timeout_s=120, interval_s=0.2, message=f"the ledgers of {victim} re-replicated")
        # The counter moves after the mark is cleared (the mark goes from a worker thread).
        wait_until(lambda: ar.metric("zbk_replicator_ledgers_replicated_total") == len(victim_ledgers),
                   timeout_s=10, message="the replicator to count the ledgers")
        resolver = BookieResolver(store)
        with zbk.BookKeeper(rcluster.uri, config=FAST) as bk:
            for lid in sorted(ledgers):
                md, _ = meta.read(lid)
                assert victim not in md.all_bookies() and md.last_entry_id == ENTRIES - 1
                assert_fully_replicated(resolver, md)
                rh = bk.open_ledger(lid, password=PW)
                assert [e.payload for e in rh.read(0, ENTRIES - 1)] == [data(lid, i) for i in range(ENTRIES)]
        assert ar.stop() == 0
    finally:
        store.close()
