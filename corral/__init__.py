"""corral: serve thousands of ONNX models from one Python process, safely and fast.

The public API, re-exported from one-concept private modules. Importing corral starts
nothing: no threads, no logging setup, no onnxruntime environment until a Runtime starts.

- :class:`Runtime`, :func:`runtime`: the process-wide onnxruntime environment and pools.
- :class:`Session`, :class:`Lease`: one model, safe to create, run and close from any thread.
- :class:`ConcurrencyPolicy`, :data:`PROVIDER_TABLE`: how sessions let threads run.
- :class:`TensorSpec`: a model input or output.
- :class:`Repository`, :class:`ModelConfig`: where models live and how each is configured.
- :class:`Problem`, :class:`ProblemKind`: what :meth:`Host.check` finds wrong in a repository.
- :class:`Host`, :class:`HostLease`, :class:`HostOptions`: thousands of models by name, lazily
  loaded under a budget.
- :class:`QueueStats`, :class:`RequestStats`: what a Host's model versions have queued, run
  and answered.
- The exceptions, rooted at :class:`CorralError`.
"""

from corral._base import (
    CorralError,
    DeadlineExceeded,
    DrainTimeout,
    Event,
    EventKind,
    HostClosed,
    InferenceError,
    InvalidInput,
    InvalidModelName,
    InvalidOption,
    LoadRequestInvalid,
    LoadTimeout,
    ModelConfigError,
    ModelInvalid,
    ModelLoadError,
    ModelNotFound,
    ModelTooLarge,
    Overloaded,
    Problem,
    ProblemKind,
    ProviderUnavailable,
    RepositoryError,
    RunCancelled,
    RuntimeClosed,
    RuntimeConfigError,
    SessionClosed,
    StoreUnavailable,
    UploadRefused,
    UploadTooLarge,
)
from corral._compute import (
    Lease,
    QueueStats,
    RequestStats,
    Runtime,
    RuntimeOptions,
    RuntimeState,
    RuntimeStats,
    Session,
    SessionState,
    runtime,
)
from corral._host import (
    Host,
    HostLease,
    HostOptions,
    HostState,
    HostStats,
    ModelState,
    ModelStatus,
    VersionSettings,
    VersionStatus,
)
from corral._models import ModelConfig, ModelEntry, ModelVersion, Repository, VersionPolicy
from corral._onnx import PROVIDER_TABLE, ConcurrencyPolicy, ProviderTraits, TensorSpec

__version__ = "0.1.0"

__all__ = [
    "PROVIDER_TABLE",
    "ConcurrencyPolicy",
    "CorralError",
    "DeadlineExceeded",
    "DrainTimeout",
    "Event",
    "EventKind",
    "Host",
    "HostClosed",
    "HostLease",
    "HostOptions",
    "HostState",
    "HostStats",
    "InferenceError",
    "InvalidInput",
    "InvalidModelName",
    "InvalidOption",
    "Lease",
    "LoadRequestInvalid",
    "LoadTimeout",
    "ModelConfig",
    "ModelConfigError",
    "ModelEntry",
    "ModelInvalid",
    "ModelLoadError",
    "ModelNotFound",
    "ModelState",
    "ModelStatus",
    "ModelTooLarge",
    "ModelVersion",
    "Overloaded",
    "Problem",
    "ProblemKind",
    "ProviderTraits",
    "ProviderUnavailable",
    "QueueStats",
    "Repository",
    "RepositoryError",
    "RequestStats",
    "RunCancelled",
    "Runtime",
    "RuntimeClosed",
    "RuntimeConfigError",
    "RuntimeOptions",
    "RuntimeState",
    "RuntimeStats",
    "Session",
    "SessionClosed",
    "SessionState",
    "StoreUnavailable",
    "TensorSpec",
    "UploadRefused",
    "UploadTooLarge",
    "VersionPolicy",
    "VersionSettings",
    "VersionStatus",
    "__version__",
    "runtime",
]
