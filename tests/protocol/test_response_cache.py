"""ResponseCache alone: its key, its bound in bytes, its counts and its lock."""

from __future__ import annotations

import logging
import threading
import time

import numpy as np
import pytest

from corral.protocol.response_cache import (
    ENTRY_OVERHEAD,
    CacheCounts,
    CacheKey,
    ResponseCache,
    answer_bytes,
    cache_key,
)
from corral.protocol.types import InferOutput

pytestmark = pytest.mark.timeout(60)

X = np.arange(8, dtype=np.float32).reshape(2, 4)


def outputs(values: int, name: str = "Y") -> tuple[InferOutput, ...]:
    data = np.zeros(values, dtype=np.float32)
    return (InferOutput(name, "FP32", data.shape, data),)


def key(feed: dict[str, np.ndarray], named: tuple[tuple[str, int], ...] = ()) -> CacheKey:
    return cache_key("m", 1, 7, feed, named)


def test_equal_requests_have_one_key_and_input_order_does_not_matter():
    first = cache_key("m", 1, 7, {"A": X, "B": X + 1}, ())
    again = cache_key("m", 1, 7, {"B": (X + 1).copy(), "A": X.copy()}, ())
    assert first == again
    assert len(first.digest) == 32


@pytest.mark.parametrize(
    ("other", "what"),
    [
        (lambda: cache_key("other", 1, 7, {"X": X}, ()), "the model"),
        (lambda: cache_key("m", 2, 7, {"X": X}, ()), "the version"),
        (lambda: cache_key("m", 1, 8, {"X": X}, ()), "the copy (a reload)"),
        (lambda: key({"Z": X}), "an input's name"),
        (lambda: key({"X": X.astype(np.float64)}), "an input's dtype"),
        (lambda: key({"X": X.reshape(4, 2)}), "an input's shape (the same bytes)"),
        (lambda: key({"X": X + 1}), "an input's bytes"),
        (lambda: key({"X": X}, (("Y", 0),)), "the outputs asked for"),
        (lambda: key({"X": X}, (("Y", 3),)), "a class count"),
    ],
)
def test_anything_that_changes_the_answer_changes_the_key(other, what):
    assert other() != key({"X": X}), what


def test_the_order_of_outputs_asked_for_is_in_the_key():
    # The answer lists them in the order asked.
    assert key({"X": X}, (("A", 0), ("B", 0))) != key({"X": X}, (("B", 0), ("A", 0)))


def test_bytes_elements_are_delimited():
    joined = np.array([b"ab", b"c"], dtype=object)
    split = np.array([b"a", b"bc"], dtype=object)
    assert key({"S": joined}) != key({"S": split})
    assert key({"S": joined}) == key({"S": np.array([b"ab", b"c"], dtype=object)})


def test_a_hit_returns_what_was_kept_and_is_counted_with_its_time():
    cache = ResponseCache(10_000)
    k = key({"X": X})
    started = time.perf_counter_ns()
    assert cache.lookup(k, started) is None
    answer = outputs(4)
    assert cache.insert(k, answer, ("Z",), lookup_ns=5)
    found = cache.lookup(k, started)
    assert found is not None
    assert found.outputs is answer
    assert found.omitted == ("Z",)
    (counts,) = cache.counts().values()
    assert (counts.hits, counts.misses) == (1, 1)
    assert counts.hit_ns > 0
    assert counts.miss_ns >= 5
    assert cache.counts() == {("m", 1): counts}


def test_the_least_recently_used_answers_make_room_and_the_bound_holds():
    one = answer_bytes(outputs(100))
    assert one == ENTRY_OVERHEAD + 1 + 400
    cache = ResponseCache(3 * one)
    keys = [key({"X": X + i}) for i in range(4)]
    for k in keys[:3]:
        cache.insert(k, outputs(100), lookup_ns=0)
    assert cache.lookup(keys[0], 0) is not None  # now the most recently used
    cache.insert(keys[3], outputs(100), lookup_ns=0)
    assert cache.lookup(keys[1], 0) is None  # the least recently used went
    assert all(cache.lookup(k, 0) is not None for k in (keys[0], keys[2], keys[3]))
    stats = cache.stats()
    assert (stats.entries, stats.bytes_used, stats.evictions) == (3, 3 * one, 1)
    assert stats.bytes_used <= stats.size_bytes


