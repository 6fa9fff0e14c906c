"""The public surface: what corral exports, and that importing it starts nothing."""

from __future__ import annotations

import subprocess
import sys

import corral


def test_public_names_are_pinned():
    assert sorted(corral.__all__) == sorted(
        [
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
            "ModelConfig",
            "ModelConfigError",
            "ModelEntry",
            "ModelInvalid",
            "ModelLoadError",
            "LoadRequestInvalid",
            "ModelNotFound",
            "ModelState",
            "ModelStatus",
            "LoadTimeout",
            "ModelTooLarge",
            "UploadRefused",
            "UploadTooLarge",
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
            "VersionPolicy",
            "VersionSettings",
            "VersionStatus",
            "__version__",
            "runtime",
        ]
    )
    for name in corral.__all__:
        assert hasattr(corral, name), name


def test_every_error_is_a_corral_error():
    errors = [
        corral.DeadlineExceeded,
        corral.HostClosed,
        corral.InvalidModelName,
        corral.ModelConfigError,
        corral.ModelNotFound,
        corral.ModelTooLarge,
        corral.UploadRefused,
        corral.UploadTooLarge,
        corral.LoadTimeout,
        corral.RepositoryError,
        corral.Overloaded,
        corral.DrainTimeout,
        corral.InferenceError,
        corral.InvalidInput,
        corral.ModelLoadError,
        corral.ProviderUnavailable,
        corral.RunCancelled,
        corral.RuntimeClosed,
        corral.RuntimeConfigError,
        corral.SessionClosed,
    ]
    for error in errors:
        assert issubclass(error, corral.CorralError)
    assert issubclass(corral.RunCancelled, corral.InferenceError)
    assert issubclass(corral.DrainTimeout, TimeoutError)
    assert issubclass(corral.DeadlineExceeded, TimeoutError)
    assert issubclass(corral.ModelConfigError, corral.ModelLoadError)
    assert issubclass(corral.ModelTooLarge, corral.ModelLoadError)
    assert issubclass(corral.LoadTimeout, corral.ModelLoadError)
    assert issubclass(corral.UploadRefused, corral.ModelConfigError)
    assert issubclass(corral.UploadTooLarge, corral.UploadRefused)


def test_import_starts_nothing():
    # numpy may start its BLAS threads; corral itself must add no thread, no onnxruntime
    # environment, no logging handler and no atexit hook.
    script = """
import atexit, logging, sys, threading
import numpy
before, hooks = threading.active_count(), atexit._ncallbacks()
import corral
assert threading.active_count() == before, threading.enumerate()
assert "onnxruntime" not in sys.modules, "onnxruntime imported at import time"
assert not logging.getLogger("corral").handlers
assert not logging.getLogger().handlers
assert atexit._ncallbacks() == hooks, atexit._ncallbacks()
print("ok")
"""
    result = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "ok"
