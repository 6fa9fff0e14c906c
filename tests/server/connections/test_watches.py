"""HeadWatch and BodyWatch alone: a connection's head bounds and clocks on a loop the test drives.

The loop here is a fake one whose time and timers the test moves by hand, so each rule is
seen to the byte and to the second without a socket or a sleep; the same rules over real
sockets are in tests/reliability/test_connections.py.
"""

from __future__ import annotations

from collections.abc import Callable

from corral.server.connections.body import BodyWatch
from corral.server.connections.contract import ConnectionLimits
from corral.server.connections.head import HeadWatch

LIMITS = ConnectionLimits(
    max_url_bytes=20,
    max_header_bytes=60,
    header_timeout_s=5.0,
    idle_timeout_s=30.0,
    max_connections=10,
    body_timeout_s=3.0,
)


class Timer:
    def __init__(self, loop: FakeLoop, when: float, callback: Callable[[], None]) -> None:
        self.loop, self.when, self.callback, self.cancelled = loop, when, callback, False

    def cancel(self) -> None:
        self.cancelled = True


class FakeLoop:
    """call_later and time, moved by the test: :meth:`advance` fires what is due, in order."""

    def __init__(self) -> None:
        self.now = 100.0
        self.timers: list[Timer] = []

    def time(self) -> float:
        return self.now

    def call_later(self, delay: float, callback: Callable[[], None]) -> Timer:
        timer = Timer(self, self.now + delay, callback)
        self.timers.append(timer)
        return timer

    def armed(self) -> list[Timer]:
        return [t for t in self.timers if not t.cancelled]

    def advance(self, seconds: float) -> None:
        end = self.now + seconds
        while due := sorted((t for t in self.armed() if t.when <= end), key=lambda t: t.when):
            timer = due[0]
            self.now = timer.when
            timer.cancelled = True  # fired: a handle is spent once called
            timer.callback()
        self.now = end


def head_watch() -> tuple[HeadWatch, FakeLoop, list[str]]:
    loop = FakeLoop()
    told: list[str] = []
    watch = HeadWatch(LIMITS, loop, lambda: told.append("408"))
    return watch, loop, told


def test_a_head_is_refused_by_size_as_its_bytes_arrive():
    watch, _, _ = head_watch()
    assert not watch.in_progress()
    watch.received(10)
    assert watch.in_progress()
    assert watch.refusal_so_far(b"/v2") is None
    assert watch.refusal_so_far(b"/" * 21)[0] == 414
    watch.received(51)  # 61 bytes of head so far, past 60
    status, text = watch.refusal_so_far(b"/v2")
    assert status == 431
    assert text == "the request's headers are longer than 60 bytes (max_header_bytes)"


def test_a_complete_head_is_measured_exactly_when_its_reads_carried_more():
    watch, _, _ = head_watch()
    watch.received(100)  # a head and the start of a body, in one read
    small = [(b"host", b"x")]
    assert watch.complete(b"/v2/models/m/infer", small) is None  # 18 + 9 bytes: within
    assert not watch.awaiting
    watch.next()
    # A pipelined head: nothing counted for it, so it is measured.
    big = [(b"x-long", b"y" * 50)]  # 3 + 6 + 50 + 4 bytes
    assert watch.complete(b"/v2", big)[0] == 431


def test_the_clock_fires_once_from_the_first_byte_and_not_after_the_head():
    watch, loop, told = head_watch()
    watch.begin()
    watch.arm()
    watch.arm()  # armed already: one timer
    assert len(loop.armed()) == 1
    loop.advance(4.9)
    assert told == []
    loop.advance(0.2)
    assert told == ["408"]
    assert "within 5 s (header_timeout_s)" in watch.timeout_text
    # Once the head is complete, a timer that was armed says nothing.
    watch2, loop2, told2 = head_watch()
    watch2.begin()
    watch2.arm()
    watch2.complete(b"/", [])
    loop2.advance(10)
    assert told2 == []
    assert loop2.armed() == []


# More than a window's worth at LIMITS' rate (1024 bytes/s over 3 s): the rate is kept.
RATE_KEPT = 4096


