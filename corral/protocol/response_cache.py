"""ResponseCache: answers kept by the request that asked them, bounded in bytes (Triton's).

Triton's response cache (``--cache-config local,size=N``, a model's ``response_cache {
enable: true }``): a request whose model enables it is first looked up by what it asks, and
one found is answered at once, without a run; one not found runs, and its answer is kept for
the next. Only successful answers are kept. The cache is one for the server, shared by every
model, and holds at most ``size_bytes`` of answers: the least recently used go first.

**The key** is what makes the answer, and nothing else: the model's name, the version that
answers and the copy of it (:attr:`HostLease.generation <corral.HostLease>`: a reload builds a
new copy of the same version number, and a load after an unload another), and a digest of the
request: each input's name, dtype, shape and bytes (in name order: the model reads them by
name), then the outputs its answer carries, in order, each with its class count (the
classification extension), and those it names as omitted (a request naming no output is
answered with every tensor output, so it shares its key with one naming them all in the
model's order). What only says how the answer travels is left out: the request's id and
timeout, binary flags, shared-memory regions (an answer found is written to the request's
own regions, as Triton writes a cached answer). Triton hashes the name, version and input
bytes only, into 64 bits, and documents the collision risk; here the digest is BLAKE2b of
256 bits over an encoding in which every field carries its length, so two requests that
differ anywhere have different encodings, and two different encodings share a digest with
probability about 2**-128 even among 2**64 requests: the keys are compared, not the
requests themselves, whose inputs the cache would otherwise have to hold too.

**Invalidation**: an answer is reachable only through the copy that computed it, so no other
copy (another version, a reload, a load after an unload) is ever answered with it; when the
Host tells of a change of a model (a load, an eviction, an unload, a reload), the data plane
also drops the answers of its copies no longer in service, so that their bytes go at once.

**Counts**, per model version for the cache's life, as Triton's statistics and metrics count
them: a hit is a request answered from the cache, its time the digest's and the lookup's; a
miss is a request that ran and whose answer was then offered to the cache, its time the
lookup's and the insertion's. A request that fails is neither.

Example::

    cache = ResponseCache(64 * 2**20)
    key = cache_key("fraud", 2, lease.generation, feed, (("Y", 0),))
    found = cache.lookup(key, started_ns)      # None: run it, then
    cache.insert(key, outputs, (), lookup_ns=...)
"""

from __future__ import annotations

import dataclasses
import hashlib
import logging
import struct
import threading
import time
from collections import OrderedDict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple

import numpy as np
import numpy.typing as npt

from corral.protocol.types import InferOutput

__all__ = [
    "CacheCounts",
    "CacheKey",
    "CachedAnswer",
    "ResponseCache",
    "ResponseCacheStats",
    "cache_key",
]

logger = logging.getLogger(__name__)

#: Bytes counted for each entry beyond its tensors' bytes: the Python objects that hold it.
ENTRY_OVERHEAD = 512

_LENGTH = struct.Struct("<Q")


class CacheKey(NamedTuple):
    """What an answer is kept under: the copy that computed it and the request's digest."""

    model: str
    version: int
    #: The copy of the version (:attr:`HostLease.generation`).
    generation: int
    #: BLAKE2b-256 of the request's inputs and the outputs it asks for (:func:`cache_key`).
    digest: bytes


@dataclass(frozen=True, slots=True)
class CachedAnswer:
    """A kept answer: the outputs as computed, and the outputs the answer names as omitted."""

    outputs: tuple[InferOutput, ...]
    omitted: tuple[str, ...]
    #: What it counts against the cache's bound.
    nbytes: int


@dataclass(frozen=True, slots=True)
class CacheCounts:
    """One model version's hits and misses, and the nanoseconds they took (Triton's)."""

    hits: int = 0
    hit_ns: int = 0
    misses: int = 0
    miss_ns: int = 0


@dataclass(frozen=True, slots=True)
class ResponseCacheStats:
    """The cache as a whole, now."""

    #: Its bound, in bytes; 0: the server has no cache.
    size_bytes: int
    #: Bytes its answers count now, and how many answers it holds.
    bytes_used: int
    entries: int
    #: Answers dropped to make room, and those dropped because their model changed.
    evictions: int
    invalidations: int


