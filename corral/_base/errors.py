"""corral's exceptions: one tree, rooted at :class:`CorralError`.

::

    CorralError
    ├── InvalidOption          an option of a Runtime, Host or server is malformed or out of range
    │   └── RuntimeConfigError the process Runtime is already set up otherwise
    ├── RuntimeClosed          the Runtime has shut down (or was superseded before it started)
    ├── ProviderUnavailable    an execution provider asked for is not in this onnxruntime build
    ├── RepositoryError        the model repository itself is unusable (missing root, not a folder)
    ├── InvalidModelName       a model name that cannot name a model (empty, "..", "/", too long)
    ├── ModelNotFound          no such model, or no such version of it, in the repository
    ├── ModelLoadError         the model could not be loaded; as such, what may pass (a
    │   │                      storage error, no room in the budget for now)
    │   ├── ModelInvalid       what is on disk cannot be served as it is (not ONNX, a graph
    │   │   │                  onnxruntime refuses, a bad layout): it fails again until it changes
    │   │   └── ModelConfigError  its model.toml, config.pbtxt, or a load's config or files
    │   │       │                 are malformed or refused; the message says where and why
    │   │       └── LoadRequestInvalid  a load request's own config or files are refused
    │   │           └── UploadRefused  a load's file: parameters name a path corral will
    │   │               │              not write
    │   │               └── UploadTooLarge  they would take the uploads past max_upload_bytes
    │   ├── ModelTooLarge      it alone is larger than the Host's whole memory budget (or
    │   │                      than the whole cache of the object store it comes from)
    │   ├── LoadTimeout        its load did not finish within the Host's load timeout
    │   └── StoreUnavailable   its files could not be fetched from the object store in time
    ├── SessionClosed          a run was asked of a Session after close() began
    ├── HostClosed             a request was made of a Host after close() began
    ├── InvalidInput           an input tensor is missing, unknown, or of the wrong dtype or shape
    ├── InferenceError         onnxruntime failed while running the model
    │   └── RunCancelled       the run was stopped between nodes (RunOptions.terminate)
    ├── DeadlineExceeded       the request's timeout passed before it was answered
    ├── Overloaded             a queue is full: the request is refused at once, not queued
    └── DrainTimeout           close or shutdown gave up waiting for runs still in flight

The classes carry no HTTP or gRPC status: each transport owns its own ``{class: status}``
table. onnxruntime's own exceptions are turned into these in one place, ``corral._onnx.ort``,
always chained (``raise ... from exc``) so the original message stays visible.
"""

from __future__ import annotations

import copy
from typing import TypeVar

__all__ = [
    "CorralError",
    "DeadlineExceeded",
    "DrainTimeout",
    "HostClosed",
    "InferenceError",
    "InvalidInput",
    "InvalidModelName",
    "InvalidOption",
    "LoadRequestInvalid",
    "LoadTimeout",
    "ModelConfigError",
    "ModelInvalid",
    "ModelLoadError",
    "ModelNotFound",
    "ModelTooLarge",
    "Overloaded",
    "ProviderUnavailable",
    "RepositoryError",
    "RunCancelled",
    "RuntimeClosed",
    "RuntimeConfigError",
    "SessionClosed",
    "StoreUnavailable",
    "UploadRefused",
    "UploadTooLarge",
]


class CorralError(Exception):
    """The root of every exception corral raises on purpose."""


class InvalidOption(CorralError, ValueError):
    """An option is malformed or out of range; the message names the option and the value.

    One type for every options object (:class:`corral.RuntimeOptions`,
    :class:`corral.HostOptions`, the server's settings, Ray's config), so that a caller
    catches one thing. Also a ``ValueError``, as a bad argument is.
    """

    def __init__(self, message: str, *, option: str | None = None) -> None:
        super().__init__(message)
        #: The option's name (a field of the options object), when one option is at fault.
        self.option = option


class RuntimeConfigError(InvalidOption):
    """The process Runtime cannot take these options.

    Raised when options differ from those of the Runtime that already started (onnxruntime's
    global pools are set once per process), or when an option is out of range. The message
    says what is already set.
    """


class RuntimeClosed(CorralError):
    """The Runtime has shut down and takes no new sessions."""


class ProviderUnavailable(CorralError):
    """An execution provider was asked for that this onnxruntime build does not have.

    corral never falls back to another provider silently.
    """


class RepositoryError(CorralError):
    """The model repository cannot be used at all: its root is missing or not a folder."""


class InvalidModelName(CorralError):
    """A name that cannot name a model; the message says which rule it breaks."""


class ModelNotFound(CorralError):
    """No model of that name, or no such version of it, is in the repository (or served)."""


