"""Messages between the actors of one bookie (never on the network).

They are handed over, not copied (zbk/actors/base.py): once sent, a message and the lists
inside it are never changed by anyone. The add path shares ``entry_ids`` and ``blobs``
lists along AppendBatch -> JournalAppend / Appended -> IndexPut and the Server's PendingAdd.

Who sends what to whom, and why the order is safe:

    Server --AppendBatch--> EntryLogger --JournalAppend--> JournalWriter --Synced--> Server
                                        --Appended--> Server --IndexPut--> IndexSyncer
    Server --JournalMeta--> JournalWriter (fence, master key, limbo, explicit LAC records)
    Server --HeaderUpdate / IndexPut / Lookup / Checkpoint--> IndexSyncer
    IndexSyncer --ReadLocations--> EntryLogger --ReadResult--> Server
    IndexSyncer --StartCheckpoint--> EntryLogger --MarkRequest--> JournalWriter --Mark--> EntryLogger
    EntryLogger (flushes logs) --CheckpointReady--> Server --Checkpoint--> IndexSyncer
    IndexSyncer (flushes index, persists lastMark) --TrimJournal--> JournalWriter
    GarbageCollector: see zbk/actors/gc.py ("Messages") for its flow and ordering argument.

Several journals (``journal_dirs``, zbk/actors/journals.py): every record of a ledger goes
to the journal of its ledger id. A batch whose ledgers belong to k journals becomes one
JournalAppend (and one JournalMeta for its new ledgers' keys) per journal, each with the
batch id, and the add waits for every one of their Synced. A checkpoint sends MarkRequest
to every journal and waits for all their Marks; lastMark is one mark per journal, and each
journal is trimmed at its own mark. The arguments below hold per journal: each speaks of
the records of one journal and the mark that journal returned.

1. Acknowledged implies readable: the Server replies to an add only after it has both the
   entry's location (Appended, from which it makes the IndexPut) and the journal's Synced.
   Every later read is a Lookup on the same Server->IndexSyncer pipe, behind the IndexPut:
   the Server may hold IndexPuts for a while (ServerCore._hold_put), but it sends every one
   it holds before any other message to the IndexSyncer, so the pipe's order is the order
   in which they were made. At a clean stop, what the IndexSyncer did not read is applied
   before the last mark is written (Bookie.stop).
2. Checkpoint safety: the mark M a journal returns follows every record it had received.
   Each ADD record was sent by the EntryLogger after the entry was appended, in the same
   step that sends the entry's Appended to the Server (the record goes first, so that the
   fsync starts sooner). CheckpointReady(M) is sent in a later step (handling Mark(M),
   which the journal can only compute after receiving the record; with several journals,
   once the EntryLogger holds every journal's Mark), on that same EntryLogger->Server
   pipe, after the logs were fsynced; so the Server has already
   forwarded every IndexPut of records before M when it forwards Checkpoint(M). Meta
   records (fence, master key...) are sent by the Server to the IndexSyncer (HeaderUpdate)
   before their journal record, hence before M was computed, hence before Checkpoint(M) on
   the same pipe. So when the IndexSyncer persists lastMark = M, everything before M is in
   fsynced logs and index.
3. MULTI_ADD travels as one unit: the accepted parts of one request are one AppendBatch
   (its ``ledger_ids`` name several ledgers), hence one Appended, one JournalAppend per
   journal and one IndexPut, on the same pipes and in the same steps as a one-ledger batch.
   Arguments 1 and 2 hold per entry exactly as before; the master-key records of the
   request's new ledgers are one JournalMeta per journal, sent (after their HeaderUpdates)
   before the AppendBatch.
"""

from __future__ import annotations

from collections.abc import Sequence
from concurrent.futures import Future
from dataclasses import dataclass

from zbk.wire.messages import Blob


@dataclass(slots=True)
class AppendBatch:
    """A batch of adds: entry ``i`` is ``entry_ids[i]`` of ledger ``ledger_ids[i]``, with
    ``blobs[i]``. An ADD_ENTRY names its one ledger once per entry; a MULTI_ADD names each
    part's (argument 3 above). The three lists have one length."""

    batch_id: int
    ledger_ids: list[int]
    entry_ids: list[int]
    blobs: list[Blob]  # views into the request's frames: copied once, into the entry log's records
    journal: bool  # False with journal_write_data = false (BP-46)


@dataclass(slots=True)
class Appended:
    batch_id: int
    ledger_ids: list[int]  # as in the AppendBatch
    entry_ids: list[int]
    locations: list[int]
    error: str = ""  # non-empty: the append failed (disk full, I/O error)
    no_space: bool = False


@dataclass(slots=True)
class JournalAppend:
    """An add batch's entries for one journal: their records as the entry log holds them
    (zbk/storage/entrylogformat.py), which the journal writes as they are."""

    batch_id: int
    records: Blob
    count: int  # records in ``records``


