"""Closing the listening socket without resetting a connection the kernel already accepted.

The kernel completes TCP handshakes on its own and parks the connections in the listening
socket's accept queue until the server calls ``accept()``. Closing the listener resets every
connection still in that queue: their clients already sent a request, and all they get back is
``ConnectionResetError``; they cannot tell whether it ran. So :func:`close_listener`:

1. attaches a socket filter that drops incoming SYNs (Linux; a classic BPF program on the TCP
   header's flags). New clients are no longer taken in: their SYN goes unanswered, they retry it
   a second later and by then meet a closed port (connection refused, safe to retry elsewhere).
   Handshakes already under way still complete, since only SYNs are dropped;
2. keeps accepting until the accept queue is empty (read from ``TCP_INFO``: on a listening
   socket ``tcpi_unacked`` is the queue's length) and stays empty for a moment, answering each
   connection as the server answers any;
3. then closes the listener: nothing is left in its queue to reset.

Where the filter or ``TCP_INFO`` is not available (not Linux), it waits a short moment for the
queue to be taken and closes: the old behaviour, with its small window.
"""

from __future__ import annotations

import asyncio
import ctypes
import os
import socket
import struct
import sys
import time
from collections.abc import Sequence
from typing import Any

__all__ = ["accept_queue_length", "close_listener", "refuse_new_connections"]

_SO_ATTACH_FILTER = 26
# ldb [13] (TCP flags); jset #SYN -> drop : accept; ret #0; ret #0xffffffff
_DROP_SYN = (
    (0x30, 0, 0, 13),
    (0x45, 0, 1, 0x02),
    (0x06, 0, 0, 0),
    (0x06, 0, 0, 0xFFFFFFFF),
)
_SETTLE_S = 0.05  # how long the queue must stay empty (a handshake's last ACK in flight)


def _dup(sock: Any) -> socket.socket:
    """A real socket on the same listener (asyncio and uvloop hand out wrappers); closing it
    leaves the listener open."""
    return socket.socket(fileno=os.dup(sock.fileno()))


def refuse_new_connections(sock: Any) -> bool:
    """Drop new SYNs on a listening TCP socket; False where that is not possible."""
    if not sys.platform.startswith("linux"):
        return False
    program = b"".join(struct.pack("HBBI", *insn) for insn in _DROP_SYN)
    buffer = ctypes.create_string_buffer(program)
    fprog = struct.pack("HL", len(_DROP_SYN), ctypes.addressof(buffer))
    try:
        with _dup(sock) as real:
            real.setsockopt(socket.SOL_SOCKET, _SO_ATTACH_FILTER, fprog)
    except OSError:
        return False
    return True


def accept_queue_length(sock: Any) -> int | None:
    """Connections waiting in a listening socket's accept queue (Linux); None if unknown."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        with _dup(sock) as real:
            info = real.getsockopt(socket.IPPROTO_TCP, socket.TCP_INFO, 104)
    except OSError:
        return None
    if len(info) < 28:
        return None
    unacked: int = struct.unpack_from("I", info, 24)[0]  # tcpi_unacked: the queue's length
    return unacked


async def close_listener(server: asyncio.AbstractServer, timeout: float = 2.0) -> None:
    """Stop taking connections, take every one already queued, then close ``server``."""
    sockets: Sequence[Any] = list(getattr(server, "sockets", None) or ())
    filtered = bool(sockets) and all(refuse_new_connections(s) for s in sockets)
    end = time.monotonic() + max(timeout, 0.0)
    if filtered:
        empty_since: float | None = None
        while time.monotonic() < end:
            lengths = [accept_queue_length(s) for s in sockets]
            if any(n is None for n in lengths):
                await asyncio.sleep(_SETTLE_S)
                break
            now = time.monotonic()
            if any(lengths):
                empty_since = None
            elif empty_since is None:
                empty_since = now
            elif now - empty_since >= _SETTLE_S:
                break
            await asyncio.sleep(0.002)
    else:
        await asyncio.sleep(min(_SETTLE_S, max(timeout, 0.0)))
    server.close()
