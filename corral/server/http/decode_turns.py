"""HTTP bodies decoded on worker threads one at a time, so that their threads do not fight.

A body too costly to decode on the event loop (``corral.server.http.app``: a large JSON body, a
compressed one, one that names shared memory) is decoded on a worker thread. Decoding is
Python and orjson, which hold the GIL: threads decoding side by side take no less time
together than one taking the bodies in turn, and they take the GIL from the event loop and
from the compute workers each time a run ends, which then wait for it (nudenet's 2.5 MB JSON
bodies at 8 connections, 2026-12-03: the default executor's six threads served 163 requests
in 5 s, two at a time 177, one at a time 195-204).

So each body waits for its turn (:class:`DecodeTurns`), first come first served: one turn
for bodies up to :data:`LONG_DECODE_BYTES` and one for larger ones, so that a 40 MiB body
(1.5-3 s to decode) holds up only bodies as large, not an image's few megabytes.
"""

from __future__ import annotations

import asyncio
import contextvars
import functools
from collections.abc import Callable
from typing import ParamSpec, TypeVar

__all__ = ["LONG_DECODE_BYTES", "DecodeTurns"]

#: Bodies larger than this take the second turn: nudenet's 2.5 MB JSON image (14 ms to
#: decode) the first, a 40 MiB body the second.
LONG_DECODE_BYTES = 4 * 1024 * 1024

_Params = ParamSpec("_Params")
_Result = TypeVar("_Result")


class DecodeTurns:
    """Worker-thread decoding, one body at a time for each of the two sizes.

    Used on the event loop that serves the app; a new loop (the app served again) gets new
    turns. A request cancelled while its body decodes leaves its turn held until the decode
    ends on its thread, so a client that goes away cannot make two decodes run at once.
    """

    def __init__(self) -> None:
        # The loop served, and a semaphore guarding each decoding thread's slot: bodies up
        # to LONG_DECODE_BYTES, larger ones. Made on the first run on a loop.
        self._turns: (
            tuple[asyncio.AbstractEventLoop, asyncio.Semaphore, asyncio.Semaphore] | None
        ) = None

    async def run(
        self,
        size: int,
        call: Callable[_Params, _Result],
        /,
        *args: _Params.args,
        **kwargs: _Params.kwargs,
    ) -> _Result:
        """``call(*args, **kwargs)`` on a worker thread, once a ``size``-byte body's turn comes."""
        loop = asyncio.get_running_loop()
        turns = self._turns
        if turns is None or turns[0] is not loop:
            turns = self._turns = (loop, asyncio.Semaphore(1), asyncio.Semaphore(1))
        turn = turns[2] if size > LONG_DECODE_BYTES else turns[1]
        await turn.acquire()
        try:
            context = contextvars.copy_context()  # as asyncio.to_thread passes it on
            decoding = loop.run_in_executor(
                None, functools.partial(context.run, call, *args, **kwargs)
            )
        except BaseException:
            turn.release()
            raise
        decoding.add_done_callback(functools.partial(_end_turn, turn))
        # Shielded: a cancel stops this wait, not the decode, whose end gives the turn back.
        return await asyncio.shield(decoding)


def _end_turn(turn: asyncio.Semaphore, decoding: asyncio.Future[object]) -> None:
    turn.release()
    if not decoding.cancelled():
        decoding.exception()  # read here too: a request cancelled meanwhile never reads it
