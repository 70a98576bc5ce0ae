import dataclasses
import re

import pytest

from zbk.config import (
    AutoRecoveryConfig,
    BookieConfig,
    ClientConfig,
    CurveConfig,
    DiskConfig,
    EntryLogConfig,
    GcConfig,
    HttpConfig,
    IndexConfig,
    JournalConfig,
    RecoveryConfig,
    build,
    load,
    parse_overrides,
    with_settings,
)
from zbk.errors import ConfigError


def _base(**kw):
    values = {"data_dir": "/tmp/zbk-x", "metadata_uri": "sqlite:///tmp/zbk-x/meta.db"}
    values.update(kw)
    return build(BookieConfig, values)


def test_defaults_resolve_directories_and_id():
    cfg = _base(port=3190).validate()
    assert cfg.bookie_id == "127.0.0.1:3190"
    assert cfg.journal_dirs == ("/tmp/zbk-x/journal",)
    assert cfg.ledger_dirs == ("/tmp/zbk-x/ledgers",)
    assert cfg.index_dirs == ("/tmp/zbk-x/index",)
    assert cfg.journal.write_data is True


def test_toml_then_set_then_explicit(tmp_path):
    f = tmp_path / "bookie.toml"
    f.write_text('port = 4000\njournal_write_data = false\nledger_dirs = ["/a", "/b"]\n'
                 'data_dir = "/d"\nmetadata_uri = "sqlite:///m.db"\n')
    cfg = load(BookieConfig, path=str(f), overrides=["port=4001", "flush_interval_ms=500"],
               explicit={"port": 4002, "http_port": None})
    assert cfg.port == 4002
    assert cfg.index.flush_interval_ms == 500
    assert cfg.journal.write_data is False
    assert cfg.validate().ledger_dirs == ("/a", "/b")
    assert cfg.http.port == 8000  # None explicit values do not override


def test_bookie_table_is_accepted(tmp_path):
    f = tmp_path / "bookie.toml"
    f.write_text('[bookie]\nport = 4100\n')
    assert load(BookieConfig, path=str(f)).port == 4100


def test_unknown_key_is_rejected_with_suggestion():
    with pytest.raises(ConfigError, match="did you mean journal_write_data"):
        load(BookieConfig, overrides=["jornal_write_data=false"])


@pytest.mark.parametrize("item", ["port=notanumber", "journal_write_data=maybe", "ledger_dirs=5"])
def test_wrong_types_are_rejected(item):
    with pytest.raises(ConfigError):
        load(BookieConfig, overrides=[item])


@pytest.mark.parametrize("kw", [
    {"port": 70000}, {"disk_usage_threshold": 1.5}, {"disk_usage_warn_threshold": 0.99},
    {"minor_compaction_threshold": 0.9}, {"max_frame_bytes": 10}, {"registration_ttl_s": 0},
    {"curve_secret_key_file": "/k"}, {"metadata_uri": ""},
])
def test_validate_rejects_out_of_range(kw):
    with pytest.raises(ConfigError):
        _base(**kw).validate()


def test_missing_dirs_rejected():
    with pytest.raises(ConfigError, match="data_dir"):
        build(BookieConfig, {"metadata_uri": "sqlite:///m.db"}).validate()


def test_missing_and_bad_toml(tmp_path):
    with pytest.raises(ConfigError, match="not found"):
        load(BookieConfig, path=str(tmp_path / "nope.toml"))
    bad = tmp_path / "bad.toml"
    bad.write_text("port = = 3\n")
    with pytest.raises(ConfigError, match="not valid TOML"):
        load(BookieConfig, path=str(bad))


def test_parse_overrides():
    assert parse_overrides(["a=1", "b=true", "c=hello", "d=1.5", 'e="x=y"']) == {
        "a": 1, "b": True, "c": "hello", "d": 1.5, "e": "x=y"}
    with pytest.raises(ConfigError):
        parse_overrides(["novalue"])
    with pytest.raises(ConfigError):
        parse_overrides(["=3"])


def test_other_components_validate():
    assert ClientConfig().validate().add_timeout_ms > 0
    with pytest.raises(ConfigError):
        ClientConfig(add_timeout_ms=0).validate()
    with pytest.raises(ConfigError):
        AutoRecoveryConfig().validate()
    assert AutoRecoveryConfig(metadata_uri="sqlite:///m.db").validate().http_port == 8100


