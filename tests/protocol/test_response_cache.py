"""ResponseCache alone: its key, its bound in bytes, its counts and its lock."""

from __future__ import annotations

import asyncio
import logging
import os
import threading
import time
from pathlib import Path

import numpy as np
import pytest

import corral
from corral import Host
from corral.protocol import DataPlane, InferInput, InferRequest, RequestedOutput
from corral.protocol.dataplane import GroupedRequest
from corral.protocol.response_cache import (
    ENTRY_OVERHEAD,
    CacheCounts,
    CacheKey,
    ResponseCache,
    answer_bytes,
    cache_key,
)
from corral.protocol.types import InferOutput, InferResponse
from corral.testing import build_mlp
from tests.helpers import add_model, reference_run

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
        (lambda: cache_key("m", 1, 7, {"X": X}, (), ("Z",)), "the outputs omitted"),
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


def test_a_bytes_element_keys_as_the_model_reads_it():
    def key(*items: object):
        return cache_key("m", 1, 1, {"T": np.array(items, dtype=object)}, [("Y", 0)])

    # Text and its UTF-8 bytes are one string to onnxruntime: one key.
    assert key("caf\u00e9") == key("caf\u00e9".encode())
    # No element takes another's key by spelling its tag (the old key read text as
    # b"\x00" + repr(text), which a bytes element could spell).
    assert key("abc") != key(b"\x00'abc'")
    assert key(3) != key(b"3") == key("3")


def test_a_hit_returns_what_was_kept_and_is_counted_with_its_time():
    cache = ResponseCache(10_000)
    k = key({"X": X})
    started = time.perf_counter_ns()
    assert cache.lookup(k, started) is None
    answer = outputs(4)
    assert cache.insert(k, answer, ("Z",), lookup_ns=5)
    found = cache.lookup(k, started)
    assert found is not None
    assert found.outputs == answer
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


def test_a_view_of_a_batchs_outputs_is_kept_as_a_copy_of_its_own_rows():
    # A request's rows of a batched run are a view of the batch's array: kept as is, the
    # cache would hold the whole batch while counting the rows only.
    batch = np.zeros((64, 100), np.float32)
    rows = batch[8:9]
    owned = np.zeros((1, 100), np.float32)
    cache = ResponseCache(100_000)
    cache.insert(key({"X": X}), (InferOutput("Y", "FP32", rows.shape, rows),), lookup_ns=0)
    cache.insert(key({"X": X + 1}), (InferOutput("Y", "FP32", owned.shape, owned),), lookup_ns=0)
    kept = cache.lookup(key({"X": X}), 0)
    assert kept is not None
    assert kept.outputs[0].data.base is None
    np.testing.assert_array_equal(kept.outputs[0].data, rows)
    other = cache.lookup(key({"X": X + 1}), 0)
    assert other is not None
    assert other.outputs[0].data is owned  # nothing more held: not copied
    assert cache.stats().bytes_used == 2 * (ENTRY_OVERHEAD + 1 + 400)


def test_an_answer_offered_twice_is_kept_once():
    cache = ResponseCache(10_000)
    k = key({"X": X})
    first = outputs(4)
    cache.insert(k, first, lookup_ns=0)
    cache.insert(k, outputs(4), lookup_ns=0)
    found = cache.lookup(k, 0)
    assert found is not None
    assert found.outputs == first
    assert cache.stats().entries == 1
    assert cache.counts()[("m", 1)].misses == 2  # both ran


def test_dropping_stale_answers_gives_their_bytes_back_and_keeps_those_served():
    cache = ResponseCache(100_000)
    served = cache_key("m", 1, 5, {"X": X}, ())
    replaced = cache_key("m", 2, 3, {"X": X}, ())  # version 2's copy 3, now copy 4
    unloaded = cache_key("m", 3, 6, {"X": X}, ())
    theirs = cache_key("n", 2, 3, {"X": X}, ())
    for key_ in (served, replaced, unloaded, theirs):
        cache.insert(key_, outputs(4), lookup_ns=0)
    cache.drop_stale("m", {1: 5, 2: 4})
    assert cache.lookup(served, 0) is not None
    assert cache.lookup(theirs, 0) is not None
    assert cache.lookup(replaced, 0) is None
    assert cache.lookup(unloaded, 0) is None
    stats = cache.stats()
    assert (stats.entries, stats.invalidations) == (2, 2)
    assert stats.bytes_used == 2 * answer_bytes(outputs(4))


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
                    cache.drop_stale("m", {})
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


# -- the data plane with a cache: both of its ways in ------------------------------------------

CACHED = "response_cache = true\n"


def request(x: np.ndarray = X, **options: object) -> InferRequest:
    return InferRequest(
        inputs=(InferInput("X", "FP32", x.shape, x),),
        **options,  # type: ignore[arg-type]
    )