@dataclass(slots=True)
class JournalMeta:
    """Fence / master key / limbo / explicit LAC records; acknowledged with Synced."""

    batch_id: int
    records: list[tuple[int, int, int, bytes]]  # (record type, ledger id, entry id or value, payload)


@dataclass(slots=True)
class ForceJournal:
    """FORCE_LEDGER: acknowledge once everything received so far is fsynced. Sent by the
    Server through the EntryLogger, so it reaches the ledger's journal behind the records of
    every earlier add of the ledger; with journal data off the EntryLogger fsyncs its logs
    first."""

    batch_id: int
    ledger_id: int
    flush_logs: bool = False


@dataclass(slots=True)
class Synced:
    batch_ids: list[int]
    error: str = ""


@dataclass(slots=True)
class IndexPut:
    ledger_ids: list[int]  # as in the AppendBatch (the Server may join several batches in one)
    entry_ids: list[int]
    locations: list[int]


@dataclass(slots=True)
class HeaderUpdate:
    ledger_id: int
    master_key: bytes | None = None
    fenced: bool | None = None
    limbo: bool | None = None
    explicit_lac: int | None = None


@dataclass(slots=True)
class Lookup:
    """Read entries [first, first+count) of a ledger; answered by the EntryLogger."""

    ctx: int
    ledger_id: int
    first_entry_id: int
    count: int
    bytes_max: int
    sparse: bool = False  # every held entry of the range, not only the contiguous prefix
    stripe: tuple[int, int] | None = None  # sparse only: the ids with id % stripe[0] == stripe[1]


@dataclass(slots=True)
class ReadLocations:
    ctx: int
    ledger_id: int
    first_entry_id: int
    locations: list[int]
    ledger_known: bool
    bytes_max: int
    error: str = ""  # the index is damaged after ``locations``: answer EIO there
    entry_ids: list[int] | None = None  # sparse reads: each location's entry; None: first_entry_id + i

    def ids(self) -> Sequence[int]:
        """The entry id of each location."""
        if self.entry_ids is not None:
            return self.entry_ids
        return range(self.first_entry_id, self.first_entry_id + len(self.locations))


@dataclass(slots=True)
class ReadResult:
    ctx: int
    ledger_id: int
    blobs: list[bytes | memoryview]  # views into the EntryLogger's read buffers: not copied until ZeroMQ sends them
    ledger_known: bool
    error: str = ""


@dataclass(slots=True)
class ListEntries:
    ctx: int
    ledger_id: int


@dataclass(slots=True)
class EntryList:
    ctx: int
    ledger_id: int
    ranges: list[tuple[int, int]]
    ledger_known: bool
    error: str = ""  # the ledger's index is damaged: the list is unknown (EIO)


@dataclass(slots=True)
class DeleteLedgers:
    ledger_ids: list[int]


@dataclass(slots=True)
class WriteClose:
    ledger_id: int


@dataclass(slots=True)
class StartCheckpoint:
    cp_id: int


@dataclass(slots=True)
class MarkRequest:
    cp_id: int


@dataclass(slots=True)
class Mark:
    cp_id: int
    mark: tuple[int, int]
    journal: int = 0  # the index of the journal whose mark this is


Marks = tuple[tuple[int, int], ...]  # one (segment id, offset) per journal, in journal order


@dataclass(slots=True)
class CheckpointReady:
    cp_id: int
    marks: Marks


@dataclass(slots=True)
class Checkpoint:
    cp_id: int
    marks: Marks


@dataclass(slots=True)
class TrimJournal:
    mark: tuple[int, int]  # the mark of the journal it is sent to


@dataclass(slots=True)
class CheckpointDone:
    cp_id: int
    marks: Marks
    index_bytes: int = 0



# -- garbage collection (zbk/actors/gc.py explains the flow and why each hop is ordered) ----

@dataclass(slots=True)
class GcTrigger:
    """Admin (POST /api/v1/bookie/gc) -> GC: run now; ``major`` / ``minor`` force that
    compaction regardless of its interval."""

    major: bool = False
    minor: bool = False


@dataclass(frozen=True, slots=True)
class GcStatus:
    """The GarbageCollector's state, as GET /api/v1/bookie/gc_details and the compaction
    suspension endpoints report it. Times are wall-clock milliseconds (0: never)."""

    forced: bool  # the run under way was asked for (POST /api/v1/bookie/gc), not scheduled
    major_compacting: bool
    minor_compacting: bool
    last_major_ms: int
    last_minor_ms: int
    major_count: int  # compaction passes of each kind since the bookie started
    minor_count: int
    major_suspended: bool
    minor_suspended: bool


@dataclass(slots=True)
class GcStatusRequest:
    """Admin (GET gc_details) -> GC: complete ``answer`` with a GcStatus."""

    answer: Future[GcStatus]


@dataclass(slots=True)
class GcSuspend:
    """Admin (PUT gc/suspend_compaction, gc/resume_compaction) -> GC: suspend (True) or resume
    (False) each kind of compaction, None leaving it as it is; ``answer``: the state after.
    A suspended kind does not start, forced or scheduled; a log being compacted is finished."""

    major: bool | None
    minor: bool | None
    answer: Future[GcStatus]