def test_placement_keys():
    """A bookie's rack, zone and isolation group; a client's placement policy (defaults as
    BookKeeper's: 2 racks per write set, not enforced, no isolation)."""
    cfg = load(BookieConfig, overrides=["data_dir=/tmp/zbk-x", "metadata_uri=sqlite:///m.db", "rack=r1", "zone=z1",
                                        "isolation_group=gold"]).validate()
    assert (cfg.rack, cfg.zone, cfg.isolation_group) == ("r1", "z1", "gold")
    with pytest.raises(ConfigError, match="isolation_group is one group"):
        _base(isolation_group="gold,silver").validate()
    client = ClientConfig().validate()
    assert (client.min_racks_per_write_quorum, client.enforce_min_racks_per_write_quorum,
            client.isolation_groups) == (2, False, ())
    assert with_settings(client, {"isolation_groups": ["gold", "silver"]}, source="t").isolation_groups == (
        "gold", "silver")
    for bad in (dict(min_racks_per_write_quorum=0), dict(min_racks_per_write_quorum=65),
                dict(isolation_groups=("",)), dict(isolation_groups=("a,b",))):
        with pytest.raises(ConfigError):
            ClientConfig(**bad).validate()


@pytest.mark.parametrize("text, cpus", [("", set()), ("0", {0}), ("0-1", {0, 1}), (" 0 , 0-0 ", {0})])
def test_actor_cpus_takes_a_cpu_list(text, cpus):
    assert _base(actor_cpus=text).validate().actor_cpu_set() == cpus


@pytest.mark.parametrize("text, message", [
    ("x", "not a CPU list"), ("1-", "not a CPU list"), ("3-1", "runs backwards"), ("-1", "not a CPU list"),
    ("4096", "not available to this process"), ("0-99999999999", "not a CPU list"), ("0-8192", "go up to 8191"),
    ("\u00b2", "not a CPU list"), ("1 2", "not a CPU list"),
])
def test_actor_cpus_rejects_bad_lists_and_cpus_out_of_reach(text, message):
    with pytest.raises(ConfigError, match=message):
        _base(actor_cpus=text).validate()


def test_actor_cpus_takes_one_cpu_as_a_number(tmp_path):
    f = tmp_path / "bookie.toml"
    f.write_text("actor_cpus = 0\n")
    assert load(BookieConfig, path=str(f)).actor_cpus == "0"
    assert load(BookieConfig, overrides=["actor_cpus=0"]).actor_cpus == "0"
    assert load(BookieConfig, overrides=["actor_cpus=0-1"]).actor_cpus == "0-1"
    with pytest.raises(ConfigError):
        load(BookieConfig, overrides=["actor_cpus=true"])


# --- sections: tables, dotted keys and the flat names of API.md ---------------------------

# API.md "Bookie configuration": every one of its keys that BookieConfig has.
API_FLAT_KEYS = [
    "bookie_id", "port", "http_port", "metadata_uri", "data_dir", "journal_dirs", "ledger_dirs", "index_dirs",
    "journal_write_data", "journal_sync_data", "journal_max_group_wait_ms", "journal_buffered_writes_threshold_bytes",
    "journal_max_size_mb", "entry_log_size_limit_mb", "entry_log_write_buffer_bytes", "entry_log_per_ledger",
    "flush_interval_ms", "gc_wait_time_ms", "minor_compaction_threshold", "minor_compaction_interval_s",
    "major_compaction_threshold", "major_compaction_interval_s", "compaction_rate_bytes", "disk_usage_threshold",
    "disk_usage_warn_threshold", "disk_check_interval_ms", "read_only_mode_enabled", "auto_fix_cookie",
    "registration_ttl_s", "autorecovery_enabled", "lost_bookie_recovery_delay_s",
    "open_ledger_rereplication_grace_period_s", "auditor_periodic_check_interval_s", "max_frame_bytes", "rack",
    "advertised_address",
    "curve_secret_key_file", "curve_authorized_keys_dir",
]
SECTIONS = [JournalConfig, EntryLogConfig, IndexConfig, GcConfig, DiskConfig, RecoveryConfig, CurveConfig, HttpConfig]


def _get(cfg, canonical):
    for part in canonical.split("."):
        cfg = getattr(cfg, part)
    return cfg


