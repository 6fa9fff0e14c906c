"""ModelControl: Triton's model repository API on a Host, and the rules it sets for serving.

Triton's clients manage a server's models through its repository API: the index (every model
and version, with its state and why it failed), load (with a load's own ``config`` and
``files``, which the Host keeps until a later load: :mod:`corral._models.overrides`) and unload.
Under explicit model control (``--model-control-mode explicit``) only the models loaded that
way or at start (``--load-model``, :meth:`ModelControl.preload`) are served.

The data plane (:class:`corral.protocol.dataplane.DataPlane`) serves by these rules and asks
them through four names only: :meth:`~ModelControl.check_served` (explicit model control),
:meth:`~ModelControl.ready_answer` and :meth:`~ModelControl.readiness_may_load` (a model
unloaded through the protocol is not loaded again by a readiness request: Triton's clients
unload, then expect "not ready"), and :attr:`~ModelControl.preloaded` (the server is not
ready before the models to load at start are). Nothing here knows about HTTP or gRPC; this
module does not import the data plane.

The index, load and unload run on :class:`~corral.protocol.control.ControlThreads`, the
daemon threads with a bounded wait that the data plane's own calls that may touch storage
share (:attr:`ModelControl.threads`): one cap for every such call of the server.

Example::

    control = ModelControl(host, explicit=True)
    plane = DataPlane(host, control=control)
    await control.load("fraud")
    response = await plane.infer("fraud", None, request)
"""

from __future__ import annotations

import copy
import dataclasses
import threading
from collections.abc import Callable, Mapping, Sequence

from corral._base import (
    ChangeListeners,
    CorralError,
    InvalidModelName,
    ModelLoadError,
    ModelNotFound,
)
from corral._host import Host, ModelState, ModelStatus
from corral.protocol.control import CONTROL_TIMEOUT_S, ControlThreads
from corral.protocol.paths import public_text
from corral.protocol.types import RepositoryModel

__all__ = ["UNLOAD_TIMEOUT_S", "ModelControl", "ModelControlUnsupported"]

#: Seconds an unload through the protocol waits for a load in flight and for leases to end;
#: past it the caller gets DrainTimeout (the model is left as it was or closes with its last
#: lease).
UNLOAD_TIMEOUT_S = 30.0


class ModelControlUnsupported(CorralError):
    """A load or unload through the repository API that this server does not do; says why.

    HTTP 501, gRPC UNIMPLEMENTED: the same answer on every retry, until the server's options
    change (``corral serve --processes N``: a load would reach one process of N).
    """


# Triton's state names for the repository index.
_REPOSITORY_STATES = {
    ModelState.READY: "READY",
    ModelState.LOADING: "LOADING",
    ModelState.UNLOADING: "UNLOADING",
    ModelState.UNLOADED: "UNAVAILABLE",
    ModelState.FAILED: "UNAVAILABLE",
}