def test_an_answer_larger_than_the_cache_is_not_kept_but_counted_a_miss():
    cache = ResponseCache(100)
    assert not cache.insert(key({"X": X}), outputs(1000), lookup_ns=0)
    assert cache.stats().entries == 0
    assert cache.counts()[("m", 1)] == CacheCounts(0, 0, 1, cache.counts()[("m", 1)].miss_ns)


def test_an_answer_offered_twice_is_kept_once():
    cache = ResponseCache(10_000)
    k = key({"X": X})
    first = outputs(4)
    cache.insert(k, first, lookup_ns=0)
    cache.insert(k, outputs(4), lookup_ns=0)
    found = cache.lookup(k, 0)
    assert found is not None
    assert found.outputs is first
    assert cache.stats().entries == 1
    assert cache.counts()[("m", 1)].misses == 2  # both ran


def test_dropping_a_model_gives_its_bytes_back_and_keeps_the_others():
    cache = ResponseCache(100_000)
    mine, theirs = cache_key("m", 1, 1, {"X": X}, ()), cache_key("n", 1, 2, {"X": X}, ())
    cache.insert(mine, outputs(4), lookup_ns=0)
    cache.insert(theirs, outputs(4), lookup_ns=0)
    assert cache.drop_model("m") == 1
    assert cache.lookup(mine, 0) is None
    assert cache.lookup(theirs, 0) is not None
    stats = cache.stats()
    assert (stats.entries, stats.bytes_used, stats.invalidations) == (
        1,
        answer_bytes(outputs(4)),
        1,
    )
    assert cache.drop_model(None) == 1
    assert cache.stats().bytes_used == 0


def test_a_model_enabling_the_cache_on_a_server_without_one_is_named_once(caplog):
    cache = ResponseCache(0)
    with caplog.at_level(logging.WARNING, logger="corral.protocol.response_cache"):
        for _ in range(3):
            cache.note_unheeded("m")
        cache.note_unheeded("n")
    said = [r.getMessage() for r in caplog.records]
    assert len(said) == 2, said
    assert "'m'" in said[0]
    assert "--cache-config local,size=" in said[0]


@pytest.mark.parametrize("size", [-1, 1.5, True, "1k"])
def test_a_size_that_is_no_byte_count_is_refused(size):
    with pytest.raises(ValueError, match="bytes >= 0"):
        ResponseCache(size)


def test_threads_inserting_and_looking_up_at_once_keep_the_books_right():
    # Eight threads at once (a barrier), over a cache that holds a quarter of their answers:
    # the bytes counted are always the entries' and never above the bound.
    one = answer_bytes(outputs(10))
    cache = ResponseCache(16 * one)
    barrier = threading.Barrier(8, timeout=30)
    errors: list[BaseException] = []

    def work(thread: int) -> None:
        try:
            barrier.wait()
            for i in range(200):
                k = cache_key("m", 1, 1, {"X": X + (thread * 1000 + i) % 64}, ())
                if cache.lookup(k, 0) is None:
                    cache.insert(k, outputs(10), lookup_ns=0)
                if i % 50 == 0:
                    cache.drop_model("m")
        except BaseException as exc:  # reported below
            errors.append(exc)

    threads = [threading.Thread(target=work, args=(n,)) for n in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=30)
    assert not errors
    assert not any(thread.is_alive() for thread in threads)
    stats = cache.stats()
    assert stats.bytes_used == stats.entries * one <= 16 * one
    counts = cache.counts()[("m", 1)]
    assert counts.hits + counts.misses == 8 * 200