@dataclass(slots=True)
class LocalLedgersRequest:
    """GC -> Server -> IndexSyncer: which ledgers does the index hold? Routed through the
    Server so it is answered after every HeaderUpdate / IndexPut / DeleteLedgers sent before."""

    ctx: int


@dataclass(slots=True)
class LocalLedgers:
    """IndexSyncer -> GC."""

    ctx: int
    ledger_ids: list[int]


@dataclass(slots=True)
class LogStatsRequest:
    """GC -> EntryLogger."""

    ctx: int


@dataclass(slots=True)
class LogStats:
    """EntryLogger -> GC: per-log usage and which logs are still open or unsynced."""

    ctx: int
    usage: dict[int, dict[int, int]]  # {log id: {ledger id: record bytes}}
    unflushed: list[int]  # EntryLogWriter.unflushed_log_ids(): never deleted nor compacted
    least_unflushed: int  # EntryLogWriter.least_unflushed_log_id()


@dataclass(slots=True)
class DeleteLogs:
    """GC -> IndexSyncer -> EntryLogger: remove these sealed logs. Routed through the index so
    that every read location it handed out earlier is served before the log goes."""

    ctx: int
    log_ids: list[int]


@dataclass(slots=True)
class LogsDeleted:
    """EntryLogger -> GC: the logs actually removed (an unflushed or unknown log is skipped)."""

    ctx: int
    log_ids: list[int]


@dataclass(slots=True)
class CompactLog:
    """GC -> EntryLogger: start compacting a sealed log (chunks follow as CompactChunk)."""

    job: int
    log_id: int


@dataclass(slots=True)
class CompactChunk:
    """GC -> EntryLogger: scan about ``budget_bytes`` more of the job's log (the throttle)."""

    job: int
    budget_bytes: int


@dataclass(slots=True)
class LiveCheck:
    """EntryLogger -> Server -> IndexSyncer: which of these (ledger, entry, location) does the
    index still point at? Routed through the Server so it follows every IndexPut for them."""

    job: int
    entries: list[tuple[int, int, int]]


@dataclass(slots=True)
class LiveResult:
    """IndexSyncer -> EntryLogger: one flag per LiveCheck entry; ``error``: abort the job."""

    job: int
    live: list[bool]
    error: str = ""


@dataclass(slots=True)
class Relocate:
    """EntryLogger -> Server -> IndexSyncer: conditional index puts for copied entries, each
    (ledger, entry, old location, new location, record bytes), applied only where the index
    still points at the old location. Sent once per chunk; ``last`` ends the job (with
    ``error`` when it failed: the old log must then be kept)."""

    job: int
    moves: list[tuple[int, int, int, int, int]]
    scanned_bytes: int
    copied_bytes: int
    last: bool
    error: str = ""


@dataclass(slots=True)
class Relocated:
    """IndexSyncer -> GC: a Relocate was applied. ``rejected`` lists (new log id, ledger id,
    record bytes) of copies the index did not take: unreferenced garbage in that log."""

    job: int
    applied: int
    rejected: list[tuple[int, int, int]]
    scanned_bytes: int
    copied_bytes: int
    last: bool
    error: str = ""


@dataclass(slots=True)
class CompactionDurable:
    """IndexSyncer -> GC: an index flush that started after the job's last Relocate was
    applied has completed, so no durable index slot points into the compacted log."""

    job: int


@dataclass(slots=True)
class IndexPressure:
    """IndexSyncer -> Server: ``on`` when the ledger cache's dirty pages reach their hard
    bound (twice ``ledger_cache_bytes_max``: new ledgers arrive faster than a checkpoint
    writes their index files), off once a checkpoint brought them under the cache bound.
    While on, the Server holds new adds (and refuses them with ETOOMANYREQUESTS beyond a
    bound) instead of letting the index grow without limit; everything else goes on,
    including the checkpoint that ends the pressure."""

    on: bool


# -- admin: the HTTP handlers (zbk/bookie/admin.py) -> Server ----------------------------------
# Those handlers run on the HTTP server's threads: they never read the Server's state, they
# send it one of these on the admin pipe and, for a question, wait for its answer.

@dataclass(slots=True)
class SetReadOnly:
    """PUT /api/v1/bookie/state: the operator's read-only flag (kept apart from the disk
    checker's, so a disk back under its threshold does not undo it)."""

    read_only: bool


@dataclass(frozen=True, slots=True)
class BookieStatus:
    """The Server's view of the bookie, as GET /api/v1/bookie/info reports it."""

    read_only: bool
    ledgers: int
    limbo_ledgers: int
    disk_used_bytes: int
    disk_total_bytes: int


@dataclass(slots=True)
class StatusRequest:
    """GET /api/v1/bookie/info and /state: the Server completes ``answer`` with a
    BookieStatus (a Future is safe to complete on one thread and wait on from another)."""

    answer: Future[BookieStatus]