def cache_key(
    model: str,
    version: int,
    generation: int,
    inputs: Mapping[str, npt.NDArray[Any]],
    outputs: Sequence[tuple[str, int]],
    omitted: Sequence[str] = (),
) -> CacheKey:
    """The key of a request to ``model``'s copy ``generation`` of ``version``.

    ``outputs``: the outputs its answer carries, in order, each with its class count (0: the
    tensor itself); ``omitted``: those its answer names as left out (``omitted_outputs``).
    Hashes every input byte: call it outside any lock.
    """
    digest = hashlib.blake2b(digest_size=32)
    update = digest.update
    update(_LENGTH.pack(len(inputs)))
    for name in sorted(inputs):
        array = np.asarray(inputs[name])
        _field(update, name.encode())
        _field(update, array.dtype.str.encode())
        update(_LENGTH.pack(array.ndim))
        for dimension in array.shape:
            update(_LENGTH.pack(dimension))
        if array.dtype.kind == "O":
            for item in array.flat:
                _field(update, _element(item))
        else:
            update(np.ascontiguousarray(array).data)  # its bytes, as they are in memory
    update(_LENGTH.pack(len(outputs)))
    for name, classes in outputs:
        _field(update, name.encode())
        update(_LENGTH.pack(classes))
    update(_LENGTH.pack(len(omitted)))
    for name in omitted:
        _field(update, name.encode())
    return CacheKey(model, version, generation, digest.digest())


def _field(update: Any, data: bytes) -> None:
    update(_LENGTH.pack(len(data)))
    update(data)


def _element(item: object) -> bytes:
    # A BYTES element as the model reads it: bytes as they are, text as its UTF-8 (onnxruntime
    # makes both the same string), each tagged apart from any other object's repr, so that no
    # two elements a run would read differently share a key.
    if isinstance(item, bytes):
        return b"s" + item
    if isinstance(item, str):
        return b"s" + item.encode("utf-8", "surrogatepass")
    return b"o" + repr(item).encode("utf-8", "backslashreplace")


def _compact(output: InferOutput) -> InferOutput:
    # ``output`` holding no more memory than its own bytes: a view of a larger array (a
    # request's rows of a batch's outputs) is copied, so that the bytes counted are those held.
    root = output.data
    while isinstance(root.base, np.ndarray):
        root = root.base
    if root is output.data or root.nbytes <= output.data.nbytes:
        return output
    return dataclasses.replace(output, data=output.data.copy())


def answer_bytes(outputs: Sequence[InferOutput]) -> int:
    """What ``outputs`` count against a cache's bound: their tensors' bytes and overhead."""
    total = ENTRY_OVERHEAD
    for output in outputs:
        total += len(output.name) + output.data.nbytes
        if output.data.dtype.kind == "O":
            total += sum(len(item) for item in output.data.flat if isinstance(item, bytes))
    return total