def _other_value(value):
    """A value of ``value``'s type that is not ``value``."""
    if isinstance(value, bool):
        return not value
    if isinstance(value, (int, float)):
        return value + 1
    if isinstance(value, tuple):
        return ("/elsewhere",)
    return "other"


def _flat_to_canonical():
    names = {}
    for f in dataclasses.fields(BookieConfig):
        section = f.default_factory() if f.default_factory is not dataclasses.MISSING else None
        if section is None:
            names[f.name] = f.name
        else:
            for sub, flat in type(section).FLAT.items():
                names[flat] = f"{f.name}.{sub}"
    return names


def test_every_section_is_a_table_of_its_own_name_and_every_key_has_one_flat_name():
    fields = {f.name: f for f in dataclasses.fields(BookieConfig)}
    for section in SECTIONS:
        assert section.TABLE in fields, section
        assert set(section.FLAT) == {f.name for f in dataclasses.fields(section)}, section
    flat = _flat_to_canonical()
    assert len(flat) == len(dataclasses.fields(BookieConfig)) - len(SECTIONS) + sum(
        len(s.FLAT) for s in SECTIONS), "two keys share a flat name"


@pytest.mark.parametrize("flat", API_FLAT_KEYS)
def test_every_api_flat_name_sets_its_sectioned_key(flat):
    canonical = _flat_to_canonical()[flat]
    value = _other_value(_get(BookieConfig(), canonical))
    assert _get(build(BookieConfig, {flat: value}), canonical) == value
    assert _get(load(BookieConfig, overrides=[f"{canonical}={_toml(value)}"]), canonical) == value
    assert _get(load(BookieConfig, overrides=[f"{flat}={_toml(value)}"]), canonical) == value


def _toml(value):
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, str):
        return f'"{value}"'
    if isinstance(value, tuple):
        return "[" + ", ".join(f'"{v}"' for v in value) + "]"
    return str(value)


def test_toml_tables_and_flat_keys(tmp_path):
    f = tmp_path / "bookie.toml"
    f.write_text('port = 4000\ngc_wait_time_ms = 5000\n\n[journal]\nsync_data = false\nmax_group_wait_ms = 1.5\n\n'
                 '[entry_log]\nper_ledger = true\n\n[http]\nport = 9000\n\n[autorecovery]\nenabled = true\n'
                 'replicator_workers = 3\n')
    cfg = load(BookieConfig, path=str(f))
    assert (cfg.port, cfg.http.port) == (4000, 9000)
    assert cfg.journal == JournalConfig(sync_data=False, max_group_wait_ms=1.5)
    assert cfg.entry_log.per_ledger is True
    assert cfg.gc.wait_time_ms == 5000
    assert (cfg.autorecovery.enabled, cfg.autorecovery.replicator_workers) == (True, 3)
    assert cfg.index == IndexConfig()  # untouched sections keep their defaults


def test_dotted_toml_keys_and_the_bookie_table(tmp_path):
    f = tmp_path / "bookie.toml"
    f.write_text('journal.sync_data = false\n[bookie]\nport = 4100\n[bookie.disk]\nusage_threshold = 0.5\n'
                 'usage_warn_threshold = 0.4\n')
    cfg = load(BookieConfig, path=str(f))
    assert (cfg.journal.sync_data, cfg.port, cfg.disk.usage_threshold) == (False, 4100, 0.5)


def test_set_takes_table_dot_key():
    cfg = load(BookieConfig, overrides=["journal.sync_data=false", "gc.wait_time_ms=7", "http.bind_address=127.0.0.2",
                                        "curve.secret_key_file=/k"])
    assert cfg.journal.sync_data is False
    assert cfg.gc.wait_time_ms == 7
    assert cfg.http.bind_address == "127.0.0.2"
    assert cfg.curve.secret_key_file == "/k"


@pytest.mark.parametrize("items", [
    ["journal_sync_data=false", "journal.sync_data=true"],
    ["journal.sync_data=true", "journal_sync_data=false"],
])
def test_one_key_two_ways_on_the_command_line_is_an_error_naming_both(items):
    with pytest.raises(ConfigError, match=r"'journal[._]sync_data' and 'journal[._]sync_data' are the same key"):
        load(BookieConfig, overrides=items)


