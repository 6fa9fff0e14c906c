"""Bodies decoded on worker threads take turns: one at a time for each of the two sizes.

``corral.server.http.decode_turns.DecodeTurns`` hands a body's decode to a worker thread only once
the decodes of bodies of its size ahead of it have ended, a cancelled request's decode
included. A decode that should wait for its turn but does not would start while the one
ahead of it is still running; each test holds the first decode until the second starts or
a short bound passes, so that a broken turn shows as the second start before the first end.
"""

from __future__ import annotations

import asyncio
import threading

import pytest

from corral.server.http.decode_turns import LONG_DECODE_BYTES, DecodeTurns

pytestmark = pytest.mark.timeout(30)

SHORT = 1024 * 1024
LONG = LONG_DECODE_BYTES + 1
# How long the first decode waits for the second to start, which it must not.
NOT_STARTED_S = 0.3


class Decodes:
    """A stand-in for decode_request that records when each decode starts and ends."""

    def __init__(self) -> None:
        self.events: list[str] = []
        self._events_lock = threading.Lock()  # guards events: appended from worker threads
        self.started = {tag: threading.Event() for tag in ("a", "b")}

    def decode(self, tag: str, wait_for: str | None = None) -> str:
        with self._events_lock:
            self.events.append(f"start {tag}")
        self.started[tag].set()
        if wait_for is not None:
            self.started[wait_for].wait(NOT_STARTED_S)
        with self._events_lock:
            self.events.append(f"end {tag}")
        return tag


def test_two_bodies_of_one_size_decode_one_after_the_other():
    decodes = Decodes()
    turns = DecodeTurns()

    async def main() -> list[str]:
        first = asyncio.ensure_future(turns.run(SHORT, decodes.decode, "a", "b"))
        second = asyncio.ensure_future(turns.run(SHORT, decodes.decode, "b"))
        return list(await asyncio.gather(first, second))

    assert asyncio.run(main()) == ["a", "b"]
    assert decodes.events == ["start a", "end a", "start b", "end b"]


def test_a_long_body_does_not_wait_for_a_short_ones_decode():
    turns = DecodeTurns()
    started, release = threading.Event(), threading.Event()
    events: list[str] = []

    def held() -> str:
        started.set()
        release.wait(10)
        return "short"

    async def main() -> tuple[str, str]:
        short = asyncio.ensure_future(turns.run(SHORT, held))
        assert await asyncio.to_thread(started.wait, 10)  # the short body has its turn
        long = await asyncio.wait_for(turns.run(LONG, events.append, "long decoded"), 5)
        assert long is None
        release.set()
        return await short, "done"

    assert asyncio.run(main()) == ("short", "done")
    assert events == ["long decoded"]


def test_a_cancelled_requests_decode_keeps_its_turn_until_it_ends():
    decodes = Decodes()
    turns = DecodeTurns()

    async def main() -> str:
        first = asyncio.ensure_future(turns.run(SHORT, decodes.decode, "a", "b"))
        assert await asyncio.to_thread(decodes.started["a"].wait, 10)
        first.cancel()
        with pytest.raises(asyncio.CancelledError):
            await first
        return await turns.run(SHORT, decodes.decode, "b")

    assert asyncio.run(main()) == "b"
    assert decodes.events == ["start a", "end a", "start b", "end b"]


def test_a_decode_that_fails_raises_its_error_and_gives_the_turn_back():
    turns = DecodeTurns()

    def fails() -> None:
        raise ValueError("not JSON")

    async def main() -> str:
        with pytest.raises(ValueError, match="not JSON"):
            await turns.run(SHORT, fails)
        return await asyncio.wait_for(turns.run(SHORT, str, "next"), 5)

    assert asyncio.run(main()) == "next"


def test_the_turns_serve_a_new_event_loop():
    turns = DecodeTurns()
    # asyncio's semaphores belong to one loop: a second asyncio.run must get turns of its own.
    assert asyncio.run(turns.run(SHORT, str, "first")) == "first"
    assert asyncio.run(turns.run(SHORT, str, "second")) == "second"