def runs(host: Host, name: str = "m", version: int = 1) -> int:
    return host.queue_stats()[(name, version)].runs


def infer(plane: DataPlane, name: str = "m", version: str | None = None, **options: object):
    return asyncio.run(plane.infer(name, version, request(**options)))  # type: ignore[arg-type]


@pytest.fixture
def cached_repo(tmp_path: Path) -> Path:
    """ "m" (mlp, seed 1) with the cache enabled; "plain" (mlp, seed 1) without."""
    add_model(tmp_path, "m", build_mlp(seed=1), toml=CACHED)
    add_model(tmp_path, "plain", build_mlp(seed=1))
    return tmp_path


def test_a_repeated_request_is_answered_from_the_cache_without_a_run(cached_repo: Path):
    with Host(cached_repo) as host:
        plane = DataPlane(host, response_cache=ResponseCache(1 << 20))
        first = infer(plane, id="a")
        before = runs(host)
        again = infer(plane, id="b")
        assert runs(host) == before  # not run
        assert (again.id, again.model_version) == ("b", "1")
        np.testing.assert_array_equal(again.outputs[0].data, first.outputs[0].data)
        np.testing.assert_array_equal(
            again.outputs[0].data, reference_run(build_mlp(seed=1), {"X": X})[0]
        )
        other = infer(plane, x=X + 1)  # a miss: run
        assert runs(host) == before + 1
        assert not np.array_equal(other.outputs[0].data, first.outputs[0].data)
        (row,) = asyncio.run(plane.model_statistics("m"))
        assert (row.success.count, row.inference_count, row.execution_count) == (3, 2, 2)
        assert (row.cache_hit.count, row.cache_miss.count) == (1, 2)
        assert row.cache_hit.ns > 0
        assert row.cache_miss.ns > 0


def test_a_model_that_does_not_enable_it_is_never_cached(cached_repo: Path):
    with Host(cached_repo) as host:
        plane = DataPlane(host, response_cache=ResponseCache(1 << 20))
        infer(plane, "plain")
        before = runs(host, "plain")
        infer(plane, "plain")
        assert runs(host, "plain") == before + 1
        assert plane.response_cache.stats().entries == 0
        (row,) = asyncio.run(plane.model_statistics("plain"))
        assert (row.cache_hit.count, row.cache_miss.count, row.inference_count) == (0, 0, 2)


def test_a_server_without_a_cache_runs_every_request_and_says_so_once(cached_repo: Path, caplog):
    with Host(cached_repo) as host, caplog.at_level(logging.WARNING):
        plane = DataPlane(host)
        infer(plane)
        before = runs(host)
        infer(plane)
        assert runs(host) == before + 1
    said = [r.getMessage() for r in caplog.records if "response cache" in r.getMessage()]
    assert len(said) == 1, said


def test_two_versions_never_share_an_answer(tmp_path: Path):
    add_model(tmp_path, "m", build_mlp(seed=1), toml=CACHED + 'version_policy = "all"\n')
    add_model(tmp_path, "m", build_mlp(seed=2), version=2)
    with Host(tmp_path) as host:
        plane = DataPlane(host, response_cache=ResponseCache(1 << 20))
        one = infer(plane, version="1")
        two = infer(plane, version="2")
        assert (one.model_version, two.model_version) == ("1", "2")
        np.testing.assert_array_equal(
            two.outputs[0].data, reference_run(build_mlp(seed=2), {"X": X})[0]
        )
        assert not np.array_equal(one.outputs[0].data, two.outputs[0].data)
        assert infer(plane, version="1").outputs[0].data is one.outputs[0].data  # each its own
        assert infer(plane).outputs[0].data is two.outputs[0].data  # latest: 2


def test_a_reload_never_serves_the_old_copys_answer(tmp_path: Path):
    path = add_model(tmp_path, "m", build_mlp(seed=1), toml=CACHED)
    with Host(tmp_path) as host:
        plane = DataPlane(host, response_cache=ResponseCache(1 << 20))
        old = infer(plane)
        path.write_bytes(build_mlp(seed=2))
        stat = path.stat()
        os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns + 10**9))
        host.refresh()  # the same version number, a new copy
        assert plane.response_cache.stats().entries == 0  # dropped as the model changed
        new = infer(plane)
        expected = reference_run(build_mlp(seed=2), {"X": X})[0]
        np.testing.assert_array_equal(new.outputs[0].data, expected)
        assert not np.array_equal(new.outputs[0].data, old.outputs[0].data)
        host.unload("m")
        assert plane.response_cache.stats().entries == 0


