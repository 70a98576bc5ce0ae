"""Every bound in zbk, in one place, units last (TigerBeetle style).

Configuration may lower or raise some of these per process (the config keys of API.md);
these are the defaults and the hard ceilings that validation enforces.
"""

from __future__ import annotations

# --- wire -------------------------------------------------------------------------------
PROTOCOL_VERSION = 1
frame_bytes_max_default = 16 * 1024 * 1024  # max_frame_bytes default: one ZeroMQ frame
frame_bytes_max_ceiling = 256 * 1024 * 1024
entry_bytes_max = 8 * 1024 * 1024  # one entry's payload
entries_per_add_request_max = 4096  # a batched ADD_ENTRY request
entries_per_read_request_max = 4096  # a ranged READ_ENTRY request
ledgers_per_multi_add_max = 1024  # parts (ledgers) of one MULTI_ADD request; its entries count as one add request's
read_response_bytes_max = 8 * 1024 * 1024  # a ranged read stops adding entries past this
header_bytes_max = 64 * 1024  # the CBOR header frame of any request
long_poll_timeout_ms_max = 60_000
socket_hwm_messages = 10_000  # ZeroMQ send/receive high-water marks, every client socket
# The bookie's ROUTER, per peer (zbk/actors/loops.py). Replies beyond the libzmq pipe wait in
# a backlog bounded in bytes; beyond that they are dropped and the peer is stalled.
server_peer_send_hwm_messages = 100  # replies in libzmq's pipe to one peer
server_peer_backlog_bytes_max = 16 * 1024 * 1024  # then replies wait here (bursts), up to this
server_backlog_bytes_max = 256 * 1024 * 1024  # the backlogs of all peers together
server_peer_recv_hwm_messages = 1_000  # then libzmq stops reading the peer's TCP (backpressure)
server_peer_stall_s = 1.0  # a peer whose replies were dropped has its requests dropped for this long
server_pending_requests_max = 50_000  # accepted, unanswered requests (long polls too); beyond: ETOOMANYREQUESTS
server_pending_add_bytes_max = 256 * 1024 * 1024  # entry bytes of unacknowledged adds; beyond: ETOOMANYREQUESTS
# Adds held (not refused) while the index's dirty pages are over their hard bound (twice
# ledger_cache_bytes_max) until a checkpoint brings them back under it; beyond: ETOOMANYREQUESTS.
server_held_adds_max = 1024  # requests
server_held_add_bytes_max = 64 * 1024 * 1024  # entry bytes of the held requests
server_held_index_entries_max = 4096  # index updates the Server holds before sending them (server.py)

# A ledger holds at most 2**32 entries. Index files are sparse fixed-size slots by entry id,
# so an unbounded id from a damaged or hostile request would mean a multi-terabyte file.
entry_id_max = 2**32 - 1

# --- journal ----------------------------------------------------------------------------
journal_record_bytes_max = entry_bytes_max + 4096
journal_segment_bytes_default = 128 * 1024 * 1024
journal_preallocate_bytes_default = 1024 * 1024  # zeros kept ahead of the records (journal.py)
# Retired segments kept for reuse (journal.py, "Recycling"): this many bytes' worth, at least
# 2 and at most 16 files.
journal_reuse_bytes = 1024 * 1024 * 1024
journal_reuse_files_min, journal_reuse_files_max = 2, 16


def journal_reuse_files(segment_bytes_max: int) -> int:
    """How many retired journal segments a bookie keeps for reuse."""
    return max(journal_reuse_files_min, min(journal_reuse_files_max, journal_reuse_bytes // segment_bytes_max))

journal_group_wait_ms_default = 2
journal_group_bytes_default = 512 * 1024

# --- entry log / index ------------------------------------------------------------------
entry_log_bytes_default = 1024 * 1024 * 1024
entry_log_write_buffer_bytes_default = 64 * 1024
entry_log_flush_bytes_default = 4 * 1024 * 1024  # start writeback of each this many bytes (entrylog.py)
entry_log_keep_cached_bytes_default = 512 * 1024 * 1024  # written data left in the page cache (entrylog.py)
entry_logs_open_max = 64  # entry-log-per-ledger: cap on open logs (BP-32)
entry_log_expire_after_access_s = 300  # entry-log-per-ledger: rotate an idle log (BP-32)
ledger_cache_bytes_max_default = 64 * 1024 * 1024  # index pages held in memory
# Index file descriptors a bookie keeps open (LRU; BookKeeper's openFileLimit is 20,000): a
# checkpoint of 10,000 ledgers re-opened 9,000 files each time with 1,024 (issue #8). 16,000
# fits beside fds_reserved under a limit of 20,000; the bookie takes fewer (and says so)
# when its descriptor limit is lower (zbk/bookie/boot.py, _index_files_open_max).
index_files_open_max_default = 16_000
fds_reserved = 1024  # descriptors left for sockets, logs, journal, metadata store, HTTP
index_page_entries = 1024  # slots per index page

# --- metadata ---------------------------------------------------------------------------
metadata_list_page_keys = 1000
metadata_lease_ttl_s_default = 10
metadata_retry_attempts_max = 20
watch_changelog_revisions_kept = 100_000  # embedded store: change log kept for watches

# --- client -----------------------------------------------------------------------------
client_add_timeout_ms_default = 10_000
client_read_timeout_ms_default = 10_000
client_speculative_read_ms_default = 2_000
client_pending_adds_max = 100_000
# Entries per add request the client sends (ClientConfig.add_request_entries_max). Below the
# protocol's 4,096 so that a writer with many appends in flight keeps several requests in
# flight per bookie: the bookie stores one while the client builds the next (issue #8).
client_add_request_entries_default = 500
client_ensemble_change_attempts_max = 10
# A bookie that stays silent this long (a partition, a paused process) counts as failed: its
# connection is closed and the writers on it change ensembles (ZMTP heartbeats, transport.py).
# A bookie's libzmq I/O thread answers heartbeats whatever its Python threads are doing, so
# only a stopped process or a cut network goes this long without answering. 0: no heartbeats.
client_heartbeat_timeout_ms_default = 2_000
client_heartbeat_timeout_ms_max = 600_000  # ZMQ_HEARTBEAT_TTL holds at most 6,553.5 s

# Latency histogram buckets (bookie and client), 100 us to 10 s: an fsync-bound add on SSD is
# ~0.2-5 ms. Here, not in zbk.metrics.bookie, so that a client process does not create (and
# export) the bookie's metrics just to share the buckets.
LATENCY_BUCKETS = (0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1,
                   0.25, 0.5, 1.0, 2.5, 5.0, 10.0)
