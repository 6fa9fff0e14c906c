"""ControlThreads: the control plane's calls that may touch storage, off the default executor.

Readiness, metadata, statistics, the repository index, load and unload read in-memory
snapshots, but some also stat or list the repository (an unknown model's entry, the folder
listing) or wait for a load; on a mount that hangs, such a call blocks its thread for good.
Run on asyncio's default executor, a few of them would fill it, and every other call handed
there would queue behind them; its threads are also joined when the event loop closes, so
the process would never exit. Here each call gets its own daemon thread (never joined), a
bound on how long its caller waits (answered :class:`DeadlineExceeded` naming what did not
finish), and a cap on how many may be in flight at once (past it, :class:`Overloaded` at once):
a hung mount costs at most that many stuck threads, never the event loop or the data plane.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable
from concurrent.futures import Future
from typing import Any, ParamSpec, TypeVar

from corral._base import DeadlineExceeded, Overloaded

__all__ = ["CONTROL_TIMEOUT_S", "MAX_CONTROL_CALLS", "ControlThreads"]

#: Seconds a caller waits for a control-plane read (status, index, statistics, readiness).
CONTROL_TIMEOUT_S = 10.0
#: Control-plane calls in flight at once (each on its own thread); more are refused at once.
MAX_CONTROL_CALLS = 64

_Result = TypeVar("_Result")
_Params = ParamSpec("_Params")


class ControlThreads:
    """Runs blocking control-plane calls on daemon threads, bounded in number and in wait.

    Example::

        control = ControlThreads()
        models = await control.run("the repository index", 10.0, host.models)
    """

    def __init__(self, limit: int = MAX_CONTROL_CALLS) -> None:
        self._limit = limit
        # Guards _in_flight: calls started and not yet returned (hung ones included), and
        # _refused: calls refused because the limit was reached.
        self._in_flight_lock = threading.Lock()
        self._in_flight = 0
        self._refused = 0

    @property
    def in_flight(self) -> int:
        """Calls running now, including any stuck on a hung disk."""
        with self._in_flight_lock:
            return self._in_flight

    @property
    def refused(self) -> int:
        """Calls refused with :class:`Overloaded` so far, because the limit was reached."""
        with self._in_flight_lock:
            return self._refused

    async def run(
        self,
        what: str,
        timeout: float | None,
        call: Callable[_Params, _Result],
        /,
        *args: _Params.args,
        **kwargs: _Params.kwargs,
    ) -> _Result:
        """Await ``call(*args, **kwargs)`` on a daemon thread, for at most ``timeout`` seconds.

        Raises :class:`DeadlineExceeded` naming ``what`` after ``timeout`` (the call goes on
        and its result is dropped: ``call`` must release what it takes), :class:`Overloaded`
        when :data:`MAX_CONTROL_CALLS` are in flight, and whatever ``call`` raises.
        """
        with self._in_flight_lock:
            if self._in_flight >= self._limit:
                self._refused += 1
                raise Overloaded(
                    f"{self._in_flight} control-plane calls are still waiting (on the model "
                    f"repository's storage or on loads); {what} is refused: try again later"
                )
            self._in_flight += 1
        answer: Future[_Result] = Future()
        try:
            thread = threading.Thread(
                target=self._call,
                args=(answer, call, args, kwargs),
                name="corral-control",
                daemon=True,
            )
            thread.start()
        except BaseException:
            self._ended()
            raise
        waiting = asyncio.wrap_future(answer)
        waiting.add_done_callback(_retrieved)  # an answer after the timeout is dropped
        try:
            return await asyncio.wait_for(asyncio.shield(waiting), timeout)
        except TimeoutError:
            raise DeadlineExceeded(
                f"{what} did not finish within {timeout}s (is the model repository's storage hung?)"
            ) from None

    def _call(
        self,
        answer: Future[_Result],
        call: Callable[..., _Result],
        args: tuple[object, ...],
        kwargs: dict[str, object],
    ) -> None:
        # The slot is given back before the answer: a caller that has its answer finds it free.
        try:
            result = call(*args, **kwargs)
        except BaseException as exc:
            self._ended()
            answer.set_exception(exc)
            if not isinstance(exc, Exception):
                raise
        else:
            self._ended()
            answer.set_result(result)

    def _ended(self) -> None:
        with self._in_flight_lock:
            self._in_flight -= 1


def _retrieved(done: asyncio.Future[Any]) -> None:
    if not done.cancelled():
        done.exception()  # marks it retrieved: asyncio would log it as never retrieved
