import pytest

from zbk.config import AutoRecoveryConfig, BookieConfig, ClientConfig, build, load, parse_overrides
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
    assert cfg.journal_write_data is True


def test_toml_then_set_then_explicit(tmp_path):
    f = tmp_path / "bookie.toml"
    f.write_text('port = 4000\njournal_write_data = false\nledger_dirs = ["/a", "/b"]\n'
                 'data_dir = "/d"\nmetadata_uri = "sqlite:///m.db"\n')
    cfg = load(BookieConfig, path=str(f), overrides=["port=4001", "flush_interval_ms=500"],
               explicit={"port": 4002, "http_port": None})
    assert cfg.port == 4002
    assert cfg.flush_interval_ms == 500
    assert cfg.journal_write_data is False
    assert cfg.validate().ledger_dirs == ("/a", "/b")
    assert cfg.http_port == 8000  # None explicit values do not override


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
