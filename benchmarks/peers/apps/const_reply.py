"""The HTTP limit: a bare asyncio + httptools server that answers every request with one fixed
reply, whatever it asks. No routing, no decoding, no model: what serving a tiny model over HTTP
costs at least on this machine. Runs with uvloop when it is installed, as torchplace does.

Called as ``const_reply.py PORT REPLY_FILE``: the reply body is read from the file (the model's
real answer, so that the readiness check can tell it from an error page).
"""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path
from typing import Any

import httptools


class ConstantReply(asyncio.Protocol):
    def __init__(self, reply: bytes) -> None:
        self.reply = reply
        self.transport: Any = None  # uvloop's transports are not asyncio.Transport subclasses
        self.parser = httptools.HttpRequestParser(self)

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport

    def data_received(self, data: bytes) -> None:
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserError:
            if self.transport is not None:
                self.transport.close()

    def on_message_complete(self) -> None:
        if self.transport is not None:
            self.transport.write(self.reply)


def http_reply(body: bytes) -> bytes:
    """The whole HTTP response that carries ``body``."""
    head = (
        f"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n"
    )
    return head.encode() + body


async def serve(port: int, body: bytes) -> None:
    reply = http_reply(body)
    loop = asyncio.get_running_loop()
    server = await loop.create_server(lambda: ConstantReply(reply), "127.0.0.1", port, backlog=1024)
    async with server:
        await server.serve_forever()


def main() -> None:
    port, reply_file = int(sys.argv[1]), Path(sys.argv[2])
    body = reply_file.read_bytes()
    try:
        import uvloop

        uvloop.run(serve(port, body))
    except ImportError:
        asyncio.run(serve(port, body))


if __name__ == "__main__":
    main()
