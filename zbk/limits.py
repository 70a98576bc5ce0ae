"""Every bound in zbk, in one place, units last (TigerBeetle style).

Configuration may lower or raise some of these per process (the config keys of API.md);
these are the defaults and the hard ceilings that validation enforces. Each value says why
it is what it is. tests/test_limits.py keeps it so: no module of zbk defines a bound of its
own, and no name here is defined twice.
"""

from __future__ import annotations

# --- wire -------------------------------------------------------------------------------
PROTOCOL_VERSION = 1  # the one version this zbk speaks; another answers EBADVERSION (docs/protocol.md)
frame_bytes_max_default = 16 * 1024 * 1024  # max_frame_bytes default: a full add request of large entries
# What validation lets max_frame_bytes reach: a frame is held whole in memory.
frame_bytes_max_ceiling = 256 * 1024 * 1024
entry_bytes_max = 8 * 1024 * 1024  # one entry's payload: with its header and digest it fits a default frame
entries_per_add_request_max = 4096  # a batched ADD_ENTRY request: bounds what one request makes the bookie do and hold
entries_per_read_request_max = 4096  # a ranged READ_ENTRY request, as many as an add request carries
ledgers_per_multi_add_max = 1024  # parts (ledgers) of one MULTI_ADD request; its entries count as one add request's
read_response_bytes_max = 8 * 1024 * 1024  # a ranged read stops adding entries past this: half a default frame
header_bytes_max = 64 * 1024  # the CBOR header frame of any request: ids and flags only, payloads travel apart
long_poll_timeout_ms_max = 60_000  # a long poll parks a request on the bookie; a minute bounds what one client holds
# ZeroMQ send/receive high-water marks, every client socket: beyond, sends wait (backpressure).
socket_hwm_messages = 10_000
# The bookie's ROUTER, per peer (zbk/actors/loops.py). Replies beyond the libzmq pipe wait in
# a backlog bounded in bytes; beyond that they are dropped and the peer is stalled.
server_peer_send_hwm_messages = 100  # replies in libzmq's pipe to one peer
server_peer_backlog_bytes_max = 16 * 1024 * 1024  # then replies wait here (bursts), up to this
server_backlog_bytes_max = 256 * 1024 * 1024  # the backlogs of all peers together
# Unbounded (0): libzmq reads every peer's TCP socket at once, and the Server sheds load itself
# (server_pending_requests_max, server_pending_add_bytes_max: ETOOMANYREQUESTS). With a bound,
# libzmq 4.3.5 stops reading a peer whose pipe is full, and aborts the whole process if that
# connection then closes with a heartbeat PING among its unread bytes (stream_engine_base.cpp:310,
# tests/reliability/test_heartbeat_flood.py); a bookie that stopped reading also stops answering
# its clients' PINGs, so they hang up on it.
server_peer_recv_hwm_messages = 0
server_peer_stall_s = 1.0  # a peer whose replies were dropped has its requests dropped for this long
server_pending_requests_max = 50_000  # accepted, unanswered requests (long polls too); beyond: ETOOMANYREQUESTS
server_pending_add_bytes_max = 256 * 1024 * 1024  # entry bytes of unacknowledged adds; beyond: ETOOMANYREQUESTS
# Adds held (not refused) while the index's dirty pages are over their hard bound (twice
# ledger_cache_bytes_max) until a checkpoint brings them back under it; beyond: ETOOMANYREQUESTS.
server_held_adds_max = 1024  # requests
server_held_add_bytes_max = 64 * 1024 * 1024  # entry bytes of the held requests
server_held_index_entries_max = 4096  # index updates the Server holds before sending them (server.py)
# The newest entries of long-polled ledgers, which the Server answers long polls from
# (zbk/actors/tailcache.py): per ledger, more than a fast writer's two batches in flight; in
# all, a bound on the memory; kept this long after a ledger's last poll ends.
server_tail_entries_max = 1024
server_tail_bytes_max = 32 * 1024 * 1024
server_tail_idle_s = 10.0
server_admin_answer_wait_s = 5.0  # an admin HTTP handler waits this long for the Server's answer (bookie/admin.py)
# Master keys are 32 bytes and most bookies see a handful of passwords: the Server keeps one
# shared copy of each (not one per ledger), up to this many, 2 MiB of keys at most.
server_shared_keys_max = 65_536
# The Server probes disk usage at least every disk_check_interval, and sooner once this many
# bytes arrived: statvfs costs microseconds, so a probe per 64 KiB of adds is free, and with
# it a disk that fills fast turns the bookie read-only before it is full.
disk_probe_bytes_min = 64 * 1024
# Compiled struct formats of MULTI_ADD part tables kept (zbk/wire/encoders.py): at most 16 x
# 128 KiB (1,024 parts each); requests of the same shape reuse one.
wire_parts_structs_cached_max = 16