def body_watch(
    paused: list[bool], limits: ConnectionLimits = LIMITS
) -> tuple[BodyWatch, FakeLoop, list[str]]:
    loop = FakeLoop()
    told: list[str] = []
    watch = BodyWatch(limits, loop, lambda: paused[0], lambda: told.append("408"))
    return watch, loop, told


def test_a_body_times_out_only_after_its_last_byte_plus_the_timeout():
    watch, loop, told = body_watch([False])
    watch.received(RATE_KEPT)  # no body pending: nothing armed
    assert loop.armed() == []
    watch.start()
    watch.received(RATE_KEPT)
    loop.advance(2.0)
    watch.received(RATE_KEPT)  # a byte at 2 s: the clock runs from here, one timer still
    assert len(loop.armed()) == 1
    loop.advance(2.0)  # the first timer fires at 3 s, sees 1 s of quiet, waits 2 more
    assert told == []
    loop.advance(1.1)
    assert told == ["408"]
    assert watch.timeout_text.endswith("no byte for 3 s (body_timeout_s)")


def test_a_body_the_server_stopped_reading_is_not_the_clients_silence():
    paused = [True]
    watch, loop, told = body_watch(paused)
    watch.start()
    watch.received(RATE_KEPT)
    loop.advance(30)  # paused all along: the clock keeps starting again
    assert told == []
    paused[0] = False
    loop.advance(3.1)
    assert told == ["408"]


def test_a_finished_body_stops_its_clock():
    watch, loop, told = body_watch([False])
    watch.start()
    watch.received(RATE_KEPT)
    watch.finish()
    assert not watch.pending
    loop.advance(10)
    assert told == []


def trickle(watch: BodyWatch, loop: FakeLoop, seconds: float, told: list[str]) -> float:
    """A byte every 0.2 s for ``seconds``, or until the watch cuts it; the time it ran."""
    ran = 0.0
    while ran < seconds and not told:
        loop.advance(0.2)
        ran += 0.2
        if not told:
            watch.received(1)
    return ran


def test_a_trickled_body_is_cut_at_the_end_of_its_first_window():
    # Never silent for 3 s, but 5 bytes/s where 1024 must come: cut as the window closes.
    watch, loop, told = body_watch([False])
    watch.start()
    watch.received(1)
    ran = trickle(watch, loop, 60, told)
    assert told == ["408"]
    assert 2.9 < ran < 3.3
    assert watch.timeout_text == (
        "the request's body arrived too slowly: 15 bytes in 3 s (body_timeout_s), under "
        "the 1024 bytes/s it must keep (body_min_rate_bytes_s)"
    )


def test_a_body_that_slows_down_after_a_fast_start_is_cut_by_its_next_window():
    # 1 MiB at once (what it holds of the budget), then a byte every 0.2 s: the first window
    # is kept, the second is not, so what it holds is given back within two timeouts.
    watch, loop, told = body_watch([False])
    watch.start()
    watch.received(1 << 20)
    ran = trickle(watch, loop, 60, told)
    assert told == ["408"]
    assert 5.9 < ran < 6.3
    assert "too slowly" in watch.timeout_text


def test_a_body_that_keeps_the_rate_is_never_cut():
    watch, loop, told = body_watch([False])
    watch.start()
    for _ in range(30):  # 1100 bytes a second for 30 s: above 1024 in every window
        watch.received(1100)
        loop.advance(1.0)
    assert told == []
    assert len(loop.armed()) == 1


def test_a_rate_of_zero_cuts_only_silence():
    limits = ConnectionLimits(8192, 65536, 5.0, 30.0, 10, 3.0, body_min_rate_bytes_s=0)
    watch, loop, told = body_watch([False], limits)
    watch.start()
    watch.received(1)
    trickle(watch, loop, 30, told)
    assert told == []
    loop.advance(3.1)
    assert told == ["408"]
    assert "no byte for 3 s" in watch.timeout_text


def test_a_body_the_server_stopped_reading_is_not_slow_either():
    paused = [True]
    watch, loop, told = body_watch(paused)
    watch.start()
    watch.received(1)
    trickle(watch, loop, 30, told)  # paused: each window starts again
    assert told == []
    paused[0] = False
    trickle(watch, loop, 30, told)
    assert told == ["408"]
    assert "too slowly" in watch.timeout_text
