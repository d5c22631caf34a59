"""The runner's hub ports relayed from a fleet host's LAN (node.fleet.host): its devices reach
the gateway address, and the host opens each connection onward from its own namespace, which
reaches the runner. One event loop in a process of its own (forked before the host loads torch
or forks its devices: no thread in the process that forks them), thousands of connections
(a device's supervisor and trainer each hold two or three). The bytes are the channel's CURVE
streams, end to end between the device and the hub: the relay reads none of them."""

from __future__ import annotations

import asyncio
import os
import signal
import sys
import traceback

CHUNK = 1 << 16
CONNECT_TIMEOUT = 30.0  # s: a SYN the hub's full queue dropped is sent again after 1, 3, 7, 15 s


async def _pump(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    try:
        while data := await reader.read(CHUNK):
            writer.write(data)
            await writer.drain()
    except (ConnectionError, OSError):
        pass
    finally:
        writer.close()  # either side gone: both go


async def _serve(listen: str, routes: list[tuple[str, int]]) -> None:
    def handler(upstream: tuple[str, int]):
        async def handle(reader, writer) -> None:
            try:
                up_reader, up_writer = await asyncio.wait_for(asyncio.open_connection(*upstream), CONNECT_TIMEOUT)
            except (OSError, asyncio.TimeoutError) as e:
                writer.close()  # the device sees a refused connection, as it would without a relay
                print(f"fleet relay: {upstream[0]}:{upstream[1]} refused a device's connection: {e!r}",
                      file=sys.stderr, flush=True)
                return
            await asyncio.gather(_pump(reader, up_writer), _pump(up_reader, writer))
        return handle

    servers = [await asyncio.start_server(handler(up), listen, up[1], backlog=4096) for up in routes]
    await asyncio.gather(*(s.serve_forever() for s in servers))


def relay_main(listen: str, routes: list[tuple[str, int]]) -> None:
    """Relay `listen`:port to (address, port) for each route in `routes`, until killed."""
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    asyncio.run(_serve(listen, routes))


def start_relay_process(listen: str, routes: list[tuple[str, int]]) -> int:
    """The relay in a forked process of its own; its pid."""
    pid = os.fork()
    if pid == 0:
        try:
            relay_main(listen, routes)
        except BaseException:
            traceback.print_exc()  # the service's log: why the devices lost the hub
            sys.stderr.flush()
        os._exit(1)
    return pid