class ModelLoadError(CorralError):
    """The model could not be loaded; the message says why.

    Raised as such for what may pass: a file that could not be read (storage unreachable),
    no room in the memory budget while other models are in use, an unexpected fault. Its
    subclasses say more: :class:`ModelInvalid` for what is on disk, :class:`ModelTooLarge`,
    :class:`LoadTimeout`.
    """


class ModelInvalid(ModelLoadError):
    """What is on disk cannot be served as it is: loading again fails the same way.

    The file is not ONNX, onnxruntime refuses its graph, the model's files are laid out
    wrongly or lead outside the repository, or (:class:`ModelConfigError`) its settings are
    refused. The Host keeps the failure until the model's files change; the next request
    after they do loads again at once.
    """


class ModelConfigError(ModelInvalid):
    """A model's settings or a load's config or files are malformed or refused.

    The source is its ``model.toml``, its ``config.pbtxt``, or a load's ``config`` or files;
    the message names it, the field and why.
    """


class LoadRequestInvalid(ModelConfigError):
    """A load request's own ``config`` or files are malformed or refused.

    Not JSON, not a model configuration, files without a config, or a config or files the
    model cannot be loaded with: the request is at fault, and nothing it asked for is kept.
    """


class UploadRefused(LoadRequestInvalid):
    """A load's ``file:`` parameters name a path or content corral will not write.

    The message starts with Triton's words for it ("failed to poll from model repository"),
    which its clients match on.
    """


class UploadTooLarge(UploadRefused):
    """A load's files would take what the uploads hold past the Host's ``max_upload_bytes``."""


class ModelTooLarge(ModelLoadError):
    """The model alone is larger than the whole memory budget, so no eviction can fit it.

    Or, for a repository in object storage, its files are larger than the whole local cache
    (``cache_bytes``): no eviction there can fit them either.
    """


class LoadTimeout(ModelLoadError):
    """The load did not finish within the Host's ``load_timeout_s`` (a hung disk or mount).

    The load is marked failed (with the usual back-off) and its thread abandoned: whatever it
    builds, if it ever returns, is closed rather than served.
    """


class StoreUnavailable(ModelLoadError):
    """The object store could not be listed or read within the fetch's deadline; retry later.

    The message names the repository URL and the reason, never a credential.
    """

    def __init__(self, message: str, *, store: str = "") -> None:
        super().__init__(message)
        #: The repository URL, as given (a copy, :func:`fresh`'s, keeps it too).
        self.store = store


class SessionClosed(CorralError):
    """The Session is closing or closed; no new run is accepted."""


class HostClosed(CorralError):
    """The Host is closing or closed and takes no new requests."""


class InvalidInput(CorralError):
    """An input does not match the model's signature.

    The message names the tensor, what the model expects and what was given.
    """

    def __init__(self, message: str, *, tensor: str | None = None) -> None:
        super().__init__(message)
        #: The name of the offending tensor, when one tensor is at fault.
        self.tensor = tensor


class InferenceError(CorralError):
    """onnxruntime raised while running the model."""


class RunCancelled(InferenceError):
    """The run was stopped between graph nodes before it finished (shutdown or cancel)."""


class DeadlineExceeded(CorralError, TimeoutError):
    """The request's timeout passed before it could be answered."""


class Overloaded(CorralError):
    """A queue is full; the request was refused at once rather than left to wait unbounded."""


class DrainTimeout(CorralError, TimeoutError):
    """Runs were still in flight when close or shutdown stopped waiting.

    Nothing is released under a run: whatever is still running is released when its last run
    ends.
    """


_Error = TypeVar("_Error", bound=BaseException)


def fresh(error: _Error) -> _Error:
    """A copy of a kept error, to raise to one more caller.

    Raising the kept object itself would append each caller's frames to its traceback, which
    would then hold every caller's frames (and their request tensors) for as long as the
    error is kept: one failed model answering requests through its back-off would grow
    without bound.
    """
    clone = copy.copy(error)
    clone.__cause__ = error.__cause__
    clone.__traceback__ = None
    return clone


def drop_frames(error: BaseException) -> None:
    """Clear the tracebacks of ``error`` and of the errors it was raised from or during.

    For an error answered to a caller after it was logged: its frames, and those of its
    causes (a load's error re-raised through the caller's coroutines), would keep the caller's
    call and request alive until a garbage collection, or longer. On Python 3.12 and 3.13 a
    gRPC call's context and server outlived the call that way (3.11 freed them).
    """
    seen: set[int] = set()
    link: BaseException | None = error
    while link is not None and id(link) not in seen:
        seen.add(id(link))
        link.__traceback__ = None
        link = link.__cause__ or link.__context__
