"""The settle-once ticket of the request path: synchronous callbacks, future semantics."""

from __future__ import annotations

import asyncio
import logging

import pytest

from torchplace.serve.ticket import Ticket


def test_callbacks_run_in_the_settling_call_in_order() -> None:
    ticket: Ticket[int] = Ticket()
    seen: list[tuple[str, int]] = []
    ticket.add_done_callback(lambda t: seen.append(("a", t.result())))
    ticket.add_done_callback(lambda t: seen.append(("b", t.result())))
    assert not ticket.done()
    ticket.set_result(7)
    assert seen == [("a", 7), ("b", 7)]  # before set_result returned
    ticket.add_done_callback(lambda t: seen.append(("late", t.result())))
    assert seen[-1] == ("late", 7)  # added after: run at once


def test_a_failing_callback_is_logged_and_the_rest_still_run(
    caplog: pytest.LogCaptureFixture,
) -> None:
    ticket: Ticket[int] = Ticket()
    seen: list[int] = []

    def broken(_: Ticket[int]) -> None:
        raise RuntimeError("boom")

    ticket.add_done_callback(broken)
    ticket.add_done_callback(lambda t: seen.append(t.result()))
    with caplog.at_level(logging.ERROR, logger="torchplace.serve"):
        ticket.set_result(1)
    assert seen == [1]
    assert "boom" in caplog.text


def test_exception_and_cancel_follow_the_future_contract() -> None:
    failed: Ticket[int] = Ticket()
    with pytest.raises(asyncio.InvalidStateError):
        failed.result()
    with pytest.raises(asyncio.InvalidStateError):
        failed.exception()
    error = ValueError("bad rows")
    failed.set_exception(error)
    assert failed.exception() is error
    with pytest.raises(ValueError, match="bad rows"):
        failed.result()
    assert not failed.cancel()  # already settled
    with pytest.raises(asyncio.InvalidStateError):
        failed.set_result(1)

    cancelled: Ticket[int] = Ticket()
    calls: list[bool] = []
    cancelled.add_done_callback(lambda t: calls.append(t.cancelled()))
    assert cancelled.cancel()
    assert calls == [True]
    with pytest.raises(asyncio.CancelledError):
        cancelled.result()
    with pytest.raises(asyncio.CancelledError):
        cancelled.exception()


def test_awaiting_gets_the_result_and_a_cancelled_waiter_cancels_it() -> None:
    async def main() -> None:
        ticket: Ticket[str] = Ticket()
        asyncio.get_running_loop().call_later(0.01, ticket.set_result, "rows")
        assert await ticket == "rows"
        assert await ticket == "rows"  # settled: no waiting

        pending: Ticket[str] = Ticket()
        with pytest.raises(asyncio.TimeoutError):
            await asyncio.wait_for(pending, 0.01)
        assert pending.cancelled()  # the work is withdrawn with its waiter

        failing: Ticket[str] = Ticket()
        asyncio.get_running_loop().call_soon(failing.set_exception, KeyError("x"))
        with pytest.raises(KeyError):
            await failing

    asyncio.run(main())


def test_a_cancel_message_is_kept_and_passed_on_by_an_awaiting_task() -> None:
    assert Ticket[int]().cancel_message() is None
    direct: Ticket[int] = Ticket()
    direct.cancel("why")
    assert direct.cancel_message() == "why"

    async def main() -> None:
        ticket: Ticket[int] = Ticket()
        task = asyncio.ensure_future(_awaited(ticket))
        await asyncio.sleep(0)
        task.cancel("the server's reason")
        with pytest.raises(asyncio.CancelledError):
            await task
        assert ticket.cancelled()
        assert ticket.cancel_message() == "the server's reason"

    asyncio.run(main())


async def _awaited(ticket: Ticket[int]) -> int:
    return await ticket