class ResponseCache:
    """The server's response cache, at most ``size_bytes`` of answers; safe from any thread.

    ``size_bytes`` 0 is a server without a cache: nothing is kept, and a model that enables
    the cache is named once in the log (:meth:`note_unheeded`), as Triton serves it: without.
    """

    def __init__(self, size_bytes: int = 0) -> None:
        if isinstance(size_bytes, bool) or not isinstance(size_bytes, int) or size_bytes < 0:
            raise ValueError(f"a response cache's size must be bytes >= 0, got {size_bytes!r}")
        self._size_bytes = size_bytes
        # Guards the books: _entries (least recently used first), _by_model (the same keys by
        # model, so that a model's change does not scan the whole cache) and _bytes_used, the counts
        # per version, evictions, invalidations and the models named as unheeded. Held for
        # bookkeeping only: the digests are computed, and answers measured, outside it.
        self._books_lock = threading.Lock()
        self._entries: OrderedDict[CacheKey, CachedAnswer] = OrderedDict()
        self._by_model: dict[str, set[CacheKey]] = {}
        self._bytes_used = 0
        self._counts: dict[tuple[str, int], list[int]] = {}
        self._evictions = 0
        self._invalidations = 0
        self._unheeded: set[str] = set()

    @property
    def size_bytes(self) -> int:
        """Its bound in bytes; 0 when the server has no cache."""
        return self._size_bytes

    def lookup(self, key: CacheKey, started_ns: int) -> CachedAnswer | None:
        """The answer kept under ``key``, counted a hit since ``started_ns``; or None.

        ``started_ns``: when the request's lookup began (``time.perf_counter_ns()``, before
        its digest), so that a hit's time is the digest's and the lookup's. A miss is counted
        only when its answer is offered (:meth:`insert`).
        """
        with self._books_lock:
            found = self._entries.get(key)
            if found is None:
                return None
            self._entries.move_to_end(key)
            counts = self._counts_of(key)
            counts[0] += 1
            counts[1] += time.perf_counter_ns() - started_ns
        return found

    def insert(
        self,
        key: CacheKey,
        outputs: tuple[InferOutput, ...],
        omitted: tuple[str, ...] = (),
        *,
        lookup_ns: int,
    ) -> bool:
        """Keep a computed answer under ``key``, counted a miss; True if it is kept.

        ``lookup_ns``: what its lookup took; the miss's time is that and this insertion's.
        The least recently used answers make room; an answer larger than the whole cache is
        not kept. An answer already kept under ``key`` (two requests ran at once) stays. An
        output that is a view of a larger array (its rows of a batch's run) is kept as a copy.
        """
        started = time.perf_counter_ns()
        outputs = tuple([_compact(output) for output in outputs])
        nbytes = answer_bytes(outputs)
        answer = CachedAnswer(outputs, omitted, nbytes)
        with self._books_lock:
            kept = nbytes <= self._size_bytes
            if kept and key not in self._entries:
                while self._bytes_used + nbytes > self._size_bytes:
                    oldest, _ = next(iter(self._entries.items()))
                    self._forget_locked(oldest)
                    self._evictions += 1
                self._entries[key] = answer
                self._by_model.setdefault(key.model, set()).add(key)
                self._bytes_used += nbytes
            counts = self._counts_of(key)
            counts[2] += 1
            counts[3] += lookup_ns + time.perf_counter_ns() - started
        return kept

    def drop_stale(self, model: str, serving: Mapping[int, int]) -> None:
        """Drop the answers of ``model``'s copies not in ``serving`` (version: generation).

        Called when the Host tells of a change of the model (a load, an eviction, an unload, a
        reload), with the copies in service after it. No new copy could reach the answers of
        another (the key holds the copy): this gives their bytes back at once.
        """
        with self._books_lock:
            stale = [
                key
                for key in self._by_model.get(model, ())
                if serving.get(key.version) != key.generation
            ]
            for key in stale:
                self._forget_locked(key)
            self._invalidations += len(stale)

    def note_unheeded(self, model: str) -> None:
        """Log, once per model, that ``model`` enables the cache on a server without one."""
        with self._books_lock:
            if model in self._unheeded:
                return
            self._unheeded.add(model)
        logger.warning(
            "corral: model %r enables the response cache (response_cache), but the server has "
            "none: its answers are not cached; start corral serve with --cache-config "
            "local,size=<bytes> to cache them",
            model,
        )

    def counts(self) -> dict[tuple[str, int], CacheCounts]:
        """Each model version's hits and misses so far, for the versions counted at all."""
        with self._books_lock:
            copied = [(key, tuple(counts)) for key, counts in self._counts.items()]
        return {key: CacheCounts(*counts) for key, counts in copied}

    def stats(self) -> ResponseCacheStats:
        """Its bound, what it holds now, and what it dropped."""
        with self._books_lock:
            return ResponseCacheStats(
                self._size_bytes,
                self._bytes_used,
                len(self._entries),
                self._evictions,
                self._invalidations,
            )

    def _forget_locked(self, key: CacheKey) -> None:
        # Under _books_lock: drop one answer from both maps and its bytes from the count.
        self._bytes_used -= self._entries.pop(key).nbytes
        keys = self._by_model[key.model]
        keys.discard(key)
        if not keys:
            del self._by_model[key.model]

    def _counts_of(self, key: CacheKey) -> list[int]:
        # Under _books_lock: [hits, hit ns, misses, miss ns] of the key's version.
        version = (key.model, key.version)
        counts = self._counts.get(version)
        if counts is None:
            counts = self._counts[version] = [0, 0, 0, 0]
        return counts
