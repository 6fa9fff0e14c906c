"""What a Host reports: its state, each model's and version's state, its counters.

The types are frozen snapshots. :func:`model_status` builds one model's status from what the
repository lists and what the Host's table holds (:class:`Holdings`), as a pure function, so
that the rules that decide a state (READY wins over LOADING, a model-level failure over an
unloaded version ...) live in one place and are tested without a Host.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass, field

from corral._host.budget import Charge
from corral._models import ModelConfig, ModelEntry
from corral._onnx import ConcurrencyPolicy

__all__ = [
    "Holdings",
    "HostState",
    "HostStats",
    "ModelState",
    "ModelStatus",
    "VersionSettings",
    "VersionStatus",
    "model_status",
]


class HostState(enum.Enum):
    """Where a Host is in its life."""

    #: Taking requests.
    RUNNING = "running"
    #: close() began: new requests raise HostClosed; leases drain.
    CLOSING = "closing"
    #: Every session is released.
    CLOSED = "closed"


class ModelState(enum.Enum):
    """Where one version of a model is, as :meth:`Host.models` reports it."""

    #: In the repository, not loaded.
    UNLOADED = "unloaded"
    #: A load is in flight; requests for it wait for it.
    LOADING = "loading"
    #: Loaded; requests run on it.
    READY = "ready"
    #: Taken out of service (unload, eviction of a leased copy, or a swap); closing once its
    #: leases drain.
    UNLOADING = "unloading"
    #: The last load failed; retried after a back-off, or at once when its files change.
    FAILED = "failed"


@dataclass(frozen=True)
class VersionSettings:
    """What a loaded version runs with: its configuration, and what corral made of it.

    The same values :class:`HostLease` gives, read from the Host's table without a lease, a
    load or a file read (the status page's model detail).
    """

    #: The settings it was built with; ``config.source`` says which file set them.
    config: ModelConfig
    #: Rows per batched run; 0 when its requests never share a run (``VersionStatus.batching``
    #: says why).
    max_batch_size: int
    #: How long a batch waits to fill, in microseconds (0: never).
    batch_window_us: int
    #: How many requests may wait in its queue.
    queue_limit: int
    #: The concurrency policy in force (``auto`` resolved): its kind and its sessions.
    concurrency: ConcurrencyPolicy
    #: The execution providers onnxruntime assigned, in order of precedence.
    providers: tuple[str, ...]
    #: Never evicted: by its configuration or by ``Host.load(pin=True)``.
    pinned: bool
    #: The devices whose one-run-at-a-time lane its runs hold, as ``"provider:device id"``
    #: (a ``+device`` policy: DirectML, WebGPU); empty for none.
    devices: tuple[str, ...] = ()


@dataclass(frozen=True)
class VersionStatus:
    """One version of a model, from :meth:`Host.models`."""

    version: int
    state: ModelState
    #: What it counts for against the budget while loaded (0 when not loaded): its declared
    #: size, else its measured cost once measured, else its estimate.
    size_bytes: int
    #: Wall-clock time (``time.time()``) of the last request, or None if never used.
    last_used: float | None
    #: Runs, leases and admissions since it was loaded, the load's own included (its warm-up
    #: runs, the batching probe's, up to 5, and the inline lane's measuring, up to 10, when
    #: they ran).
    runs: int
    #: Why the last load failed, if it did.
    failure: str | None
    #: While loaded, why its queued requests share runs or not, in one line: ``batched
    #: (probed): ...``, ``batched (declared): ...`` or ``not batched: ...``; else None.
    batching: str | None = None
    #: While loaded, where its requests run, in one line: ``inline: ...`` (on the thread
    #: that receives them, while each run stays under the Host's ``inline_run_us``),
    #: ``workers: ...`` (measured past it) or ``off: ...``; else None (corral._compute.inline).
    inline: str | None = None
    #: While loaded (or closing), what it runs with; else None: the Host knows it only once
    #: it loads the version.
    settings: VersionSettings | None = None
    #: While loaded: its resident bytes as estimated before the load, from the file.
    estimated_bytes: int | None = None
    #: While loaded: what one copy was measured to cost once loaded (a Host with
    #: ``measure_charges``); None until measured, or when it is not.
    measured_bytes: int | None = None
    #: What its configuration declares one version costs (``memory_bytes``), if it does.
    declared_bytes: int | None = None

    @property
    def charge_basis(self) -> str | None:
        """Which figure :attr:`size_bytes` is, while loaded: declared, measured or estimated."""
        if self.estimated_bytes is None:
            return None
        return Charge(self.estimated_bytes, self.declared_bytes, self.measured_bytes).basis


@dataclass(frozen=True)
class VersionCharge:
    """What one loaded version counts for against the budget, from :meth:`Host.charges`."""

    name: str
    version: int
    #: The bytes counted: ``declared``, else ``measured``, else ``estimated``.
    charged: int
    #: The estimate made from its file before the load.
    estimated: int
    #: What one copy was measured to cost (``measure_charges``); None until measured.
    measured: int | None
    #: What its configuration declares (``memory_bytes``); None when it declares nothing.
    declared: int | None


@dataclass(frozen=True)
class ModelStatus:
    """A model and its versions, from :meth:`Host.models`."""

    name: str
    #: READY if any version is loaded, else LOADING, FAILED or UNLOADED in that order.
    state: ModelState
    versions: tuple[VersionStatus, ...]
    #: Why the model cannot be loaded at all (its layout or model.toml), if so.
    failure: str | None


@dataclass(frozen=True)
class HostStats:
    """Counters and gauges of a Host, from :meth:`Host.stats`."""

    state: HostState
    #: Models with at least one version loaded, and versions loaded.
    loaded_models: int
    loaded_versions: int
    #: Estimated bytes of everything loaded, and the budget (None: no budget).
    bytes_used: int
    memory_budget: int | None
    max_loaded_models: int | None
    #: Loads done, loads failed, versions evicted for room, unloads asked for, swaps.
    loads: int
    load_failures: int
    evictions: int
    unloads: int
    reloads: int
    #: Load time: the sum, and cumulative counts per bucket ``(upper bound s, count)``.
    load_seconds_sum: float
    load_seconds_buckets: tuple[tuple[float, int], ...]
    #: ``load_failures`` by reason, one of ``corral._compute.counters.LOAD_FAILURE_REASONS``; a
    #: reason no load failed for is left out.
    load_failure_reasons: Mapping[str, int] = field(default_factory=dict)
    #: Versions loaded whose requests run on the thread that receives them now (the inline
    #: lane: corral._compute.inline).
    inline_versions: int = 0
    #: Estimated bytes set aside for the loads under way, beside ``bytes_used``.
    bytes_reserved: int = 0
    #: With ``memory_watch_s``: the memory in use as the kernel counts it (the cgroup's
    #: working set, else the machine's), the limit it is held under, and what that limit is;
    #: None without a watch, or when the use cannot be read.
    memory_in_use: int | None = None
    memory_limit: int | None = None
    memory_limit_source: str | None = None


@dataclass
class Holdings:
    """What the Host's table holds of one model, taken under its lock for a report."""

    #: Versions serving, and versions retired but not yet closed (UNLOADING).
    loaded: list[VersionStatus] = field(default_factory=list)
    retiring: list[VersionStatus] = field(default_factory=list)
    #: Versions with a load in flight.
    loading: list[int] = field(default_factory=list)
    #: Why the last load of a version failed, by version (0: the model itself).
    failures: dict[int, str] = field(default_factory=dict)
    #: Why the last reload failed while an older copy kept serving, if it did.
    reload_failure: str | None = None


def model_status(name: str, entry: ModelEntry | None, held: Holdings | None) -> ModelStatus:
    """One model's status: the repository's versions overlaid with what the Host holds.

    A version's state is, from weakest to strongest: UNLOADED (served by the repository),
    FAILED, LOADING, UNLOADING, READY. The model is READY if any version is, else LOADING,
    else FAILED, else UNLOADED.
    """
    held = held or Holdings()
    versions: dict[int, VersionStatus] = {}
    if entry is not None:
        for number in entry.served_versions:
            versions[number] = VersionStatus(number, ModelState.UNLOADED, 0, None, 0, None)
    for number, reason in held.failures.items():
        if number:
            versions[number] = VersionStatus(number, ModelState.FAILED, 0, None, 0, reason)
    for number in held.loading:
        versions[number] = VersionStatus(number, ModelState.LOADING, 0, None, 0, None)
    for status in (*held.retiring, *held.loaded):
        versions[status.version] = status
    model_failure = held.failures.get(0)
    if model_failure is not None:
        failure: str | None = model_failure
    elif held.reload_failure is not None:
        failure = f"reload failed, still serving the previous copy: {held.reload_failure}"
    else:
        failure = None
    states = {status.state for status in versions.values()}
    if ModelState.READY in states:
        state = ModelState.READY
    elif ModelState.LOADING in states:
        state = ModelState.LOADING
    elif model_failure is not None or ModelState.FAILED in states:
        state = ModelState.FAILED
    else:
        state = ModelState.UNLOADED
    return ModelStatus(name, state, tuple(versions[n] for n in sorted(versions)), failure)
