"""Delivery: settling requests' futures from a compute worker, one wake-up per event loop.

A compute worker answers a batch of requests at once. A blocking caller's
``concurrent.futures.Future`` is settled on the worker's thread; an asyncio caller's future
may only be settled on its own loop, so the answers for each loop go there in one
``call_soon_threadsafe``, not one per request: 32 answers cost one wake-up. A
:class:`Receiver` (a transport that answers from any thread: the native edge) takes every
answer of its requests in the batch in one call, on the worker's thread, with the tokens it
queued them with: no future, no event loop.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence
from concurrent.futures import Future
from typing import Any, Protocol

__all__ = ["Receiver", "Waiting", "deliver"]

logger = logging.getLogger(__name__)


class Receiver(Protocol):
    """Takes the answers of the requests that wait on it, a batch's at once.

    Called on the compute worker that ran them; it must be quick and must not raise (what it
    raises is logged, and its requests count as answered).
    """

    def receive(
        self,
        tokens: Sequence[object],
        results: Sequence[object],
        errors: Sequence[BaseException | None] | None,
    ) -> None:
        """Each token's result, or else its error (``errors`` None: none has one)."""
        ...


class Waiting(Protocol):
    """A request waiting for its answer: its future, and the loop that future belongs to."""

    @property
    def future(self) -> Future[Any] | asyncio.Future[Any] | object:
        """Where its answer goes: a future, or its :class:`Receiver`'s token."""

    @property
    def loop(self) -> asyncio.AbstractEventLoop | Receiver | None:
        """The loop of its asyncio future or the receiver of its token; None: a thread's."""


def deliver(
    waiting: Sequence[Waiting],
    results: Sequence[object] | None,
    errors: Sequence[BaseException | None] | None,
) -> None:
    """Give each waiting request its result, or else its error, on the right thread.

    ``results`` None means every request has an error; ``errors`` None means none has. A
    request whose caller cancelled it meanwhile is skipped, and so are the requests of an
    event loop that has closed (their answers are dropped, logged at debug level). The
    requests of a :class:`Receiver` are given to it at once, on this thread.
    """
    if results is None:
        results = [None] * len(waiting)  # errors has them all
    loop = waiting[0].loop
    if loop is not None and all(request.loop is loop for request in waiting):
        # The usual case: every caller awaits on one event loop.
        futures = [request.future for request in waiting]
        _settle_on(loop, futures, results, errors)
        return
    by_loop: dict[asyncio.AbstractEventLoop | Receiver, tuple[list[Any], list[object], list[Any]]]
    by_loop = {}
    for index, request in enumerate(waiting):
        error = None if errors is None else errors[index]
        if request.loop is None:
            _settle(request.future, results[index], error)
        else:
            futures, loop_results, loop_errors = by_loop.setdefault(request.loop, ([], [], []))
            futures.append(request.future)
            loop_results.append(results[index])
            loop_errors.append(error)
    for loop, (futures, loop_results, loop_errors) in by_loop.items():
        _settle_on(loop, futures, loop_results, loop_errors)


def _settle_on(
    loop: asyncio.AbstractEventLoop | Receiver,
    futures: list[Any],
    results: Sequence[object],
    errors: Sequence[BaseException | None] | None,
) -> None:
    """Hand ``futures``' answers to ``loop``; drop them if it has closed meanwhile."""
    if not isinstance(loop, asyncio.AbstractEventLoop):
        try:
            loop.receive(futures, results, errors)
        except Exception:
            # A receiver's fault must not kill the worker or the other deliveries.
            logger.exception("corral: a receiver of %d answer(s) failed", len(futures))
        return
    try:
        loop.call_soon_threadsafe(_settle_all, futures, results, errors)
    except RuntimeError:
        if not loop.is_closed():
            raise
        # Safe to drop: a closed loop never runs again, so no one can await these futures,
        # and their admissions have ended already. Raising here would kill the compute
        # worker and leave the other loops' requests of this delivery unanswered.
        logger.debug(
            "corral: dropped %d answer(s) for an event loop that closed first", len(futures)
        )


def _settle_all(
    futures: list[Any], results: Sequence[object], errors: Sequence[BaseException | None] | None
) -> None:
    """On the event loop: settle each future that its caller has not cancelled meanwhile."""
    if errors is None:
        for future, result in zip(futures, results, strict=True):
            if not future.done():
                future.set_result(result)
        return
    for future, result, error in zip(futures, results, errors, strict=True):
        if future.done():
            continue
        if error is not None:
            future.set_exception(error)
        else:
            future.set_result(result)


def _settle(future: Any, result: object, error: BaseException | None) -> None:
    # A thread's future: its caller may have cancelled it only before the run began, and a
    # cancelled request never reaches a delivery.
    if error is not None:
        future.set_exception(error)
    else:
        future.set_result(result)