# A ledger holds at most 2**32 entries. Index files are sparse fixed-size slots by entry id,
# so an unbounded id from a damaged or hostile request would mean a multi-terabyte file.
entry_id_max = 2**32 - 1
# Ledger ids are signed 64-bit integers, as in BookKeeper (a Java long): the largest one the
# id allocator gives out and the largest a request or a metadata key may name.
ledger_id_max = 2**63 - 1

# --- journal ----------------------------------------------------------------------------
journal_record_bytes_max = entry_bytes_max + 4096  # one entry plus its record header and digest
journal_segment_bytes_default = 128 * 1024 * 1024  # a segment is retired (reused) whole: small enough to retire often
journal_preallocate_bytes_default = 1024 * 1024  # zeros kept ahead of the records (journal.py)
# Retired segments kept for reuse (journal.py, "Recycling"): this many bytes' worth, at least
# 2 and at most 16 files.
journal_reuse_bytes = 1024 * 1024 * 1024
journal_reuse_files_min, journal_reuse_files_max = 2, 16


def journal_reuse_files(segment_bytes_max: int) -> int:
    """How many retired journal segments a bookie keeps for reuse."""
    return max(journal_reuse_files_min, min(journal_reuse_files_max, journal_reuse_bytes // segment_bytes_max))

# Journal directories of one bookie (journal_dirs): one JournalWriter thread each, and the
# journal metrics' label values; more journals than disks only add threads.
journal_dirs_max = 16

# BookKeeper's journalMaxGroupWaitMSec: an add waits at most this long for its group's fsync.
journal_group_wait_ms_default = 2
journal_group_bytes_default = 512 * 1024  # BookKeeper's journalBufferedWritesThreshold: a full group syncs at once
# Journal replay at boot applies the index updates of replayed adds together, this many at a
# time: one index write per page instead of one per entry, in bounded memory.
replay_index_puts_max = 4096

# --- bookie process -----------------------------------------------------------------------
# An actor starts (binds its sockets) in milliseconds and stops within one poll of its loop
# after its last message: 10 s for either means it is stuck, and the bookie says where.
actor_start_timeout_s = 10.0
actor_stop_timeout_s = 10.0
process_stop_poll_s = 0.5  # a process's main thread looks for a stop (signal, crash) this often

# --- entry log / index ------------------------------------------------------------------
entry_log_bytes_default = 1024 * 1024 * 1024  # BookKeeper's logSizeLimit: one log is compacted (rewritten) whole
entry_log_write_buffer_bytes_default = 64 * 1024  # BookKeeper's writeBufferSizeBytes: one write() per buffer
entry_log_flush_bytes_default = 1024 * 1024  # start writeback of each this many bytes (entrylog.py, docs/storage.md)
entry_log_keep_cached_bytes_default = 512 * 1024 * 1024  # written data left in the page cache (entrylog.py)
entry_log_direct_buffer_bytes_min = 1024 * 1024  # aligned memory of the entry logs' O_DIRECT writes
# Written data beyond the cached part is dropped from the page cache in steps of at least
# this much: one posix_fadvise per 4 MiB written, not one per flush.
entry_log_drop_step_bytes_min = 4 * 1024 * 1024
entry_logs_open_max = 64  # entry-log-per-ledger: cap on open logs (BP-32)
entry_log_expire_after_access_s = 300  # entry-log-per-ledger: rotate an idle log (BP-32)
# Read descriptors of entry logs kept open (LRU): reads spread over the recent logs, and 64
# stays far below the descriptors fds_reserved leaves for everything but index files.
entry_log_read_fds_max = 64
# A read of one record by location reads this much past it in one pread: the record header
# and a small entry come in one system call, a large one in two.
entry_log_read_guess_bytes = 4096
# Range reads (read_entries) coalesce records that lie close together in one log into one
# pread of at most entry_log_read_run_bytes_max. A location more than
# entry_log_read_run_gap_bytes_max past the previous one (a large entry, or records of other
# ledgers in between) starts a new run, so a run never drags much more than the records it
# serves through memory.
entry_log_read_run_bytes_max = 1 << 20
entry_log_read_run_gap_bytes_max = 16 << 10
# The EntryLogger serves a range read this much at a time and looks at its pipes between
# slices, so an add that arrives behind a large read (up to read_response_bytes_max) waits
# for one slice, not the whole read; an add is on the write path's critical path, a catch-up
# read is not.
entry_log_read_slice_bytes = 256 * 1024
ledger_cache_bytes_max_default = 64 * 1024 * 1024  # index pages held in memory
# Index file descriptors a bookie keeps open (LRU; BookKeeper's openFileLimit is 20,000): a
# checkpoint of 10,000 ledgers re-opened 9,000 files each time with 1,024 open. 16,000 fits
# beside fds_reserved under a limit of 20,000; the bookie takes fewer (and says so) when its
# descriptor limit is lower (zbk/bookie/boot.py, _index_files_open_max). Also the default of
# LedgerCache itself, which only the bookie builds outside tests.
index_files_open_max_default = 16_000
fds_reserved = 1024  # descriptors left for sockets, logs, journal, metadata store, HTTP
# Entry logs the offline consistency check holds open at once (least recently used closed first).
consistency_check_logs_open_max = 64
index_page_entries = 1024  # slots per index page
# A checkpoint writes this many index files before it fsyncs them (ledgercache.py, flush):
# the kernel writes back a group together, and the descriptors stay within the open ones.
index_flush_group_files_max = 512

# --- garbage collection -----------------------------------------------------------------
gc_tick_s = 0.1  # pacing granularity of compaction chunks: the token bucket refills ten times a second
# One chunk blocks the EntryLogger for this much scanning and copying at most (plus one
# record), so adds and reads wait a few milliseconds, not for a whole log.
gc_compaction_chunk_bytes_max = 1024 * 1024
# The over-replicated ledger scan reads the metadata of every local ledger: at most hourly,
# so a copy outlives its grace period (gc.overreplicated_ledger_wait_time_ms) by an hour at most.
gc_overreplicated_scan_interval_max_s = 3600.0

# --- metadata ---------------------------------------------------------------------------
# Keys per range request of a listing: a page of large metadata fits etcd_grpc_message_bytes_max.
metadata_list_page_keys = 1000
metadata_lease_ttl_s_default = 10  # as BookKeeper's zkTimeout: a dead process's registration and locks go within 10 s
metadata_retry_attempts_max = 20  # a read-modify-write retried this often has met a real conflict, not bad luck
watch_changelog_revisions_kept = 100_000  # embedded store: change log kept for watches
# Compare-and-set of one key (coordination.cas_retry): heavy contention (every writer of a
# cluster allocating ledger ids) needs more rounds than other retries. The losers back off
# with full jitter, from 1 ms doubling up to 50 ms, so that one of them wins the next round
# while a round still costs far less than a metadata write.
metadata_cas_attempts_max = 10 * metadata_retry_attempts_max
metadata_cas_backoff_s_min = 0.001
metadata_cas_backoff_s_max = 0.05
election_poll_interval_s = 1.0  # re-check the leader key even if a watch event was missed
lease_refresh_timeout_s_min = 1.0  # a keep-alive may always take this long, however late
# Ledger metadata (zbk/metadata/ledger.py). An ensemble is the bookies of one fragment:
# more than 64 would spread each entry thinner than any deployment wants. Passwords and
# custom metadata are small values stored in every copy of the ledger's metadata.
ledger_ensemble_size_max = 64
ledger_password_bytes_max = 1024
ledger_custom_metadata_bytes_max = 64 * 1024

# The embedded (SQLite) store.
sqlite_busy_timeout_s_default = 30.0  # a writer waits this long for the file's write lock (three default lease TTLs)
sqlite_stall_s_min = 0.5  # a writer that waited this long for the lock saw the store stalled
sqlite_poll_interval_s_default = 0.025  # watch latency vs. idle cost of the poller
sqlite_poll_batch_revisions = 1000  # changelog revisions read per poll query: bounded memory per poll
sqlite_trim_every_revisions = 64  # amortize changelog trimming over this many writes
sqlite_open_retry_pause_s = 0.02  # another process is creating the schema: look again this soon

# etcd.
etcd_deadline_s_default = 10.0  # a call keeps retrying across endpoints for this long: a leader election takes seconds
etcd_rpc_timeout_s_default = 5.0  # one RPC attempt: half the deadline, so a hung member leaves time for another
etcd_keepalive_attempt_s_min = 0.5  # one keep-alive attempt within a caller's budget takes at least this
# Pauses between retries (jittered down to half): short enough to catch a new leader within
# a fraction of a second, doubling so that a cluster that is down is not hammered.
etcd_retry_pause_s_min = 0.05
etcd_retry_pause_s_max = 1.0
etcd_watch_check_interval_s = 3.0  # liveness probe of the watch channel
etcd_watch_check_timeout_s = 2.0  # a probe slower than this fails the channel over (below the interval)
etcd_grpc_message_bytes_max = 64 * 1024 * 1024  # a full list page of large ledger metadata
# gRPC keep-alive pings find a dead peer behind a silent connection; etcd permits pings every
# >= 5 s while a stream is open.
etcd_grpc_keepalive_ms = 10_000
etcd_grpc_keepalive_timeout_ms = 5_000
# gRPC's own reconnect backoff: retries of ours are paced by etcd_retry_pause_*, so the
# channel reconnects at once and at most a second apart.
etcd_grpc_reconnect_backoff_ms_min = 100
etcd_grpc_reconnect_backoff_ms_max = 1000

# --- bookie registration ----------------------------------------------------------------
# After a kill -9 the previous process's registration lives until its lease expires: a new
# bookie waits for it up to two TTLs plus this slack, looking again this often.
registration_wait_slack_s = 5.0
registration_held_poll_s = 0.5
# A lost registration lease (metadata outage) is registered again, backing off from half a
# second to 10 s: soon after the store is back, without hammering a store that is down.
reregistration_backoff_s_min = 0.5
reregistration_backoff_s_max = 10.0
# A bookie id (bookie_id) is a metadata key's last part and is written into the ensembles of
# every ledger metadata naming the bookie, once per fragment: 128 characters is room for any
# host name with its port, and keeps a ledger of many fragments small.
bookie_id_chars_max = 128
# A client that cannot connect to a bookie reads its registration again (a bookie with a
# stable bookie_id may be back at another address), at most this often per bookie and only
# while requests wait for it: a dead bookie costs each client two key reads a second at most.
bookie_address_reread_interval_ms = 500

# --- client -----------------------------------------------------------------------------
client_add_timeout_ms_default = 10_000  # a bookie that has not acknowledged an add within this is treated as failed
client_read_timeout_ms_default = 10_000  # a bookie that has not answered a read within this is treated as failed
client_speculative_read_ms_default = 2_000  # BookKeeper's speculativeReadTimeout: ask a second replica after this
client_pending_adds_max = 100_000  # appends in flight per writer: bounds its memory, backpressure beyond
# Entries per add request the client sends (ClientConfig.add_request_entries_max). Below the
# protocol's 4,096 so that a writer with many appends in flight keeps several requests in
# flight per bookie: the bookie stores one while the client builds the next.
client_add_request_entries_default = 500
# Batches of one writer's new entries unconfirmed at once (ClientConfig.add_batches_in_flight_max):
# appends made while that many are out go together in the next batch, as a Kafka producer's
# max.in.flight.requests holds records back. An idle writer sends each append at once; a
# busy one sends fewer, larger requests, and every bookie wakes its actors once per batch
# instead of once per entry. 2: one batch is built and sent while the other is stored.
client_add_batches_in_flight_default = 2
# Bookies a tailing reader long-polls at once (ClientConfig.tail_long_polls): the first
# answer wins. Each bookie raises its LAC when the add carrying it reaches it, and the add
# needs only the ack quorum, so one polled bookie is at times the slowest of the ensemble;
# two cut the end-to-end tail (docs/performance.md) for twice the poll answers.
client_tail_long_polls_default = 2
client_ensemble_change_attempts_max = 10  # ensemble changes without progress before an add fails
# A bookie that stays silent this long (a partition, a paused process) counts as failed: its
# connection is closed and the writers on it change ensembles (ZMTP heartbeats, transport.py).
# A bookie's libzmq I/O thread answers heartbeats whatever its Python threads are doing, so
# only a stopped process or a cut network goes this long without answering. 0: no heartbeats.
client_heartbeat_timeout_ms_default = 2_000
client_heartbeat_timeout_ms_max = 600_000  # ZMQ_HEARTBEAT_TTL holds at most 6,553.5 s
client_master_keys_cached_max = 1024  # passwords whose master key (a SHA-256) a client keeps at hand
client_rotations_cached_max = 4096  # ensembles whose write sets an AddDispatcher keeps
# Recovery (fencing a ledger and closing it) reads each entry until its state is known; a
# read that stays unknown after 3 tries fails the recovery, retried after 0.2 s and 0.4 s.
client_recovery_read_attempts_max = 3
client_recovery_read_backoff_s_min = 0.2
client_recovery_read_backoff_s_max = 1.0
client_sync_read_entries_max = 1000  # entries one read of the blocking client's iterator asks for
# A range read asks for about this many bytes per request (at most 4,096 entries), with up to
# client_range_reads_in_flight requests ahead of the entries being handed out. A bookie answers
# a request in one piece, and one of 4 MiB keeps its threads busy for milliseconds at a
# stretch while adds wait behind it; several smaller ones in flight read as fast
# (docs/performance.md, "Reads beside writes").
client_range_read_bytes = 512 * 1024
client_range_reads_in_flight = 4
client_range_read_assumed_payload_bytes = 1024  # the entries' size until an answer tells it
client_range_read_entry_overhead_bytes = 64  # an entry's header, digest and frame beside its payload
# Explicit LAC (BookKeeper's explicitLacInterval): 0, BookKeeper's default, leaves it off, and
# a tailing reader then sees a writer's last entry only at its next add or its close. The
# client looks at its writers every half interval; below 10 ms that would be a busy timer.
client_explicit_lac_interval_ms_default = 0
client_explicit_lac_interval_ms_min = 10
# Placement (zbk/client/placement.py). BookKeeper's minNumRacksPerWriteQuorum defaults to 2
# racks per write set, not enforced: a cluster without racks still creates ledgers.
client_min_racks_per_write_quorum_default = 2
# Assignments the placement search tries before it gives up on one target (racks and zones
# per write set) and tries the next weaker one: an ensemble of 64 bookies over a few racks
# is placed in a few hundred; the bound keeps an unsatisfiable target from searching for long.
placement_search_steps_max = 20_000

# Latency histogram buckets (bookie and client), 100 us to 10 s: an fsync-bound add on SSD is
# ~0.2-5 ms. Here, not in zbk.metrics.bookie, so that a client process does not create (and
# export) the bookie's metrics just to share the buckets.
LATENCY_BUCKETS = (0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1,
                   0.25, 0.5, 1.0, 2.5, 5.0, 10.0)

# --- auto-recovery ----------------------------------------------------------------------
# The leading auditor re-lists bookies this often even without a watch event: a missed event
# must not stall audits.
auditor_leader_poll_interval_s = 1.0
auditor_campaign_timeout_s = 1.0  # how often a waiting candidate checks whether it should stop
# After a failure (metadata unreachable) the auditor resigns and campaigns again, backing off
# from 1 s to 10 s: it returns soon after a blip, and does not spin through an outage.
auditor_error_backoff_s_min = 1.0
auditor_error_backoff_s_max = 10.0
checker_ledgers_in_flight_max = 8  # ledgers the periodic check reads concurrently: a background load
replicator_idle_poll_interval_s = 0.5  # how often an idle worker looks for marks
# A ledger whose repair failed is retried after 0.5 s, doubling up to 30 s, with jitter so
# that the workers of several processes do not retry in step.
replicator_backoff_s_min = 0.5
replicator_backoff_s_max = 30.0
replicator_backoff_jitter = 0.2  # a retry comes up to 20% early
copy_batch_entries_max = 256  # entries read concurrently, then sent in one RECOVERY_ADD
copy_batch_bytes_max = frame_bytes_max_default // 2  # a RECOVERY_ADD stays within a default frame, headers and all
decommission_lock_wait_s_max = 120.0  # how long to wait for a ledger a replicator is working on
decommission_lock_poll_s = 0.5  # ... asking for its lock this often
auditor_stop_timeout_s = 30.0  # the periodic check sees the stop between ledgers; one ledger's check ends within this
autorecovery_stop_timeout_s = 30.0  # the replicator finishes its current copy within this at stop

# --- HTTP (metrics and admin API) -------------------------------------------------------
http_body_bytes_max = 1 << 20  # admin request bodies are small JSON objects
http_request_timeout_s_default = 10.0  # a client that stalls mid-request is cut off: it cannot hold a thread
# Connections served at once. Beyond it a connection gets 503 at once instead of a thread
# of its own: a scrape and a few admin calls need a handful, and a flood of connections
# must not grow threads (each with its stack) without end.
http_threads_max = 16
# A connection beyond them waits this long for a thread to come free before its 503: a
# thread is free only after its client has the answer, and that client's next request must
# not lose the race. 50 ms per refused connection keeps the accepting thread quick.
http_slot_wait_s = 0.05
# A refused connection holds the accept loop (which answers it) at most this long, reading its
# request and sending the 503: a local client sends its request within milliseconds.
http_refusal_s_max = 0.25
# GET /api/v1/ledger/list: ledgers a page (`page=N`); without `page`, the most one answer
# lists (ids only, a few MB of JSON) before it asks for pages instead. With metadata, one page.
http_ledger_list_page_ledgers = 1000
http_ledger_list_ledgers_max = 100_000
# GET /api/v1/ledger/read: entries one answer carries (BookKeeper's page of entries).
http_read_entries_max = 1000

# --- sandbox (zbk sandbox) --------------------------------------------------------------
sandbox_base_port_default = 3181  # BookKeeper's bookie port: the first bookie of a sandbox listens there
sandbox_tick_s = 0.2  # how quickly a dead child or a signal is noticed
sandbox_status_interval_s = 2.0  # metadata is read this often
sandbox_ready_poll_s = 0.5  # ... and this often until the cluster is ready
sandbox_stop_timeout_s = 30.0  # a bookie's clean stop joins its actors (10 s each at worst); per stop phase
sandbox_plain_status_interval_s = 10.0  # a non-terminal gets an unchanged status line this often
# A child that exits is restarted after 1 s, 2 s, 4 s... (at most 30 s), at most 5 times in a
# row: a crash loop stops within a minute. A child up for a minute is well again.
sandbox_restarts_max = 5
sandbox_restart_backoff_s_min = 1.0
sandbox_restart_backoff_s_max = 30.0
sandbox_stable_after_s = 60.0

# --- process, transport -----------------------------------------------------------------
curve_denial_log_interval_s = 60.0  # a client refused by CURVE is logged once a minute, not per request

# --- Spark connector ----------------------------------------------------------------------
spark_commit_attempts_max = 20  # as metadata_retry_attempts_max: commits of one job race on one key
spark_entries_per_partition_default = 10_000  # a read partition: a task's worth, not a ledger's
spark_batch_rows_max = 4096  # rows per Arrow batch of a read
spark_appends_in_flight_max = 10_000  # appends a writer task has outstanding: bounds its memory
# A settled write job's mark outlives every task attempt of the job (Spark kills a cancelled
# task's Python worker seconds after cancelling it), then expires with its lease.
spark_settled_mark_ttl_s = 3600