@pytest.mark.parametrize("text", [
    "journal_sync_data = false\n[journal]\nsync_data = true\n",
    "http_port = 1\n[http]\nport = 2\n",
    "port = 1\n[bookie]\nport = 2\n",
    "flush_interval_ms = 1\n[bookie.index]\nflush_interval_ms = 2\n",
])
def test_one_key_two_ways_in_a_file_is_an_error_naming_both(tmp_path, text):
    f = tmp_path / "bookie.toml"
    f.write_text(text)
    with pytest.raises(ConfigError, match=r"'\S+' and '\S+' are the same key") as e:
        load(BookieConfig, path=str(f))
    assert str(f) in str(e.value)


def test_a_later_source_overrides_a_key_given_another_way(tmp_path):
    f = tmp_path / "bookie.toml"
    f.write_text("[journal]\nsync_data = true\n[http]\nport = 9000\n")
    cfg = load(BookieConfig, path=str(f), overrides=["journal_sync_data=false"], explicit={"http_port": 9100})
    assert (cfg.journal.sync_data, cfg.http.port) == (False, 9100)


@pytest.mark.parametrize("item, near", [
    ("journal.sync_dta=false", "journal.sync_data"),
    ("jornal_sync_data=false", "journal_sync_data"),
    ("jornal.sync_data=false", "journal.sync_data"),
    ("gc.wait_time=5", "gc.wait_time_ms"),
    ("entry_log.flush_entry_log_bytes=5", "flush_entry_log_bytes"),
])
def test_unknown_keys_name_the_nearest_flat_and_dotted_names(item, near):
    with pytest.raises(ConfigError, match=f"unknown key .*did you mean .*{re.escape(near)}"):
        load(BookieConfig, overrides=[item])


def test_unknown_key_in_a_table_names_the_nearest(tmp_path):
    f = tmp_path / "bookie.toml"
    f.write_text("[index]\nflush_interval = 5\n")
    with pytest.raises(ConfigError, match="unknown key 'index.flush_interval'.*index.flush_interval_ms"):
        load(BookieConfig, path=str(f))


@pytest.mark.parametrize("item", ["journal=5", "gc=true", 'http="x"'])
def test_a_table_given_a_value_is_rejected(item):
    with pytest.raises(ConfigError, match="is a table"):
        load(BookieConfig, overrides=[item])


@pytest.mark.parametrize("item", ["journal.sync_data=maybe", "gc.wait_time_ms=soon", "journal_max_size_mb=1.5"])
def test_wrong_types_in_sections_are_rejected(item):
    with pytest.raises(ConfigError, match="expects"):
        load(BookieConfig, overrides=[item])


@pytest.mark.parametrize("kw, message", [
    ({"journal_max_group_wait_ms": -1}, r"journal\.max_group_wait_ms \(journal_max_group_wait_ms\)"),
    ({"entry_log_size_limit_mb": 0}, r"entry_log\.size_limit_mb \(entry_log_size_limit_mb\)"),
    ({"ledger_cache_bytes_max": 0}, r"index\.cache_bytes_max \(ledger_cache_bytes_max\)"),
    ({"gc_wait_time_ms": 0}, r"gc\.wait_time_ms \(gc_wait_time_ms\)"),
    ({"disk_check_interval_ms": 0}, r"disk\.check_interval_ms \(disk_check_interval_ms\)"),
    ({"replicator_workers": 0}, r"autorecovery\.replicator_workers \(replicator_workers\)"),
    ({"curve_authorized_keys_dir": "/d"}, r"curve\.secret_key_file \(curve_secret_key_file\)"),
    ({"http_port": 70000}, r"http\.port \(http_port\)"),
])
def test_each_section_validates_and_names_the_key_both_ways(kw, message):
    with pytest.raises(ConfigError, match=message):
        _base(**kw).validate()


def test_sections_are_frozen():
    cfg = _base().validate()
    with pytest.raises(dataclasses.FrozenInstanceError):
        cfg.journal.sync_data = False  # type: ignore[misc]


def test_autorecovery_shares_the_bookies_section():
    ar = load(AutoRecoveryConfig, overrides=["metadata_uri=sqlite:///m.db", "replicator_workers=4",
                                             "autorecovery.lost_bookie_recovery_delay_s=7"]).validate()
    assert ar.autorecovery == RecoveryConfig(replicator_workers=4, lost_bookie_recovery_delay_s=7.0)
    for item in ("autorecovery_enabled=true", "autorecovery.enabled=true"):
        with pytest.raises(ConfigError, match="enabled': a bookie's key"):
            load(AutoRecoveryConfig, overrides=[item])
    bookie = _base(autorecovery_enabled=True, replicator_workers=3, replication_rate_bytes=1000,
                   admin_token="t", http_bind_address="127.0.0.3").validate()
    embedded = bookie.autorecovery_config(http_port=8123)
    assert embedded.autorecovery is bookie.autorecovery
    assert (embedded.http_port, embedded.http_bind_address, embedded.admin_token) == (8123, "127.0.0.3", "t")
    assert embedded.lease_ttl_s == bookie.registration_ttl_s