class ModelControl:
    """Triton's repository API on one Host, and which models it serves; safe from any thread.

    ``explicit``: Triton's explicit model control, only the models loaded through
    :meth:`load` or :meth:`preload` are served (others: :class:`ModelNotFound`, and not
    ready). ``loads_at_start``: :attr:`preloaded` is False until :meth:`preload` returns.
    ``strict_readiness`` (Triton's ``--strict-readiness``): :attr:`preloaded` stays False
    while a model :meth:`preload` failed to load has not been loaded since (:meth:`load`).
    ``threads``: the control plane's threads, to share with another owner (a new set by
    default). ``unsupported``: why :meth:`load` and :meth:`unload` are refused
    (:class:`ModelControlUnsupported`), None when they are not. ``overrides_unsupported``:
    why a load that gives a ``config`` or ``files`` is refused, None when it is not.
    """

    def __init__(
        self,
        host: Host,
        *,
        explicit: bool = False,
        loads_at_start: bool = False,
        strict_readiness: bool = False,
        control_timeout_s: float = CONTROL_TIMEOUT_S,
        unload_timeout_s: float = UNLOAD_TIMEOUT_S,
        threads: ControlThreads | None = None,
        unsupported: str | None = None,
        overrides_unsupported: str | None = None,
    ) -> None:
        self._host = host
        self._unsupported = unsupported
        self._overrides_unsupported = overrides_unsupported
        self._threads = ControlThreads() if threads is None else threads
        self._control_timeout_s = control_timeout_s
        self._unload_timeout_s = unload_timeout_s
        # Guards _unloaded: the models unloaded through the protocol since they were last seen
        # ready, which a readiness request must not load again (Triton's clients unload, then
        # expect "not ready").
        self._unloaded_lock = threading.Lock()
        self._unloaded: set[str] = set()
        # Triton's explicit model control: only the models loaded through load() or
        # preload() are served. Guards _explicit: those models' names.
        self._explicit_only = explicit
        self._explicit_lock = threading.Lock()
        self._explicit: set[str] = set()
        # Set once the models to load at start are loaded (preload): the server is not ready
        # before.
        self._started = threading.Event()
        if not loads_at_start:
            self._started.set()
        # Guards _failed_at_start: the models preload() failed to load and no load has loaded
        # since; under strict readiness the server is not ready while there is one (Triton's
        # "all models ready").
        self._strict_readiness = strict_readiness
        self._failed_lock = threading.Lock()
        self._failed_at_start: set[str] = set()
        #: Told of each change to what it serves: a model's name as it is loaded or unloaded
        #: through it, None once the models to load at start are (the server's readiness).
        self.listeners = ChangeListeners()

    @property
    def threads(self) -> ControlThreads:
        """The control plane's threads: every call that may touch storage or wait for a load."""
        return self._threads

    @property
    def explicit(self) -> bool:
        """True under explicit model control: only the models loaded through it are served."""
        return self._explicit_only

    @property
    def preloaded(self) -> bool:
        """True once :meth:`preload` returned, or from the start without ``loads_at_start``.

        Under ``strict_readiness``, also False while a model it failed to load is not loaded.
        """
        if not self._started.is_set():
            return False
        if not self._strict_readiness:
            return True
        with self._failed_lock:
            return not self._failed_at_start

    # -- what the data plane asks -----------------------------------------------------------

    def check_served(self, name: str) -> None:
        """Raise :class:`ModelNotFound` if explicit model control does not serve ``name``."""
        if not self._explicit_only:
            return
        with self._explicit_lock:
            if name in self._explicit:
                return
        raise ModelNotFound(
            f"Request for unknown model: {name!r} is not loaded: under explicit model control "
            f"only models loaded with POST /v2/repository/models/{name}/load (or --load-model) "
            "are served"
        )

    def ready_answer(self, name: str) -> bool:
        """What a readiness request answers for ``name``, found loaded and serving.

        True, but under explicit model control for a model not loaded through it. A model
        seen ready is no longer one unloaded through the protocol: from then on a readiness
        request may load it again.
        """
        if self._explicit_only:
            with self._explicit_lock:
                return name in self._explicit
        with self._unloaded_lock:
            self._unloaded.discard(name)
        return True

    def readiness_may_load(self, name: str) -> bool:
        """Whether a readiness request may load ``name``, found not loaded.

        Not under explicit model control (only :meth:`load` loads), nor a model unloaded
        through the protocol and not seen ready since.
        """
        if self._explicit_only:
            return False
        with self._unloaded_lock:
            return name not in self._unloaded

    # -- the repository API -----------------------------------------------------------------

    def preload(
        self,
        names: Sequence[str] | None,
        progress: Callable[[int, int, str, CorralError | None], None] | None = None,
    ) -> dict[str, CorralError]:
        """Load these models (None: every model) on the load workers; blocking.

        With ``loads_at_start``, :attr:`preloaded` is False until this returns. For
        ``corral serve --load-model``: run it on a thread of its own. Under explicit model
        control the models loaded are the ones served. Returns ``{name: error}`` for those
        that failed (:meth:`Host.preload`).
        """
        try:
            todo = self._host.repository.names() if names is None else list(names)
            failures = self._host.preload(todo, progress)
            with self._explicit_lock:
                self._explicit.update(name for name in todo if name not in failures)
            with self._failed_lock:
                self._failed_at_start.update(failures)
            return failures
        finally:
            self._started.set()
            self.listeners.notify(None)

    async def repository_index(self, *, ready_only: bool = False) -> list[RepositoryModel]:
        """Every model in the repository, one row per version the Host knows of."""
        return await self._threads.run(
            "the repository index", self._control_timeout_s, self._repository_index, ready_only
        )

    def _repository_index(self, ready_only: bool) -> list[RepositoryModel]:
        rows: list[RepositoryModel] = []
        for model in self._host.models():  # lists the repository's folder
            rows.extend(_index_rows(model, ready_only))
        # A reason is a failure's text: told to clients without the server's folders.
        return [
            dataclasses.replace(row, reason=public_text(self._host, row.reason))
            if row.reason
            else row
            for row in rows
        ]

    async def load(
        self,
        name: str,
        *,
        config: str | None = None,
        files: Mapping[str, bytes] | None = None,
    ) -> None:
        """Load (or reload) a model now; its errors are raised.

        ``config`` and ``files`` are Triton's load parameters (``config``, ``file:<path>``
        without its prefix), passed to :meth:`Host.load`: a JSON model configuration and the
        model folder's files, used instead of the repository's until a later load.

        The message of a :class:`ModelNotFound` or :class:`ModelLoadError` starts with
        ``failed to load '<name>': ``, the words Triton's clients match on.

        Bounded by the Host's ``load_timeout_s`` (:class:`LoadTimeout`). Refused with
        :class:`ModelControlUnsupported` when the server was built without loads and unloads,
        or, for a load with a ``config`` or ``files``, without such loads.
        """
        self._check_supported("load", name)
        if self._overrides_unsupported is not None and (config is not None or files):
            raise ModelControlUnsupported(
                f"cannot load model {name!r} with a config or files through the repository "
                f"API: {self._overrides_unsupported}"
            )
        try:
            await self._threads.run(
                f"loading model {name!r}", None, self._host.load, name, config=config, files=files
            )
        except (ModelNotFound, ModelLoadError) as exc:
            raise _failed_to_load(name, exc) from exc
        with self._unloaded_lock:
            self._unloaded.discard(name)
        with self._explicit_lock:
            self._explicit.add(name)
        with self._failed_lock:
            retried = name in self._failed_at_start
            self._failed_at_start.discard(name)
        self.listeners.notify(name)
        if retried:
            self.listeners.notify(None)  # readiness may have changed

    async def unload(self, name: str, *, drop_upload: bool = False) -> None:
        """Unload every version of a model; requests in flight finish first.

        Waits at most ``unload_timeout_s`` for a load in flight and for those requests:
        then :class:`DrainTimeout`, naming the timeout. ``drop_upload``: also drop the config
        and files a load gave it (:meth:`Host.unload`), so a model only uploaded is gone.
        Refused with :class:`ModelControlUnsupported` as :meth:`load` is.
        """
        self._check_supported("unload", name)
        with self._unloaded_lock:
            self._unloaded.add(name)  # before: a readiness request meanwhile must not reload it
        with self._explicit_lock:
            self._explicit.discard(name)  # before: no new request is let in meanwhile
        self.listeners.notify(name)
        try:
            await self._threads.run(
                f"unloading model {name!r}",
                None,
                self._host.unload,
                name,
                timeout=self._unload_timeout_s,
                drop_upload=drop_upload,
            )
        except (ModelNotFound, InvalidModelName):
            with self._unloaded_lock:
                self._unloaded.discard(name)  # no such model: nothing to remember
            raise

    def _check_supported(self, doing: str, name: str) -> None:
        if self._unsupported is not None:
            raise ModelControlUnsupported(
                f"cannot {doing} model {name!r} through the repository API: {self._unsupported}"
            )


def _failed_to_load(name: str, error: CorralError) -> CorralError:
    # The same type, its message led by Triton's words ("failed to load 'simple', ...").
    prefixed = copy.copy(error)
    prefixed.args = (f"failed to load {name!r}: {error}",)
    return prefixed


def _index_rows(model: ModelStatus, ready_only: bool) -> list[RepositoryModel]:
    rows = [
        RepositoryModel(
            model.name,
            str(version.version),
            _REPOSITORY_STATES[version.state],
            # A version not ready that the model's own failure (its layout, its settings, a
            # problem the repository check found) keeps from loading gives that reason.
            version.failure
            or (model.failure if version.state is not ModelState.READY else None)
            or "",
        )
        for version in model.versions
        if not ready_only or version.state is ModelState.READY
    ]
    if not rows and not ready_only:
        rows.append(RepositoryModel(model.name, "", "UNAVAILABLE", model.failure or ""))
    return rows
