"""Bookie ids (zbk/bookieid.py) and the bookie configuration keys around them: bookie_id may
be host:port or a name, advertised_address is where a name-id bookie is found."""

from __future__ import annotations

import pytest

from zbk import limits
from zbk.bookieid import check_bookie_id, is_address, join_address, split_address
from zbk.config import BookieConfig, load
from zbk.errors import ConfigError


def cfg(**kw: object) -> BookieConfig:
    base: dict[str, object] = {"metadata_uri": "sqlite:///m.db", "data_dir": "/d"}
    return BookieConfig(**{**base, **kw}).validate()  # type: ignore[arg-type]


def test_split_address_takes_host_port_only() -> None:
    assert split_address("127.0.0.1:3181") == ("127.0.0.1", 3181)
    assert split_address("bookie1.example.com:4000") == ("bookie1.example.com", 4000)
    assert split_address("[::1]:3181") == ("[::1]", 3181)
    for not_one in ("bookie-a", "", ":3181", "h:", "h:0", "h:65536", "h:x1", "::1:3181", "[::1:3181", "[]:1",
                    "a b:1", "a/b:1", "h:+1", "h:１２"):
        assert split_address(not_one) is None, not_one
        assert not is_address(not_one)
    assert join_address("127.0.0.1", 3181) == "127.0.0.1:3181"
    assert join_address("::1", 3181) == "[::1]:3181"
    assert join_address("[::1]", 3181) == "[::1]:3181"


def test_bookie_ids_may_be_names_or_host_port() -> None:
    for ok in ("bookie-a", "127.0.0.1:3181", "rack1.bk_07", "b:c", "x" * limits.bookie_id_chars_max, "ü-bookie"):
        assert check_bookie_id(ok) == ok
    for bad, why in (("", "empty"), ("a/b", "'/'"), ("bookie a", "white space"), ("tab\there", "white space"),
                     ("nl\n", "white space"), ("bell\x07", "printable"), ("x" * (limits.bookie_id_chars_max + 1),
                                                                        "at most"), ("..", "directory"),
                     (".", "directory")):
        with pytest.raises(ConfigError, match=why):
            check_bookie_id(bad)


def test_the_config_takes_a_name_id_and_an_advertised_address() -> None:
    c = cfg(bookie_id="bookie-a", port=4000)
    assert (c.bookie_id, c.wire_address) == ("bookie-a", "127.0.0.1:4000")  # bind_address by default
    c = cfg(bookie_id="bookie-a", port=4000, advertised_address="127.0.0.5")
    assert c.wire_address == "127.0.0.5:4000"
    # A host:port id keeps being its own address, as before stable ids (NAT included)...
    c = cfg(bookie_id="10.0.1.11:3181", bind_address="0.0.0.0", port=3181)
    assert c.wire_address == "10.0.1.11:3181"
    # ... unless an advertised address says otherwise; and the default id is that address.
    assert cfg(bookie_id="10.0.1.11:3181", advertised_address="127.0.0.2", port=5000).wire_address == "127.0.0.2:5000"
    c = cfg(advertised_address="127.0.0.3", port=5001)
    assert (c.bookie_id, c.wire_address) == ("127.0.0.3:5001", "127.0.0.3:5001")
    c = cfg(port=5002)
    assert (c.bookie_id, c.wire_address) == ("127.0.0.1:5002", "127.0.0.1:5002")


@pytest.mark.parametrize(("settings", "match"), [
    ({"bookie_id": "a/b"}, "bookie_id must not contain '/'"),
    ({"bookie_id": "my bookie"}, "bookie_id must be printable and without white space"),
    ({"bookie_id": "x" * (limits.bookie_id_chars_max + 1)}, "bookie_id is 129 characters long"),
    ({"bookie_id": "bookie\x00a"}, "bookie_id must be printable"),
    ({"bookie_id": "   "}, "bookie_id must be printable and without white space"),
    ({"bookie_id": "bookie-a", "bind_address": "0.0.0.0"}, "set advertised_address"),
    ({"bookie_id": "bookie-a", "advertised_address": "0.0.0.0"}, "no address to connect to"),
    ({"advertised_address": "a b"}, "advertised_address must be a host name"),
    ({"advertised_address": "h/x"}, "advertised_address must be a host name"),
])
def test_bad_ids_and_addresses_are_config_errors(settings: dict[str, object], match: str) -> None:
    with pytest.raises(ConfigError, match=match):
        cfg(**settings)


def test_the_keys_load_from_toml_and_set(tmp_path) -> None:  # type: ignore[no-untyped-def]
    f = tmp_path / "bookie.toml"
    f.write_text('bookie_id = "bookie-a"\nadvertised_address = "127.0.0.9"\nport = 4100\n'
                 'metadata_uri = "sqlite:///m.db"\ndata_dir = "/d"\n')
    c = load(BookieConfig, path=str(f)).validate()
    assert (c.bookie_id, c.wire_address) == ("bookie-a", "127.0.0.9:4100")
    c = load(BookieConfig, path=str(f), overrides=["bookie_id=bookie-b", "advertised_address=127.0.0.8"]).validate()
    assert (c.bookie_id, c.wire_address) == ("bookie-b", "127.0.0.8:4100")
    with pytest.raises(ConfigError, match="'/'"):
        load(BookieConfig, path=str(f), overrides=["bookie_id=a/b"]).validate()
