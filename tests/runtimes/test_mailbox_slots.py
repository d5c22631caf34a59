"""The runner's mailbox slots: a job's put that is still on its way when the job has ended is
waited for, not taken for missing (a loaded host once read a link's goodput as 0 this way)."""

from __future__ import annotations

import threading
import time

import pytest

from testbed.runtimes.control import mailbox
from testbed.runtimes.control.hub import ControlHub


def _hub() -> ControlHub:
    hub = ControlHub.__new__(ControlHub)  # only the slots' state: no sockets, no thread
    hub.puts, hub._cond = {}, threading.Condition()
    return hub


def _put_later(hub: ControlHub, key: str, text: str, after: float) -> threading.Thread:
    def put() -> None:
        time.sleep(after)
        with hub._cond:
            hub.puts[key] = text
            hub._cond.notify_all()

    t = threading.Thread(target=put)
    t.start()
    return t


def test_a_put_still_on_its_way_is_waited_for():
    hub = _hub()
    slot = mailbox.Mailbox(hub, "tcp://up", "tcp://down", "bench") / "down.json"
    t = _put_later(hub, slot.key, '{"bytes": 5}', 0.3)
    assert not slot.exists()  # a flag polled now: not yet
    start = time.monotonic()
    assert slot.read_text() == '{"bytes": 5}'
    assert 0.25 <= time.monotonic() - start < 5
    t.join()


def test_a_slot_never_filled_is_missing_after_the_wait(monkeypatch):
    monkeypatch.setattr(mailbox, "ARRIVAL_S", 0.2)
    slot = mailbox.Mailbox(_hub(), "tcp://up", "tcp://down") / "never"
    start = time.monotonic()
    assert not slot.arrived()
    with pytest.raises(FileNotFoundError):
        slot.read_text()
    assert time.monotonic() - start < 2


def test_a_filled_slot_answers_at_once():
    hub = _hub()
    slot = mailbox.Mailbox(hub, "tcp://up", "tcp://down") / "ready"
    hub.puts[slot.key] = ""
    start = time.monotonic()
    assert slot.exists() and slot.arrived() and slot.read_text() == ""
    assert time.monotonic() - start < 0.1
