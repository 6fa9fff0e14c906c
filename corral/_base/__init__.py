"""Leaves of the core, which import nothing of corral.

The exception tree, option declarations, events, problems, histograms, trace hooks, delivery
onto an event loop, the load workers, child processes on two pipes, the interpreter's
description.

This is the folder's face: the layers above import these names from here, never a module
inside it (tests/test_layers.py).
"""

from corral._base.children import PipedChild, start_piped_child
from corral._base.declare import ENV_PREFIX, Declared, declared, given_by, option
from corral._base.delivery import Receiver, deliver
from corral._base.errors import (
    CorralError,
    DeadlineExceeded,
    DrainTimeout,
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
    ProviderUnavailable,
    RepositoryError,
    RunCancelled,
    RuntimeClosed,
    RuntimeConfigError,
    SessionClosed,
    StoreUnavailable,
    UploadRefused,
    UploadTooLarge,
    drop_frames,
    fresh,
)
from corral._base.events import ChangeListener, ChangeListeners, Event, EventKind, EventLog
from corral._base.extras import install_hint
from corral._base.histogram import Histogram
from corral._base.interpreter import describe_interpreter
from corral._base.load_workers import DEFAULT_ACTIVITY, MEASURING_ACTIVITY, Claim, LoadWorkers
from corral._base.periodic import Periodic
from corral._base.problems import Problem, ProblemKind
from corral._base.sizes import parse_bytes
from corral._base.trace_hooks import LoadObserver, LoadRecord, RunRecord, RunTrace

__all__ = [
    "DEFAULT_ACTIVITY",
    "ENV_PREFIX",
    "MEASURING_ACTIVITY",
    "ChangeListener",
    "ChangeListeners",
    "Claim",
    "CorralError",
    "DeadlineExceeded",
    "Declared",
    "DrainTimeout",
    "Event",
    "EventKind",
    "EventLog",
    "Histogram",
    "HostClosed",
    "InferenceError",
    "InvalidInput",
    "InvalidModelName",
    "InvalidOption",
    "LoadObserver",
    "LoadRecord",
    "LoadRequestInvalid",
    "LoadTimeout",
    "LoadWorkers",
    "ModelConfigError",
    "ModelInvalid",
    "ModelLoadError",
    "ModelNotFound",
    "ModelTooLarge",
    "Overloaded",
    "Periodic",
    "PipedChild",
    "Problem",
    "ProblemKind",
    "ProviderUnavailable",
    "Receiver",
    "RepositoryError",
    "RunCancelled",
    "RunRecord",
    "RunTrace",
    "RuntimeClosed",
    "RuntimeConfigError",
    "SessionClosed",
    "StoreUnavailable",
    "UploadRefused",
    "UploadTooLarge",
    "declared",
    "deliver",
    "describe_interpreter",
    "drop_frames",
    "fresh",
    "given_by",
    "install_hint",
    "option",
    "parse_bytes",
    "start_piped_child",
]
