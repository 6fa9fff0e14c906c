"""corral's exceptions: one tree, rooted at :class:`CorralError`.

::

    CorralError
    ├── RuntimeConfigError     the process Runtime is already set up otherwise, or an option is bad
    ├── RuntimeClosed          the Runtime has shut down (or was superseded before it started)
    ├── ProviderUnavailable    an execution provider asked for is not in this onnxruntime build
    ├── ModelLoadError         onnxruntime could not load the model (file, graph, operator)
    ├── SessionClosed          a run was asked of a Session after close() began
    ├── InvalidInput           an input tensor is missing, unknown, or of the wrong dtype or shape
    ├── InferenceError         onnxruntime failed while running the model
    │   └── RunCancelled       the run was stopped between nodes (RunOptions.terminate)
    ├── DrainTimeout           close or shutdown gave up waiting for runs still in flight
    └── WorkerFailed           (corral.bench.demo) a demo worker process failed

The classes carry no HTTP or gRPC status: each transport owns its own ``{class: status}``
table. onnxruntime's own exceptions are turned into these in one place, ``corral._ort``,
always chained (``raise ... from exc``) so the original message stays visible.
"""

from __future__ import annotations

__all__ = [
    "CorralError",
    "DrainTimeout",
    "InferenceError",
    "InvalidInput",
    "ModelLoadError",
    "ProviderUnavailable",
    "RunCancelled",
    "RuntimeClosed",
    "RuntimeConfigError",
    "SessionClosed",
]


class CorralError(Exception):
    """The root of every exception corral raises on purpose."""


class RuntimeConfigError(CorralError):
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


class ModelLoadError(CorralError):
    """onnxruntime could not create a session for the model; the message says why."""


class SessionClosed(CorralError):
    """The Session is closing or closed; no new run is accepted."""


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


class DrainTimeout(CorralError, TimeoutError):
    """Runs were still in flight when close or shutdown stopped waiting.

    Nothing is released under a run: whatever is still running is released when its last run
    ends.
    """
