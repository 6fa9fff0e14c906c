"""One data plane for every transport: the Open Inference Protocol's operations on a Host.

The HTTP and gRPC servers decode a request into :mod:`corral.protocol.types`, call one method
here, and encode what it returns; errors are corral's own exceptions, which each transport
maps to its status codes. Nothing here knows about HTTP or gRPC.

The data plane answers health, metadata, inference, statistics and Triton's system shared
memory. Which models it serves is model control's to say
(:class:`~corral.protocol.model_control.ModelControl`, Triton's repository API: index, load,
unload, explicit model control): the data plane asks it through a few named calls, and the
servers answer the repository API through :attr:`DataPlane.control`, so both see one state.

Every operation that may read the repository's files or wait for a load is a coroutine: the
calls that may touch storage (readiness, status, statistics, and model control's index, load
and unload) run on the control plane's own daemon threads with a bounded wait
(:class:`corral.protocol.control.ControlThreads`, shared with model control), never on
asyncio's default executor, and loads are awaited on the Host's load workers
(:meth:`Host.acquire_async`), so that a slow or hung filesystem holds up only the requests that
need it, never the event loop every client shares nor the other calls. ``live``, ``ready`` and
``server_metadata`` read memory only and answer at once.

Example::

    plane = DataPlane(host)
    response = await plane.infer("fraud", None, request)
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, ParamSpec, TypeVar, cast

import numpy.typing as npt

from corral import __version__
from corral._base import (
    ChangeListener,
    ChangeListeners,
    CorralError,
    DeadlineExceeded,
    InferenceError,
    InvalidInput,
    ModelLoadError,
    RunTrace,
)
from corral._compute import QueueStats, RequestStats, deadline_after, request_failure_reason
from corral._host import Host, HostLease, HostState, ModelState, ModelStatus
from corral._onnx import Signature
from corral.protocol.classification import class_count
from corral.protocol.control import CONTROL_TIMEOUT_S
from corral.protocol.metadata import model_configuration, model_metadata, platform_of
from corral.protocol.model_control import ModelControl
from corral.protocol.outputs import classified, outputs_to_run, tensor_output
from corral.protocol.parameters import IgnoredParameters, check_parameters
from corral.protocol.paths import public_text
from corral.protocol.response_cache import CachedAnswer, CacheKey, ResponseCache, cache_key
from corral.protocol.shm import EXTENSION as SHARED_MEMORY_EXTENSION
from corral.protocol.shm import (
    OutputRegions,
    RegionStatus,
    SharedMemoryRegistry,
    SharedMemoryUnsupported,
)
from corral.protocol.statistics import statistics_rows
from corral.protocol.types import (
    InferRequest,
    InferResponse,
    ModelConfiguration,
    ModelMetadata,
    ModelStatistics,
    ServerMetadata,
)

__all__ = [
    "EXTENSIONS",
    "OMITTED_OUTPUTS",
    "READY_LOAD_TIMEOUT_S",
    "DataPlane",
    "GroupedRequest",
    "run_blocking",
    "status_for",
]

#: Seconds a readiness request waits for the load it starts (or joins) of a model that is not
#: loaded; past it the answer is "not ready" and the load goes on. Below tritonclient's own
#: 60 s network timeout, so that its ``is_model_ready`` gets an answer, not a timeout.
READY_LOAD_TIMEOUT_S = 30.0

#: The protocol extensions corral implements, as ``GET /v2`` lists them; ``system_shared_memory``
#: follows them when the data plane has a shared-memory registry.
EXTENSIONS = (
    "binary_tensor_data",
    "classification",
    "model_repository",
    "statistics",
    "model_configuration",
)

#: The response parameter that names, comma-separated, the outputs a response leaves out
#: because no tensor of the protocol carries them (a sequence or a map): set only when the
#: request named no outputs and the model has such outputs.
OMITTED_OUTPUTS = "omitted_outputs"

_Status = TypeVar("_Status")
_Result = TypeVar("_Result")
_Params = ParamSpec("_Params")


def status_for(table: Mapping[type[CorralError], _Status], error: CorralError) -> _Status | None:
    """A transport's status for ``error``: the entry of its most specific class in ``table``.

    Each transport keeps its own ``{error class: status}`` table (HTTP codes, gRPC codes);
    this is the one lookup they share. None if no class of ``error`` is in the table.
    """
    for cls in type(error).__mro__:
        if issubclass(cls, CorralError) and cls in table:
            return table[cls]
    return None


async def run_blocking(
    call: Callable[_Params, _Result], /, *args: _Params.args, **kwargs: _Params.kwargs
) -> _Result:
    """Await ``call(*args, **kwargs)`` run on a worker thread, leaving the event loop free.

    The one way the data plane and the servers hand over work that may block: a file read, a
    load, a page of statistics for every model. The thread is one of the running loop's
    default executor. Cancelling the awaiting task does not stop ``call``, which finishes on
    its thread with its result dropped: ``call`` must release whatever it takes itself.

    Example::

        models = await run_blocking(host.models)
    """
    return await asyncio.to_thread(call, *args, **kwargs)


logger = logging.getLogger(__name__)

#: A run's outputs, by name.
Outputs = dict[str, npt.NDArray[Any]]
#: The most inline runs a group takes on the thread that hands it over: each is held to the
#: lane's bound, so a group holds that thread for at most this many times the bound; what is
#: left goes to the compute workers.
INLINE_RUNS_PER_GROUP = 4


@dataclass(slots=True)
class GroupedRequest:
    """One request of a group gathered for one model version (:meth:`DataPlane.infer_group`).

    Its inputs already decoded to arrays (distinct names, the transport checked), and no
    parameters but what the transport answers itself (binary outputs).
    """

    inputs: dict[str, npt.NDArray[Any]]
    #: The outputs named, () for the model's every tensor output.
    outputs: tuple[str, ...]
    id: str | None
    #: A ``time.monotonic()`` time by which it must have started, or None.
    deadline: float | None
    #: When it arrived, on ``time.perf_counter_ns()``'s clock: its time is counted from here.
    started_ns: int
    #: The transport's own handle on it (a native edge's call).
    token: object
    #: Set by :meth:`DataPlane.infer_group` for a request its response cache may keep the
    #: answer of: its key, and what its lookup took.
    cache_key: CacheKey | None = None
    lookup_ns: int = 0


#: How :meth:`DataPlane.infer_group` answers: requests of one group, each with its response
#: or its error, in one call (a batch's, or those refused at once).
GroupAnswers = Callable[[Sequence[GroupedRequest], Sequence["InferResponse | CorralError"]], None]


class DataPlane:
    """The protocol's operations, on one Host; safe from any thread and any event loop.

    ``control``: the model control whose rules it serves by (which models are served,
    whether a readiness request may load one, whether the loads at start are done); a new
    :class:`ModelControl` of ``host`` by default, every model served. Its threads run this
    plane's calls that may touch storage too. ``ready_load_timeout_s``: how long
    :meth:`model_ready` waits for the load it starts. ``shared_memory``: the system
    shared-memory regions requests may name; None: the extension is off.
    ``response_cache``: the server's response cache (:mod:`corral.protocol.response_cache`),
    used for the models whose config enables it; None: the server has none.
    """

    def __init__(
        self,
        host: Host,
        *,
        control: ModelControl | None = None,
        name: str = "corral",
        version: str = __version__,
        control_timeout_s: float = CONTROL_TIMEOUT_S,
        ready_load_timeout_s: float = READY_LOAD_TIMEOUT_S,
        shared_memory: SharedMemoryRegistry | None = None,
        response_cache: ResponseCache | None = None,
    ) -> None:
        self._host = host
        self._control = ModelControl(host) if control is None else control
        # Read once: inference asks model control only under explicit model control.
        self._explicit_only = self._control.explicit
        # Names once per model a request parameter that changes nothing here (a priority).
        self._ignored = IgnoredParameters()
        # Triton's system shared memory extension, when the server serves it.
        self._shared_memory = shared_memory
        extensions = EXTENSIONS if shared_memory is None else (*EXTENSIONS, SHARED_MEMORY_EXTENSION)
        self._metadata = ServerMetadata(name, version, extensions)
        # The control plane's own threads, shared with model control: never asyncio's
        # default executor (see above).
        self._threads = self._control.threads
        self._control_timeout_s = control_timeout_s
        self._ready_load_timeout_s = ready_load_timeout_s
        # Set when the server's drain begins: ready() answers False from then on.
        self._not_ready_notice = threading.Event()
        # Cleared while something outside this process holds readiness (hold_ready).
        self._released = threading.Event()
        self._released.set()
        # Told when ready() may have changed (stop_reporting_ready, release_ready).
        self._readiness_listeners = ChangeListeners()
        # Size 0: no cache, and a model enabling one is named once in the log.
        self._response_cache = ResponseCache() if response_cache is None else response_cache
        if self._response_cache.size_bytes:
            host.on_change(self._drop_stale_answers)

    @property
    def host(self) -> Host:
        """The Host this data plane serves."""
        return self._host

    @property
    def control(self) -> ModelControl:
        """The model control it serves by: the servers answer Triton's repository API with it."""
        return self._control

    @property
    def control_refused(self) -> int:
        """Control-plane calls refused so far because too many were waiting (``Overloaded``)."""
        return self._threads.refused

    def _drop_stale_answers(self, model: str | None) -> None:
        # The Host's change listener: a copy out of service keeps no answer (none could be
        # reached: the key holds the copy that computed it), so that its bytes go at once.
        if model is not None:
            self._response_cache.drop_stale(model, self._host.serving_generations(model))

    @property
    def response_cache(self) -> ResponseCache:
        """The server's response cache; its ``size_bytes`` is 0 when the server has none."""
        return self._response_cache

    @property
    def shared_memory(self) -> SharedMemoryRegistry | None:
        """The system shared-memory regions requests may name; None when the extension is off."""
        return self._shared_memory

    # -- health and metadata ----------------------------------------------------------------

    def live(self) -> bool:
        """True while the server can answer at all (until its Host has closed)."""
        return self._host.state is not HostState.CLOSED

    def ready(self) -> bool:
        """True while the server takes inference requests.

        Not before model control's loads at start are done (:meth:`ModelControl.preload`),
        nor while :meth:`hold_ready` holds it, nor once shutdown or
        :meth:`stop_reporting_ready` began.
        """
        if self._not_ready_notice.is_set() or not self._released.is_set():
            return False
        return self._control.preloaded and self._host.state is HostState.RUNNING

    def stop_reporting_ready(self) -> None:
        """Answer :meth:`ready` False from now on, while requests are still served.

        The server calls it when its drain begins (``drain_notice_s`` before it closes
        connections), so that load balancers and probes stop sending first. Idempotent.
        """
        self._not_ready_notice.set()
        self._readiness_listeners.notify(None)

    def hold_ready(self) -> None:
        """Answer :meth:`ready` False until :meth:`release_ready`, whatever else holds.

        For readiness that waits on something outside this process: one process of
        ``corral serve --processes N`` is not ready until every one has loaded its models.
        """
        self._released.clear()

    @property
    def ready_held(self) -> bool:
        """True while :meth:`hold_ready` holds readiness (not yet released)."""
        return not self._released.is_set()

    def release_ready(self) -> None:
        """End :meth:`hold_ready`, telling the readiness listeners. Idempotent."""
        self._released.set()
        self._readiness_listeners.notify(None)

    def on_change(self, listener: ChangeListener) -> Callable[[], None]:
        """Tell ``listener`` of each change that may change a health answer; returns its removal.

        A model's name when the Host records an event of it (:meth:`Host.on_change`) or model
        control loads or unloads it; None when :meth:`ready` may have changed. The listener
        runs on the thread that made the change, and must be quick and never block. A model
        that appears in, or leaves, the repository's folder is told of only when something
        happens to it (its first load, a poll's reload or unload).
        """
        removals = [
            self._host.on_change(listener),
            self._control.listeners.add(listener),
            self._readiness_listeners.add(listener),
        ]

        def remove() -> None:
            for removal in removals:
                removal()

        return remove

    def public_text(self, text: str) -> str:
        """An error's text as a client is told it: the server's folders named relative.

        The repository's absolute path and upload folders are left out
        (:func:`corral.protocol.paths.public_text`); the log keeps the whole text.
        """
        return public_text(self._host, text)

    def served_status(self, name: str) -> ModelStatus:
        """``name``'s status (:meth:`Host.status`), for a model this server serves; blocking.

        Raises :class:`ModelNotFound` for a model not in the repository or, under explicit
        model control, not loaded through it. May read the model's entry from the disk.
        """
        self._control.check_served(name)
        return self._host.status(name)

    def server_metadata(self) -> ServerMetadata:
        """The server's name, version and protocol extensions."""
        return self._metadata

    async def model_ready(self, name: str, version: str | None = None) -> bool:
        """True once ``name`` (or that version of it) is loaded and serving.

        A model in the repository that is not loaded is loaded first (joining a load already
        in flight), as its first request would load it, and the answer waits at most
        ``ready_load_timeout_s`` for it: so that clients that check readiness before they
        send work. False if the load fails (the repository index gives the reason), has not
        finished by then (it goes on), or model control says no readiness request may load
        it (:meth:`ModelControl.readiness_may_load`: explicit model control, or unloaded
        through the protocol and not loaded since). Raises :class:`ModelNotFound` for an
        unknown model or version.
        """
        ready = await self._threads.run(
            f"the readiness of model {name!r}",
            self._control_timeout_s,
            self._model_ready,
            name,
            version,
        )
        if ready:
            return self._control.ready_answer(name)
        if not self._control.readiness_may_load(name):
            return False
        return await self._load_for_readiness(name, version)

    async def _load_for_readiness(self, name: str, version: str | None) -> bool:
        try:
            lease = await self._host.acquire_async(
                name, _version_arg(version), timeout=self._ready_load_timeout_s
            )
        except (ModelLoadError, DeadlineExceeded):
            return False  # failed (its reason is in the index), or still loading
        lease.release()
        return True

    def _model_ready(self, name: str, version: str | None) -> bool:
        status = self._host.status(name)
        try:
            wanted = self._host.serving_version(name, version)
        except ModelLoadError:
            return False  # its entry is broken (a malformed model.toml): the index says why
        return any(v.version == wanted and v.state is ModelState.READY for v in status.versions)

    async def model_metadata(self, name: str, version: str | None = None) -> ModelMetadata:
        """A model's versions, inputs and outputs; loads the model if it is not loaded."""
        self._control.check_served(name)
        # The load is awaited on the Host's load workers; the status may read the model's
        # entry, on a control thread.
        with await self._host.acquire_async(name, _version_arg(version)) as lease:
            signature = lease.session.signature
            platform = platform_of(lease.config)
        status = await self._threads.run(
            f"the status of model {name!r}", self._control_timeout_s, self._host.status, name
        )
        versions = [str(v.version) for v in status.versions]
        return model_metadata(lease.name, versions, signature, platform)

    async def model_config(self, name: str, version: str | None = None) -> ModelConfiguration:
        """A model's configuration, as Triton's ``model_config``; loads the model if need be."""
        self._control.check_served(name)
        with await self._host.acquire_async(name, _version_arg(version)) as lease:
            return model_configuration(lease)

    # -- inference --------------------------------------------------------------------------

    async def infer(
        self,
        name: str,
        version: str | None,
        request: InferRequest,
        trace: RunTrace | None = None,
        loop: asyncio.AbstractEventLoop | None = None,
        inline: bool = True,
    ) -> InferResponse:
        """Run ``request`` on the model and answer it; raises corral's errors.

        ``trace``: the server's tracing of this request, told of the run that answers it.
        ``loop``: the running event loop, when the caller has it at hand (it saves a system
        call per request on Python 3.11). ``inline``: False keeps the request off the inline
        lane (:mod:`corral._compute.inline`) whatever its model's place there; a server passes it
        when other requests are in flight beside this one, which the compute workers may
        batch with it.

        A request that names no outputs gets the model's tensor outputs; any others (a
        sequence, a map) are not computed, and the response's ``omitted_outputs`` parameter
        names them. Naming one of those is :class:`InvalidInput`.

        Outputs whose parameters name a ``shared_memory_region`` are written there (their
        regions are checked and held from before the model is acquired until the answer is
        made); the response marks them (:mod:`corral.protocol.shm`).
        """
        started = time.perf_counter_ns()
        named = request.outputs  # most requests name none: what follows is then skipped
        regions = None
        try:
            if self._explicit_only:
                self._control.check_served(name)
            if ignored := check_parameters(request):
                self._ignored.note(name, ignored)
            classes = (
                {out.name: count for out in named if (count := class_count(out)) is not None}
                if named
                else None
            )
            feed: dict[str, npt.NDArray[Any]] = {}
            for tensor in request.inputs:
                if tensor.name in feed:
                    raise InvalidInput(f"input {tensor.name!r} is given twice", tensor=tensor.name)
                feed[tensor.name] = tensor.data
            timeout = request.timeout_s if request.parameters else None
            deadline = deadline_after(timeout)
            regions = OutputRegions.hold(self._shared_memory, named) if named else None
            # One lookup: the version leased is the version that runs and the one reported,
            # even if a newer one is swapped in meanwhile. A cold model loads on the Host's
            # load workers; the event loop only awaits.
            lease = self._host.lease_if_ready(name, version or None)
            if lease is None:
                lease = await self._host.acquire_async(name, version or None, timeout=timeout)
        except BaseException as exc:
            if regions is not None:
                regions.release()
            if isinstance(exc, CorralError):
                # Failed before a version was leased (its load failed, say): counted too.
                elapsed = time.perf_counter_ns() - started
                self._host.count_failed_request(name, version or None, elapsed, exc)
            raise
        queued = False
        try:
            signature = lease.session.signature
            if named or signature.uncarried_outputs:
                wanted, omitted = outputs_to_run(signature, request)
            else:
                wanted, omitted = None, []  # every output, all of them tensors
            key = found = None
            if lease.config.response_cache:
                answered = wanted if wanted is not None else _tensor_outputs(signature)
                counts = classes or {}
                carried = tuple([(out, counts.get(out, 0)) for out in answered])
                key, found, lookup_ns = self._look_up(lease, feed, carried, omitted)
            if found is not None:
                outputs, omitted = found.outputs, list(found.omitted)
            else:
                # A model proven to run in microseconds runs here, under the lease (the inline
                # lane, corral._compute.inline); a traced request always takes the workers'
                # run records.
                results = (
                    lease.run_inline(feed, wanted, deadline) if inline and trace is None else None
                )
                if results is None:
                    # The lease's hold passes to the queued request, which keeps the version
                    # until it is answered: the outputs need it no more.
                    pending = lease.queue(feed, wanted, deadline, trace, loop=loop, release=True)
                    queued = True
                    results = await pending
                if classes:
                    results = classified(results, classes, lease)
                outputs = tuple([tensor_output(out, value) for out, value in results.items()])
            computed = outputs
            if regions is not None:
                # An answer from the cache goes to this request's regions, as a run's would.
                outputs = regions.write(outputs)
            if key is not None and found is None:
                self._response_cache.insert(key, computed, tuple(omitted), lookup_ns=lookup_ns)
        except CorralError as exc:
            self._count(name, lease.version, started, ok=False, reason=request_failure_reason(exc))
            raise
        finally:
            if not queued:
                lease.release()  # idempotent: a refused request's hold has ended already
            if regions is not None:
                regions.release()
        if found is not None:
            elapsed = time.perf_counter_ns() - started
            self._host.count_answered(name, lease.version, [elapsed], cached=True)
        else:
            self._count(name, lease.version, started, ok=True)
        return InferResponse(
            model_name=name,
            model_version=str(lease.version),
            outputs=outputs,
            id=request.id,
            parameters={OMITTED_OUTPUTS: ",".join(omitted)} if omitted else {},
        )

    def _look_up(
        self,
        lease: HostLease,
        feed: Mapping[str, npt.NDArray[Any]],
        carried: Sequence[tuple[str, int]],
        omitted: Sequence[str] = (),
    ) -> tuple[CacheKey | None, CachedAnswer | None, int]:
        """A request's key in the response cache, its answer kept there or None, the time taken.

        ``carried``: the outputs its answer carries, in order, each with its class count;
        ``omitted``: those its answer names as left out. No key when the server has no cache
        (the model is then named once in the log).
        """
        cache = self._response_cache
        if not cache.size_bytes:
            cache.note_unheeded(lease.name)
            return None, None, 0
        started = time.perf_counter_ns()
        key = cache_key(lease.name, lease.version, lease.generation, feed, carried, omitted)
        found = cache.lookup(key, started)
        return key, found, time.perf_counter_ns() - started

    def infer_group(
        self,
        name: str,
        version: str | None,
        requests: Sequence[GroupedRequest],
        answer: GroupAnswers,
    ) -> list[GroupedRequest]:
        """Answer a group of requests for one model version, taken at once; for native edges.

        The same decisions as :meth:`infer` makes for each request (model control's rules,
        the version's checks, its queue's bound and deadline, the batching proof, the inline
        lane, the statistics), taken for the whole group at once where they are the group's:
        one lookup of the version and one lease for the lot. A version in the inline lane runs
        the group on this thread, batched within the sizes the lane measured
        (:meth:`HostLease.run_inline_group`, at most :data:`INLINE_RUNS_PER_GROUP` runs);
        the rest is queued for the compute workers with one admission and one taking of the
        scheduler's lock (:meth:`HostLease.submit_group`). ``answer`` is called with the
        requests answered and their outcomes: each batch's on the compute worker that ran it,
        the inline runs' and the refusals on this thread. Returns the requests it did not
        take, for the transport to send the general way (:meth:`infer`): all of them when the
        version is not loaded now (the general way loads it) or the model has outputs no
        tensor carries (the general way names them). Never blocks.
        """
        try:
            if self._explicit_only:
                self._control.check_served(name)
            lease = self._host.lease_if_ready(name, version or None)
        except CorralError as exc:
            for request in requests:
                elapsed = time.perf_counter_ns() - request.started_ns
                self._host.count_failed_request(name, version or None, elapsed, exc)
            answer(requests, [exc] * len(requests))
            return []
        if lease is None:
            return list(requests)
        try:
            if lease.session.signature.uncarried_outputs:
                return list(requests)
            if lease.config.response_cache:
                requests = self._cached_group(lease, requests, answer)
            queued = self._inline_group(lease, requests, answer)
            refusals: list[CorralError | None] = []
            if queued:
                receiver = _GroupReceiver(self, lease.name, lease.version, answer)
                wanted = [
                    (request.inputs, request.outputs or None, request.deadline, request)
                    for request in queued
                ]
                try:
                    refusals = lease.submit_group(wanted, receiver)
                except CorralError as exc:  # the lease was released meanwhile: none queued
                    refusals = [exc] * len(queued)
        finally:
            lease.release()  # each request queued holds the version on its own
        refused = [(r, e) for r, e in zip(queued, refusals, strict=True) if e is not None]
        if refused:
            for request, error in refused:
                reason = request_failure_reason(error)
                self._count(lease.name, lease.version, request.started_ns, ok=False, reason=reason)
            answer([request for request, _ in refused], [error for _, error in refused])
        return []

    def _cached_group(
        self, lease: HostLease, requests: Sequence[GroupedRequest], answer: GroupAnswers
    ) -> Sequence[GroupedRequest]:
        # The group's requests the response cache answers, answered; the others, each with
        # its key, to run. The digests are computed here, on the dispatching thread.
        left: list[GroupedRequest] = []
        hits: list[GroupedRequest] = []
        answers: list[InferResponse | CorralError] = []
        every = _tensor_outputs(lease.session.signature)
        for request in requests:
            carried = tuple([(out, 0) for out in request.outputs or every])
            key, found, lookup_ns = self._look_up(lease, request.inputs, carried)
            if found is None:
                request.cache_key, request.lookup_ns = key, lookup_ns
                left.append(request)
                continue
            hits.append(request)
            answers.append(InferResponse(lease.name, str(lease.version), found.outputs, request.id))
        if hits:
            now = time.perf_counter_ns()
            durations = [now - request.started_ns for request in hits]
            self._host.count_answered(lease.name, lease.version, durations, cached=True)
            answer(hits, answers)
        return left

    def _keep(self, request: GroupedRequest, response: InferResponse) -> None:
        # A grouped request's answer, offered to the response cache if it has a key there.
        if request.cache_key is not None:
            self._response_cache.insert(
                request.cache_key, response.outputs, lookup_ns=request.lookup_ns
            )

    def _inline_group(
        self, lease: HostLease, requests: Sequence[GroupedRequest], answer: GroupAnswers
    ) -> Sequence[GroupedRequest]:
        # The group's requests the inline lane answers, answered; the others, to queue.
        wanted = [(r.inputs, r.outputs or None, r.deadline) for r in requests]
        outcomes = lease.run_inline_group(wanted, INLINE_RUNS_PER_GROUP)
        if outcomes is None:
            return requests
        answered: list[GroupedRequest] = []
        answers: list[InferResponse | CorralError] = []
        durations: list[int] = []
        left: list[GroupedRequest] = []
        now = time.perf_counter_ns()
        for request, ran in zip(requests, outcomes, strict=True):
            if ran is None:
                left.append(request)
                continue
            outcome: InferResponse | CorralError
            if isinstance(ran, CorralError):
                outcome = ran
            else:
                try:
                    outcome = _response(lease.name, lease.version, request, ran)
                    durations.append(now - request.started_ns)
                    self._keep(request, outcome)
                except CorralError as exc:
                    outcome = exc
            if isinstance(outcome, CorralError):
                reason = request_failure_reason(outcome)
                self._count(lease.name, lease.version, request.started_ns, ok=False, reason=reason)
            answered.append(request)
            answers.append(outcome)
        if durations:
            self._host.count_answered(lease.name, lease.version, durations)
        if answered:
            answer(answered, answers)
        return left

    # -- system shared memory ---------------------------------------------------------------

    def shared_memory_status(self, name: str | None = None) -> list[RegionStatus]:
        """The registered regions, or only ``name``; none when the extension is off."""
        if self._shared_memory is None:
            if name:
                raise SharedMemoryUnsupported(_shared_memory_off(f"no region {name!r} exists"))
            return []
        return self._shared_memory.status(name)

    async def register_shared_memory(
        self, name: str, key: str, offset: int, byte_size: int
    ) -> None:
        """Register a system shared-memory region (its object opened on a worker thread)."""
        registry = self._registry(f"cannot register region {name!r}")
        await run_blocking(registry.register, name, key, offset, byte_size)

    def unregister_shared_memory(self, name: str | None = None) -> None:
        """Unregister a region, or all; one in use is unmapped when its requests are done."""
        self._registry("cannot unregister").unregister(name)

    def _registry(self, doing: str) -> SharedMemoryRegistry:
        if self._shared_memory is None:
            raise SharedMemoryUnsupported(_shared_memory_off(doing))
        return self._shared_memory

    # -- statistics -------------------------------------------------------------------------

    async def model_statistics(
        self, name: str | None = None, version: str | None = None
    ) -> list[ModelStatistics]:
        """Counters per model version: every version the Host has loaded, or those of ``name``.

        They count from a version's first load for the Host's life: an eviction, an unload
        or a reload never sets them back.

        Raises :class:`ModelNotFound` for an unknown model or version.
        """
        return await self._threads.run(
            "the statistics", self._control_timeout_s, self._model_statistics, name, version
        )

    def statistics_snapshot(
        self,
        queues: Mapping[tuple[str, int], QueueStats] | None = None,
        counted: Mapping[tuple[str, int], RequestStats] | None = None,
    ) -> list[ModelStatistics]:
        """Every model version's counters now, as :meth:`model_statistics` gives them.

        ``queues``, ``counted``: the Host's queue and request figures (``Host.queue_stats()``,
        ``Host.request_stats()``) when the caller has taken them already, so that one
        snapshot serves both. Reads in-memory snapshots only,
        never a file; but its time grows with the number of versions (milliseconds per
        thousand), so code on an event loop awaits :meth:`model_statistics` instead.
        ``Metrics.render`` calls it on a worker thread.
        """
        if queues is None:
            queues = self._host.queue_stats()
        if counted is None:
            counted = self._host.request_stats()
        return statistics_rows(counted, queues, cache=self._response_cache.counts())

    def _model_statistics(self, name: str | None, version: str | None) -> list[ModelStatistics]:
        if name is not None:
            self._host.status(name)  # ModelNotFound for an unknown model
        wanted = None if version is None else self._host.serving_version(name or "", version)
        queues = self._host.queue_stats()
        counted = self._host.request_stats()
        cache = self._response_cache.counts()
        return statistics_rows(counted, queues, name, wanted, cache)

    def _count(
        self, name: str, version: int, started_ns: int, *, ok: bool, reason: str = "other"
    ) -> None:
        elapsed = time.perf_counter_ns() - started_ns
        self._host.count_request(name, version, elapsed, ok=ok, reason=reason)