def test_with_settings_checks_names_and_types():
    base = ClientConfig(add_timeout_ms=100, read_timeout_ms=200)
    assert with_settings(base, {"add_timeout_ms": 300}, source="t") == ClientConfig(add_timeout_ms=300,
                                                                                    read_timeout_ms=200)
    with pytest.raises(ConfigError, match="unknown keyword 'add_timeout'; did you mean add_timeout_ms"):
        with_settings(base, {"add_timeout": 1}, source="t")
    with pytest.raises(ConfigError, match="unknown keyword 'zzz'; did you mean "):
        with_settings(base, {"zzz": 1}, source="t")  # far from every name: still the nearest one
    for bad in ("300", True, 1.5, None):
        with pytest.raises(ConfigError, match="expects int"):
            with_settings(base, {"add_timeout_ms": bad}, source="t")


DOC_TYPES = {bool: "bool", int: "int", float: "float", str: "string"}


def _doc_table(heading: str) -> dict[str, list[str]]:
    """The rows of the table under the first ``### heading`` of the configuration reference
    (the site's reference/configuration.md, rendered from the config classes), by their key."""
    from zbk.config.reference import render

    text = render()
    start = text.index(f"\n### {heading} ")
    end = text.find("\n### ", start + 1)
    rows = {}
    for line in text[start:end].splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if line.startswith("| `"):
            rows[cells[0].strip("`")] = cells[1:]
    return rows


def _check_doc_cells(where: str, value: object, type_cell: str, default_cell: str) -> None:
    if isinstance(value, tuple):
        assert type_cell == "list of strings", where
        return
    assert type_cell == DOC_TYPES[type(value)], where
    default_cell = default_cell.split(" (")[0].strip("`")  # `67108864` (64 MiB)
    if isinstance(value, bool):
        assert default_cell == str(value).lower(), where
    elif isinstance(value, (int, float)):
        assert float(default_cell) == value, where


def test_config_reference_has_a_table_per_section_with_every_key_its_type_and_default():
    defaults = BookieConfig()
    top = _doc_table("Top level")
    sections = {f.name for f in dataclasses.fields(BookieConfig) if f.name in {s.TABLE for s in SECTIONS}}
    top_keys = [f.name for f in dataclasses.fields(BookieConfig) if f.name not in sections]
    assert sorted(top) == sorted(top_keys)
    for key in top_keys:
        value = getattr(defaults, key)
        if value not in ("", ()):  # derived or required: described in words
            _check_doc_cells(key, value, top[key][0], top[key][1])
    for section in SECTIONS:
        rows = _doc_table(f"`[{section.TABLE}]`")
        assert sorted(rows) == sorted(section.FLAT), section.TABLE
        for key, flat in section.FLAT.items():
            flat_cell, type_cell, default_cell = rows[key][:3]
            assert flat_cell == f"`{flat}`", (section.TABLE, key)
            value = getattr(getattr(defaults, section.TABLE), key)
            if value != "":
                _check_doc_cells(f"{section.TABLE}.{key}", value, type_cell, default_cell)


def test_canonical_key_names_one_key_whatever_its_spelling() -> None:
    from zbk.config import BookieConfig, canonical_key

    assert canonical_key(BookieConfig, "gc_wait_time_ms") == canonical_key(BookieConfig, "gc.wait_time_ms") == "gc.wait_time_ms"
    assert canonical_key(BookieConfig, "port") == "port"
    with pytest.raises(ConfigError, match="gc.wait_time_ms|gc_wait_time_ms"):
        canonical_key(BookieConfig, "gc_wait_time")


def test_harness_defaults_yield_to_a_dotted_spelling() -> None:
    from helpers.bookie import with_defaults

    got = with_defaults({"gc.wait_time_ms": 5}, {"gc_wait_time_ms": 3_600_000, "registration_ttl_s": 2})
    assert got == {"registration_ttl_s": 2, "gc.wait_time_ms": 5}
