"""The admin HTTP handlers ask the Server for its state with a message and wait a bounded
time for the answer; they never read its core. Here a thread plays the Server's end of the
admin pipe (the real bookie's routes are in test_rules.py)."""

from __future__ import annotations

import threading
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any, cast

import pytest
import zmq

from zbk import limits
from zbk.actors.base import drop_handoff, handoff_for, pipe_address
from zbk.actors.messages import BookieStatus, SetReadOnly, StatusRequest
from zbk.bookie.admin import BookieAdmin
from zbk.config import BookieConfig
from zbk.errors import BookieUnavailableError, ZbkTimeoutError
from zbk.metrics.http import HttpError
from zbk.storage.operatorstate import operator_read_only


class _Cfg:
    bookie_id = "bk-1"
    index_dirs: tuple[str, ...] = ()


@pytest.fixture
def admin(tmp_path: Path) -> Iterator[tuple[BookieAdmin, zmq.Socket[Any]]]:
    """A BookieAdmin with only what its handlers use (the admin pipe), and the Server's end."""
    ctx = zmq.Context()
    instance = f"t-{uuid.uuid4().hex[:8]}"
    pull = ctx.socket(zmq.PULL)
    pull.bind(pipe_address(instance, "admin", "server"))
    a = BookieAdmin.__new__(BookieAdmin)  # no boot: the handlers need none of it
    cfg = _Cfg()
    cfg.index_dirs = (str(tmp_path / "index"),)
    a.cfg = cast(BookieConfig, cfg)
    a.serving = True  # the actors run (Bookie.start)
    a.instance = instance
    a.admin = ctx.socket(zmq.PUSH)
    a.admin.setsockopt(zmq.LINGER, 0)
    a.admin.connect(pipe_address(instance, "admin", "server"))
    a.admin_lock = threading.Lock()
    try:
        yield a, pull
    finally:
        a.admin.close(0)
        pull.close(0)
        drop_handoff(instance)
        ctx.term()


def test_info_is_the_servers_answer(admin: tuple[BookieAdmin, zmq.Socket[Any]]) -> None:
    a, pull = admin
    got: list[Any] = []

    def server() -> None:
        for _ in range(3):
            if not pull.poll(5000):
                return
            msg = handoff_for(a.instance).take(pull.recv())
            got.append(type(msg))
            if isinstance(msg, StatusRequest):
                msg.answer.set_result(BookieStatus(read_only=True, ledgers=4, limbo_ledgers=1,
                                                   disk_used_bytes=250, disk_total_bytes=1000))

    t = threading.Thread(target=server, daemon=True)
    t.start()
    try:
        assert a._put_state({"state": "readonly"}) == {"state": "readonly"}
        assert a.info() == {"id": "bk-1", "state": "readonly", "ledgers": 4, "limbo_ledgers": 1,
                            "disk": {"used_bytes": 250, "total_bytes": 1000, "usage_ratio": 0.25}}
        assert a.state() == "readonly"
    finally:
        t.join(10)
    assert got == [SetReadOnly, StatusRequest, StatusRequest], "the read-only flag went as a message, in order"
    assert operator_read_only(a.cfg.index_dirs), "the operator's read-only state was kept on disk first"


def test_before_the_actors_run_the_answer_is_503(admin: tuple[BookieAdmin, zmq.Socket[Any]]) -> None:
    a, pull = admin
    a.serving = False  # booting: the HTTP server is up, the actors are not
    for ask in (a.info, a.gc_status, lambda: a._put_state({"state": "readonly"})):
        with pytest.raises(BookieUnavailableError) as e:
            ask()
        assert e.value.http_status == 503
    assert not pull.poll(100), "nothing was sent to actors that do not run"
    assert not operator_read_only(a.cfg.index_dirs)


def test_a_server_that_does_not_answer_is_a_timeout(admin: tuple[BookieAdmin, zmq.Socket[Any]],
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    a, _ = admin
    monkeypatch.setattr(limits, "server_admin_answer_wait_s", 0.05)
    with pytest.raises(ZbkTimeoutError):
        a.info()


def test_is_ready_only_between_registration_and_stop(admin: tuple[BookieAdmin, zmq.Socket[Any]]) -> None:
    a, _ = admin
    a.stop_event = threading.Event()
    for ready, stopping, answer in ((False, False, 503), (True, False, 200), (True, True, 503)):
        a.ready = ready
        if stopping:
            a.stop_event.set()
        try:
            assert a._is_ready(None) == {"ready": True} and answer == 200
        except HttpError as e:
            assert e.status == answer == 503, (ready, stopping)


def test_server_config_masks_the_secrets_and_shows_the_rest() -> None:
    from zbk.config.sections import CurveConfig, HttpConfig

    a = BookieAdmin.__new__(BookieAdmin)
    a.cfg = BookieConfig(metadata_uri="etcd://127.0.0.1:2379/zbk?user=zbk&password=hunter2", data_dir="/d",
                         http=HttpConfig(admin_token="t0ken"),
                         curve=CurveConfig(secret_key_file="/keys/b1.key_secret", authorized_keys_dir="/keys/clients",
                                           server_public_key_file="/keys/b.key")).resolved()
    doc = a.server_config()
    text = str(doc)
    assert "hunter2" not in text and "t0ken" not in text and "b1.key_secret" not in text
    assert doc["http"]["admin_token"] == doc["curve"]["secret_key_file"] == "********"
    assert doc["metadata_uri"] == "etcd://127.0.0.1:2379/zbk?user=zbk&password=***"
    assert doc["curve"]["authorized_keys_dir"] == "/keys/clients" and doc["curve"]["server_public_key_file"] == "/keys/b.key"
    assert doc["journal_dirs"] == ("/d/journal",)
    plain = BookieAdmin.__new__(BookieAdmin)
    plain.cfg = BookieConfig(metadata_uri="sqlite:///m.db", data_dir="/d").resolved()
    unset = plain.server_config()
    assert unset["http"]["admin_token"] == unset["curve"]["secret_key_file"] == ""  # unset stays visibly unset
