"""How a measuring job (link checks, benchmarks: `runtime.start`) hands a result or a flag to the
runner, or waits for another job's flag: over the control channel, never through a shared folder
(a job may run on another host). A slot is a string `UP DOWN KEY` that the runner's mailbox
(runtimes.control.mailbox) makes; the hub keeps what is put into each slot and publishes it to
whoever waits for it."""

from __future__ import annotations

import time

from testbed.node import channel

FLAG_MESSAGE = 1024  # bytes of a frame on a flag's topic (its key; the flag itself is empty)


def slot_parts(slot: str) -> tuple[str, str, str]:
    up, down, key = slot.split(" ", 2)
    return up, down, key


def write_text(slot: str, text: str) -> None:
    """Put `text` into the slot (a job's result); it has left when this returns."""
    up, _, key = slot_parts(slot)
    channel.send_json(up, "put", {"key": key, "data": text})
    channel.flush()


def touch(slot: str) -> None:
    """Raise the slot's flag (a job is ready, connected, done)."""
    write_text(slot, "")


class Waiter:
    """Waits for a slot to be filled (by a job on any node)."""

    def __init__(self, slot: str):
        _, down, key = slot_parts(slot)
        self.listener = channel.Listener(down, [channel.topic("put", key)], max_message=FLAG_MESSAGE)
        self.filled = False

    def poll(self, timeout_ms: int = 0) -> bool:
        self.filled = self.filled or bool(self.listener.poll(timeout_ms))
        return self.filled

    def close(self) -> None:
        self.listener.close()


def wait(slot: str, timeout: float) -> bool:
    """Whether the slot was filled within `timeout` seconds."""
    waiter = Waiter(slot)
    try:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if waiter.poll(100):
                return True
        return False
    finally:
        waiter.close()
