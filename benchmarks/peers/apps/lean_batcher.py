"""A lean reference: the least a dynamically batching Python server of torchplace's own stack
(uvloop, httptools, orjson) does per request. Each OIP JSON request is decoded, its rows wait
until the loop has read what arrived (or 32 rows are waiting), the batch's forward runs on the
loop, and each answer is encoded and written. Nothing else: no validation beyond what the
decode needs, no errors, queue limits, deadlines, metrics or statistics, no drain.

Its share of the two limits is what a server written in Python on this stack reaches at best on
this machine; torchplace's share of it is what its features cost. Called like the peer scripts:
``lean_batcher.py MODEL PORT DEVICE THREADS WORKDIR``; runs in torchplace's own environment.
"""

from __future__ import annotations

import asyncio
from array import array
from collections.abc import Callable
from typing import Any

import numpy as np
import orjson
import torch
from _common import HOST, build, parse_args
from const_reply import ConstantReply

MAX_ROWS = 32
HEAD = b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: %d\r\n\r\n"


class Batch:
    """Rows waiting for the next forward, each request's with the callback its answer goes to.
    A batch runs at 32 rows, or ``max_delay_s`` after its first row (0: once the loop has run
    what is ready, which is everything that arrived together)."""

    def __init__(self, model: Any, device: torch.device, max_delay_s: float = 0.0) -> None:
        self.model, self.device, self.max_delay_s = model, device, max_delay_s
        self.rows: list[np.ndarray[Any, Any]] = []
        self.answers: list[tuple[Callable[[np.ndarray[Any, Any]], None], int]] = []
        self.count = 0
        self.timer: asyncio.Handle | None = None

    def add(
        self, rows: np.ndarray[Any, Any], answer: Callable[[np.ndarray[Any, Any]], None]
    ) -> None:
        self.rows.append(rows)
        self.answers.append((answer, len(rows)))
        self.count += len(rows)
        if self.count >= MAX_ROWS:
            self.run()
        elif self.timer is None:
            loop = asyncio.get_running_loop()
            if self.max_delay_s:
                self.timer = loop.call_later(self.max_delay_s, self.run)
            else:
                self.timer = loop.call_soon(self.run)

    def run(self) -> None:
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None
        rows, answers = self.rows, self.answers
        if not rows:
            return
        self.rows, self.answers, self.count = [], [], 0
        x = torch.from_numpy(np.concatenate(rows)).to(self.device)
        with torch.inference_mode():
            out = self.model(x).cpu().numpy()
        start = 0
        for answer, n in answers:
            answer(out[start : start + n])
            start += n


class Connection(ConstantReply):
    """:class:`ConstantReply`'s connection (the same parser and transport handling) that
    answers each request through the batch instead of with a fixed reply."""

    def __init__(self, batch: Batch, model: str) -> None:
        super().__init__(b"")
        self.batch, self.model = batch, model
        self.body: list[bytes] = []

    def connection_lost(self, exc: Exception | None) -> None:
        self.transport = None

    def on_body(self, body: bytes) -> None:
        self.body.append(body)

    def on_message_complete(self) -> None:
        request = orjson.loads(b"".join(self.body))
        self.body = []
        tensor = request["inputs"][0]
        values = np.frombuffer(array("d", tensor["data"]), dtype=np.float64)
        rows = values.astype(np.float32).reshape(tensor["shape"][0], -1)
        rid = request.get("id")

        def answer(out: np.ndarray[Any, Any]) -> None:
            output = {"name": "output", "datatype": "FP32", "shape": list(out.shape), "data": out}
            body = orjson.dumps(
                {"model_name": self.model, "id": rid, "outputs": [output]},
                option=orjson.OPT_SERIALIZE_NUMPY,
            )
            if self.transport is not None:
                self.transport.write(HEAD % len(body) + body)

        self.batch.add(rows, answer)


async def serve() -> None:
    args = parse_args()
    batch = Batch(build(args), torch.device(args.device))
    loop = asyncio.get_running_loop()
    server = await loop.create_server(
        lambda: Connection(batch, args.model), HOST, args.port, backlog=1024
    )
    async with server:
        await server.serve_forever()


def main() -> None:
    try:
        import uvloop
    except ImportError:
        asyncio.run(serve())
    else:
        uvloop.run(serve())


if __name__ == "__main__":
    main()
