"""HostOptions: a Host's options in one frozen, validated object, each declared once.

The one place their rules live. The Host takes them as keyword arguments or as one object;
the server's settings, ``corral.ray``'s config and the command line build this same object, so
that an option means the same and is checked the same way wherever it is given. A bad value
raises :class:`InvalidOption` naming the option.

Each field is its option's one declaration (``corral._base.declare``). With the Runtime's
(:func:`edge_options`), they make the server's settings, ``corral serve``'s flags, the
``CORRAL_*`` variables, Ray's config and ``corral ray-serve``'s flags.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import os
from dataclasses import dataclass, field
from typing import TypedDict

from corral._base import Declared, InvalidOption, declared, given_by, option, parse_bytes
from corral._compute import (
    DEFAULT_INLINE_RUN_US,
    DEFAULT_MAX_BATCH_SIZE,
    DEFAULT_MODEL_LATENCY_HISTOGRAMS,
    DEFAULT_QUEUE_LIMIT,
    RuntimeOptions,
)
from corral._host.budget import Limits
from corral._host.machine_memory import find_memory_limit

__all__ = [
    "AUTO_BUDGET_FRACTION",
    "DEFAULT_FAILURE_BACKOFF_S",
    "DEFAULT_LOAD_TIMEOUT_S",
    "DEFAULT_MAX_UPLOAD_BYTES",
    "HostOptionArgs",
    "HostOptions",
    "edge_options",
    "positive_int",
]

#: Seconds a failed load is not retried: the first wait, and the cap it doubles up to.
DEFAULT_FAILURE_BACKOFF_S = (1.0, 60.0)
#: Seconds a load may take before it is marked failed (LoadTimeout) and its thread abandoned.
DEFAULT_LOAD_TIMEOUT_S = 300.0
#: Bytes the files uploaded by loads may hold together, by default: 1 GiB.
DEFAULT_MAX_UPLOAD_BYTES = 1 << 30
#: ``memory_budget="auto"``: this share of the memory the process may use (its cgroup's
#: limit, else the machine's memory). Half, because the budget counts estimates of the
#: models alone (within 0.64-1.61x of what they take: docs/host.md), and the process needs
#: room beside them for the interpreter, onnxruntime's arena, requests and a load's peak.
AUTO_BUDGET_FRACTION = 0.5


def _default_load_concurrency() -> int:
    return min(4, os.cpu_count() or 1)


def positive_int(option: str, value: object, *, optional: bool = False) -> int | None:
    """``value`` if it is a positive integer (or None when ``optional``); else InvalidOption.

    >>> positive_int("replicas", 2)
    2
    """
    if value is None and optional:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise InvalidOption(f"{option} must be a positive integer, got {value!r}", option=option)
    return value


@dataclass(frozen=True)
class HostOptions:
    """How a :class:`corral.Host` loads, keeps and queues models; checked when built.

    Example::

        options = HostOptions(memory_budget="2GiB", poll_interval_s=5)
        host = corral.Host("models/", options=options)
    """

    #: Estimated bytes the loaded models may hold: bytes, or a size like ``"2GiB"``, or
    #: ``"auto"`` (:data:`AUTO_BUDGET_FRACTION` of the cgroup's memory limit, else of the
    #: machine's memory); None (or ``"none"``): no budget. Read :attr:`budget_bytes` for the
    #: number, :attr:`budget_source` for where an automatic one came from.
    memory_budget: int | str | None = option(
        None,
        "estimated bytes the loaded models may hold: bytes, a size like 2GiB, auto (half the "
        "cgroup's memory limit, else half the machine's memory) or none",
    )
    #: Seconds between readings of the memory in use (the cgroup's working set, else the
    #: machine's) against its limit; past 90 % idle models are evicted, and every load is
    #: admitted against the reading too (``corral._host.memory_watch``). None or 0: off.
    memory_watch_s: float | None = option(
        None,
        "seconds between readings of the memory in use against the cgroup's limit (else the "
        "machine's): past 90 percent idle models are evicted, and loads are admitted "
        "against it too; 0: off",
    )
    #: With a memory budget: measure what each version loaded costs, in a child process
    #: (``corral._host.charges``), and charge that in place of the estimate made before the
    #: load. Without a budget nothing is measured.
    measure_charges: bool = option(
        False,
        "with a memory budget, measure what each model loaded costs (in a child process) "
        "and charge that in place of the estimate",
    )
    #: Most model versions loaded at once; None: no count.
    max_loaded_models: int | None = option(None, "most model versions loaded at once")
    #: Loads that run at once, on the Host's load workers (default: cores, at most 4).
    load_concurrency: int = option(
        help_text="loads that run at once",
        default_factory=_default_load_concurrency,
        made_default="the cores, at most 4",
    )
    #: Seconds one load (reading the model's entry, building its session) may take; past it
    #: the load fails with LoadTimeout, its waiters are answered and its load slot freed.
    load_timeout_s: float = option(
        DEFAULT_LOAD_TIMEOUT_S,
        "seconds a load may take; past it the model fails (503) and its slot frees",
    )
    #: Seconds between checks of the models in use for changed or new versions; None: off.
    poll_interval_s: float | None = option(
        None, "seconds between checks of the models in use for new versions"
    )
    #: After a failed load, its error is answered at once for ``first`` seconds, doubling
    #: up to ``cap``, unless the model's files change.
    failure_backoff_s: tuple[float, float] = option(
        DEFAULT_FAILURE_BACKOFF_S,
        "seconds a failed load's error is answered at once: (first, cap), doubling",
        not_offered="a pair of seconds; the server keeps the library's default back-off",
    )
    #: Batch concurrent requests for one model into one run where the model allows it.
    batching: bool = option(True, "batch concurrent requests for a model where it allows")
    #: Rows per batched run of a model whose configuration gives no ``max_batch_size`` and
    #: whose rows the load's probe proves independent (Triton's ``--backend-config
    #: default-max-batch-size``, which its auto-completed configurations take).
    default_max_batch_size: int = option(
        DEFAULT_MAX_BATCH_SIZE,
        "rows per batched run of a model whose configuration gives no max_batch_size and "
        "whose rows the load's probe proves independent",
    )
    #: Requests one model version may have queued; more are refused at once (Overloaded).
    max_queue_per_model: int = option(
        DEFAULT_QUEUE_LIMIT, "requests a model version may have queued; more get 429 at once"
    )
    #: Model versions that get a request-latency histogram of their own: the first this
    #: many asked, for the Host's life (each adds 17 series to the metrics); 0: none.
    model_latency_histograms: int = option(
        DEFAULT_MODEL_LATENCY_HISTOGRAMS,
        "model versions with a request-latency histogram of their own in /metrics: the "
        "first this many asked; 0: only the server-wide one",
    )
    #: Microseconds of CPU a model's run may take for its requests to run on the thread that
    #: receives them (the inline lane, docs/scheduler.md): measured after its load and on every
    #: inline run, ``shared`` models only; 0: off.
    inline_run_us: int = option(
        DEFAULT_INLINE_RUN_US,
        "microseconds of CPU a shared model's run may take for it to run on the thread that "
        "receives its requests, measured after its load and on every such run; 0: off",
    )
    #: Bytes the files uploaded by loads (Triton's ``file:`` parameters) may hold together on
    #: disk: bytes, or a size like ``"1GiB"``, held as bytes once checked; None: no cap.
    max_upload_bytes: int | str | None = option(
        DEFAULT_MAX_UPLOAD_BYTES,
        "bytes the files uploaded by loads (file: parameters) may hold together on disk: "
        "bytes or a size like 1GiB; a load past it gets 413 / RESOURCE_EXHAUSTED",
    )
    #: Whether a load's uploaded files (model control's ``file:`` parameters) may hold a
    #: Triton Python model: a ``model.py`` is code that runs with the server's rights, so by
    #: default only the repository's own are run, and an upload of one is refused.
    allow_python_uploads: bool = option(
        False,
        "run Triton Python models (model.py) that model-control loads upload as files: code "
        "run with the server's rights; by default only the repository's own model.py run",
    )
    #: The folder a repository in object storage (``s3://...``) is copied into as its models
    #: are read; None: a new temporary folder. Only for such a repository.
    cache_dir: str | None = option(
        None,
        "the folder an s3:// repository's models are copied into as they are read "
        "(kept across restarts); default: a new temporary folder",
    )
    #: Bytes that folder may hold: bytes, or a size like ``"10GiB"``; the least recently read
    #: models not in use are removed past it. None: no cap. Only for such a repository.
    cache_bytes: int | str | None = option(
        None,
        "bytes the cache of an s3:// repository may hold: bytes or a size like 10GiB; the "
        "least recently read models not in use are removed past it",
    )
    #: A folder where the graphs onnxruntime optimized at load are kept, so that the next
    #: load of the same model skips graph optimization (corral._onnx.optimized_models: CPU
    #: models of 64 KiB or more without external data); None: none kept.
    optimized_models: str | None = option(
        None,
        "a folder where the graphs onnxruntime optimized are kept: the next load of the same "
        "model skips graph optimization (CPU models of 64 KiB or more, no external data)",
    )
    _budget_bytes: int | None = field(init=False, repr=False, compare=False, default=None)
    _budget_source: str | None = field(init=False, repr=False, compare=False, default=None)

    def __post_init__(self) -> None:
        budget = self.memory_budget
        if isinstance(budget, str) and budget.strip().lower() == "none":
            object.__setattr__(self, "memory_budget", None)
        elif isinstance(budget, str) and budget.strip().lower() == "auto":
            limit = find_memory_limit()
            object.__setattr__(self, "_budget_bytes", int(limit.limit_bytes * AUTO_BUDGET_FRACTION))
            source = f"auto: half of {limit.source}, {limit.limit_bytes:,} bytes"
            object.__setattr__(self, "_budget_source", source)
        elif budget is not None:
            object.__setattr__(self, "_budget_bytes", parse_bytes(budget))
        watch = self.memory_watch_s
        if watch is not None and not (_is_number(watch) and 0 <= watch < math.inf):
            raise InvalidOption(
                f"memory_watch_s must be a number of seconds, 0 or more, got {watch!r}",
                option="memory_watch_s",
            )
        if watch == 0:
            object.__setattr__(self, "memory_watch_s", None)  # 0: off, as None
        if self.max_upload_bytes is not None:
            uploads = parse_bytes(self.max_upload_bytes, option="max_upload_bytes")
            object.__setattr__(self, "max_upload_bytes", uploads)
        if self.cache_bytes is not None:
            cache = parse_bytes(self.cache_bytes, option="cache_bytes")
            object.__setattr__(self, "cache_bytes", cache)
        for name in ("cache_dir", "optimized_models"):
            folder = getattr(self, name)
            if folder is not None and (not isinstance(folder, str) or not folder):
                raise InvalidOption(f"{name} must be a folder's path, got {folder!r}", option=name)
        positive_int("max_loaded_models", self.max_loaded_models, optional=True)
        positive_int("load_concurrency", self.load_concurrency)
        positive_int("max_queue_per_model", self.max_queue_per_model)
        positive_int("default_max_batch_size", self.default_max_batch_size)
        load_timeout = self.load_timeout_s
        if not (_is_number(load_timeout) and 0 < load_timeout < math.inf):
            raise InvalidOption(
                f"load_timeout_s must be a positive number of seconds, got {load_timeout!r}",
                option="load_timeout_s",
            )
        poll = self.poll_interval_s
        if poll is not None and not (_is_number(poll) and 0 < poll < math.inf):
            raise InvalidOption(
                f"poll_interval_s must be a positive number of seconds, got {poll!r}"
            )
        backoff = self.failure_backoff_s
        if not (
            isinstance(backoff, tuple)
            and len(backoff) == 2
            and all(_is_number(part) for part in backoff)
            and 0 <= backoff[0] <= backoff[1] < math.inf
        ):
            raise InvalidOption(
                f"failure_backoff_s must be (first, cap) with 0 <= first <= cap, got {backoff!r}"
            )
        histograms = self.model_latency_histograms
        if isinstance(histograms, bool) or not isinstance(histograms, int) or histograms < 0:
            raise InvalidOption(
                f"model_latency_histograms must be a whole number, 0 or more, got {histograms!r}",
                option="model_latency_histograms",
            )
        inline = self.inline_run_us
        if isinstance(inline, bool) or not isinstance(inline, int) or inline < 0:
            raise InvalidOption(
                f"inline_run_us must be a whole number of microseconds, 0 or more, got {inline!r}",
                option="inline_run_us",
            )
        if not isinstance(self.measure_charges, bool):
            raise InvalidOption(
                f"measure_charges must be True or False, got {self.measure_charges!r}",
                option="measure_charges",
            )
        if not isinstance(self.batching, bool):
            raise InvalidOption(
                f"batching must be True or False, got {self.batching!r}", option="batching"
            )
        if not isinstance(self.allow_python_uploads, bool):
            raise InvalidOption(
                f"allow_python_uploads must be True or False, got {self.allow_python_uploads!r}",
                option="allow_python_uploads",
            )

    @classmethod
    def taken_from(cls, source: object) -> HostOptions:
        """The options ``source`` carries as attributes of the same names; the rest default.

        For the objects that carry the Host's options among their own (the server's
        settings, Ray's config). An attribute that is None leaves an option whose default is
        not None (``load_concurrency``, ``batching`` ...) at that default.
        """
        return dataclasses.replace(cls(), **given_by(cls, source))  # checked by __post_init__

    @property
    def budget_bytes(self) -> int | None:
        """The memory budget in bytes; None: no budget."""
        return self._budget_bytes

    @property
    def budget_source(self) -> str | None:
        """Where an automatic budget came from; None for one given in bytes, or none.

        ``"auto: half of the cgroup (v1) /sys/fs/cgroup/memory/app, 536,870,912 bytes"``.
        """
        return self._budget_source

    @property
    def upload_bytes(self) -> int | None:
        """What the uploads may hold, in bytes; None: no cap."""
        value = self.max_upload_bytes
        return None if value is None else parse_bytes(value, option="max_upload_bytes")

    @property
    def cache_bytes_value(self) -> int | None:
        """What the cache of a repository in object storage may hold, in bytes; None: no cap."""
        value = self.cache_bytes
        return None if value is None else parse_bytes(value, option="cache_bytes")

    @property
    def limits(self) -> Limits:
        """The budget's caps, as the eviction rules take them."""
        return Limits(self._budget_bytes, self.max_loaded_models)


class HostOptionArgs(TypedDict, total=False):
    """:class:`HostOptions`' fields, as keyword arguments of :class:`Host`.

    The fields' only copy: a type checker cannot make a TypedDict from a dataclass, so
    tests/core/host/test_options_declared.py fails when the two differ.
    """

    memory_budget: int | str | None
    memory_watch_s: float | None
    measure_charges: bool
    max_loaded_models: int | None
    load_concurrency: int
    load_timeout_s: float
    poll_interval_s: float | None
    failure_backoff_s: tuple[float, float]
    batching: bool
    default_max_batch_size: int
    max_queue_per_model: int
    model_latency_histograms: int
    inline_run_us: int
    max_upload_bytes: int | str | None
    allow_python_uploads: bool
    cache_dir: str | None
    cache_bytes: int | str | None
    optimized_models: str | None


@functools.cache
def edge_options() -> tuple[Declared, ...]:
    """The Host's options, then the Runtime's, as declared for the edges.

    The server's settings, Ray's config and the command line make a field, a flag and a
    ``CORRAL_<NAME>`` variable of each one they offer (``not_offered`` says why not).
    """
    return declared(HostOptions) + declared(RuntimeOptions)


def _is_number(value: object) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)