def _shared_memory_off(doing: str) -> str:
    return (
        f"Client shared memory is disabled: {doing}; start corral serve with "
        "--system-shared-memory (CORRAL_SYSTEM_SHARED_MEMORY=true) to serve it"
    )


def _tensor_outputs(signature: Signature) -> list[str]:
    """The outputs a request naming none is answered with: the model's tensor outputs."""
    return [spec.name for spec in signature.outputs if spec.dtype is not None]


def _version_arg(version: str | None) -> str | None:
    # The protocol spells versions as strings; "" means "not given" in some clients.
    return version or None


def _response(name: str, version: int, request: GroupedRequest, results: Outputs) -> InferResponse:
    """A grouped request's response; :class:`InferenceError` for an output that is no tensor."""
    outputs = tuple([tensor_output(out, value) for out, value in results.items()])
    return InferResponse(name, str(version), outputs, request.id)


class _GroupReceiver:
    """Answers a group's requests as their batches are run (a scheduler's receiver).

    Counts each batch's answered requests at once, then hands the batch to the transport's
    ``answer``. On the compute worker that ran the batch.
    """

    __slots__ = ("_answer", "_name", "_plane", "_version")

    def __init__(self, plane: DataPlane, name: str, version: int, answer: GroupAnswers) -> None:
        self._plane = plane
        self._name = name
        self._version = version
        self._answer = answer

    def receive(
        self,
        tokens: Sequence[object],
        results: Sequence[object],
        errors: Sequence[BaseException | None] | None,
    ) -> None:
        """Count and answer one batch's requests (see the class)."""
        name, version = self._name, self._version
        requests: list[GroupedRequest] = []
        outcomes: list[InferResponse | CorralError] = []
        answered: list[int] = []
        now = time.perf_counter_ns()
        for index, token in enumerate(tokens):
            assert isinstance(token, GroupedRequest)  # what infer_group queued
            error = None if errors is None else errors[index]
            if error is None:
                try:
                    result = cast(Outputs, results[index])  # a run's outputs, by name
                    response = _response(name, version, token, result)
                    self._plane._keep(token, response)
                    outcomes.append(response)
                    answered.append(now - token.started_ns)
                    requests.append(token)
                    continue
                except CorralError as exc:
                    error = exc
            if not isinstance(error, CorralError):  # not corral's: a bug, answered as such
                logger.error("corral: a grouped request of %r failed", name, exc_info=error)
                error = InferenceError(f"internal error: {error!r}")
            reason = request_failure_reason(error)
            self._plane._count(name, version, token.started_ns, ok=False, reason=reason)
            outcomes.append(error)
            requests.append(token)
        if answered:
            self._plane.host.count_answered(name, version, answered)
        self._answer(requests, outcomes)
