"""Device lanes: one run at a time on a device, across every session that runs there.

Some providers crash when runs on *different* sessions overlap on one device (DirectML since
onnxruntime 1.18, #20713; WebGPU, #32561): a per-session policy cannot help, since no session
knows of the others. A :class:`DeviceLane` is the one turn a device has, shared by every
Session of the process that runs on it, whichever Runtime or Host it belongs to; a run takes
it after its onnxruntime session and gives it back when onnxruntime returns.

Lanes are made on first use and kept for the life of the process: there is one per
(provider, device id) asked for, a handful at most.
"""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Sequence
from typing import Any

__all__ = ["DeviceKey", "DeviceLane", "device_lane", "run_on_lanes"]

#: A device as corral tells devices apart: the provider's name and the device id its
#: options give (0 when they give none).
DeviceKey = tuple[str, int]

# Guards _lanes: every lane made so far, by device.
_LANES_LOCK = threading.Lock()
_lanes: dict[DeviceKey, DeviceLane] = {}


class DeviceLane:
    """One device's turn: held by one run at a time, handed to waiting runs oldest first.

    First come, first served, as a session's ``exclusive`` turn is: a plain lock lets the
    thread that gives it back take it again, ahead of runs that waited.
    """

    def __init__(self, key: DeviceKey) -> None:
        self.key = key
        # Guards _busy and _waiting; held for bookkeeping only, never across a run.
        self._turn_lock = threading.Lock()
        self._busy = False
        # Runs waiting for the device, oldest first: each on its own held lock, which the
        # run ahead releases to hand the device over.
        self._waiting: deque[threading.Lock] = deque()

    def __repr__(self) -> str:
        return f"<corral.DeviceLane {self.key[0]}:{self.key[1]}>"

    @property
    def busy(self) -> bool:
        """Whether a run holds the device now."""
        with self._turn_lock:
            return self._busy

    @property
    def waiting(self) -> int:
        """Runs waiting for the device now."""
        with self._turn_lock:
            return len(self._waiting)

    def acquire(self) -> None:
        """Wait for the device: no longer than the runs ahead of this one on it."""
        with self._turn_lock:
            if not self._busy:
                self._busy = True
                return
            turn = threading.Lock()
            turn.acquire()
            self._waiting.append(turn)
        try:
            turn.acquire()
        except BaseException:
            # Interrupted while waiting (KeyboardInterrupt on the main thread): leave the line,
            # or pass on the device if the run ahead had already handed it over.
            with self._turn_lock:
                handed = turn not in self._waiting
                if not handed:
                    self._waiting.remove(turn)
            if handed:
                self.release()
            raise

    def release(self) -> None:
        """Give the device to the oldest waiting run, else leave it free."""
        with self._turn_lock:
            if self._waiting:
                self._waiting.popleft().release()
            else:
                self._busy = False


def device_lane(key: DeviceKey) -> DeviceLane:
    """The process's one lane for ``key``, made on first use."""
    with _LANES_LOCK:
        lane = _lanes.get(key)
        if lane is None:
            lane = _lanes[key] = DeviceLane(key)
        return lane


def run_on_lanes(
    lanes: Sequence[DeviceLane], replica: Any, names: Any, feed: Any, options: Any
) -> Any:
    """Run ``replica`` holding every lane of ``lanes`` (in their given order, always sorted).

    A session on two such devices takes both, in the one order every session uses, so that
    two runs never each hold one and wait for the other.
    """
    taken: list[DeviceLane] = []
    try:
        for lane in lanes:
            lane.acquire()
            taken.append(lane)
        return replica.run(names, feed, options)
    finally:
        for lane in reversed(taken):
            lane.release()