def test_a_late_answer_of_a_replaced_copy_is_never_served(tmp_path: Path):
    # An answer offered after its copy was replaced (its request ran across the reload)
    # stays under that copy's key: the new copy's requests cannot reach it.
    path = add_model(tmp_path, "m", build_mlp(seed=1), toml=CACHED)
    with Host(tmp_path) as host:
        cache = ResponseCache(1 << 20)
        plane = DataPlane(host, response_cache=cache)
        with host.acquire("m") as lease:
            stale = cache_key("m", 1, lease.generation, {"X": X}, ())
        path.write_bytes(build_mlp(seed=2))
        stat = path.stat()
        os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns + 10**9))
        host.refresh()
        cache.insert(stale, outputs(3), lookup_ns=0)
        new = infer(plane)
        expected = reference_run(build_mlp(seed=2), {"X": X})[0]
        np.testing.assert_array_equal(new.outputs[0].data, expected)


def test_the_outputs_asked_for_and_their_classes_are_in_the_key(cached_repo: Path):
    with Host(cached_repo) as host:
        plane = DataPlane(host, response_cache=ResponseCache(1 << 20))
        every = infer(plane)
        before = runs(host)
        # Naming the model's one output is the answer naming none gets: the same key.
        named = infer(plane, outputs=(RequestedOutput("Y"),))
        assert runs(host) == before
        assert named.outputs[0].data is every.outputs[0].data
        classes = infer(plane, outputs=(RequestedOutput("Y", parameters={"classification": 1}),))
        assert runs(host) == before + 1
        assert named.outputs[0].datatype == "FP32"
        assert classes.outputs[0].datatype == "BYTES"
        again = infer(plane, outputs=(RequestedOutput("Y", parameters={"classification": 1}),))
        assert runs(host) == before + 1
        assert list(again.outputs[0].data.flat) == list(classes.outputs[0].data.flat)
        # How the answer travels is not in the key: binary flags, the timeout, the id.
        binary = infer(
            plane,
            outputs=(RequestedOutput("Y", binary_data=True),),
            parameters={"timeout": 30_000_000, "binary_data_output": True},
            id="x",
        )
        assert runs(host) == before + 1
        assert binary.outputs[0].data is named.outputs[0].data


def test_the_least_recently_used_answer_goes_at_the_byte_bound(cached_repo: Path):
    with Host(cached_repo) as host:
        y = np.zeros((len(X), 1), np.float32)
        one = answer_bytes((InferOutput("Y", "FP32", y.shape, y),))
        plane = DataPlane(host, response_cache=ResponseCache(2 * one))
        for shift in range(3):
            infer(plane, x=X + shift)
        stats = plane.response_cache.stats()
        assert (stats.entries, stats.evictions, stats.bytes_used) == (2, 1, 2 * one)
        before = runs(host)
        infer(plane, x=X + 2)  # kept
        assert runs(host) == before
        infer(plane, x=X)  # evicted: run again
        assert runs(host) == before + 1


def test_a_failed_request_is_not_cached(cached_repo: Path):
    with Host(cached_repo) as host:
        plane = DataPlane(host, response_cache=ResponseCache(1 << 20))
        with pytest.raises(corral.InvalidInput):
            infer(plane, x=np.ones((1, 3), np.float32))
        assert plane.response_cache.stats().entries == 0
        assert plane.response_cache.counts() == {}


def grouped(rows: np.ndarray, token: int = 0) -> GroupedRequest:
    return GroupedRequest({"X": rows}, (), f"g{token}", None, time.perf_counter_ns(), token)


def test_grouped_requests_hit_and_fill_the_same_cache(cached_repo: Path):
    # The native edge's way in: a group's hits are answered at once, its misses run and kept;
    # a request answered one way is found the other.
    with Host(cached_repo) as host:
        plane = DataPlane(host, response_cache=ResponseCache(1 << 20))
        first = infer(plane)
        answered: dict[object, InferResponse | corral.CorralError] = {}
        done = threading.Event()

        def answer(requests, outcomes) -> None:
            for req, outcome in zip(requests, outcomes, strict=True):
                answered[req.token] = outcome
            if len(answered) == 2:
                done.set()

        before = runs(host)
        assert plane.infer_group("m", None, [grouped(X, 0), grouped(X + 5, 1)], answer) == []
        assert done.wait(timeout=30)
        hit, missed = answered[0], answered[1]
        assert isinstance(hit, InferResponse)
        assert isinstance(missed, InferResponse)
        assert hit.outputs[0].data is first.outputs[0].data
        assert hit.id == "g0"
        assert runs(host) == before + 1
        # The grouped miss was kept: the general way finds it.
        assert infer(plane, x=X + 5).outputs[0].data is missed.outputs[0].data
        assert runs(host) == before + 1
        (row,) = asyncio.run(plane.model_statistics("m"))
        assert (row.cache_hit.count, row.cache_miss.count) == (2, 2)
        assert (row.success.count, row.inference_count) == (4, 2)
