"""Running models, on :mod:`corral._base` and :mod:`corral._onnx`.

The process's Runtime (onnxruntime's global pools, the compute workers, the lifecycle),
Session (concurrency policies, leases), PythonSession (a Triton ``model.py`` run as a
Session), the scheduler with its queues, batching and its proofs, run counters, and the
inline lane.

This is the folder's face: the layers above import these names from here, never a module
inside it (tests/test_layers.py).
"""

from corral._compute.batching import UNBATCHED, inference_error, shape_key, split_rows, stack
from corral._compute.counters import (
    DEFAULT_MODEL_LATENCY_HISTOGRAMS,
    LOAD_FAILURE_REASONS,
    REQUEST_FAILURE_REASONS,
    REQUEST_SECONDS_BUCKETS,
    HostCounters,
    LatencyStats,
    RequestStats,
    RunCounters,
    load_failure_reason,
    request_failure_reason,
)
from corral._compute.inline import (
    DEFAULT_INLINE_RUN_US,
    InlineLane,
    LaneState,
    TimedRuns,
    lane_at_load,
    measure_lane,
)
from corral._compute.probe import BatchPlan, one_line, plan_batching
from corral._compute.process_runtime import (
    Runtime,
    RuntimeOptions,
    RuntimeState,
    RuntimeStats,
    runtime,
)
from corral._compute.python.session import PythonSession, SignatureRunner, python_signature
from corral._compute.queue import (
    DEFAULT_MAX_BATCH_SIZE,
    DEFAULT_QUEUE_LIMIT,
    ModelQueue,
    QueueKey,
    QueueStats,
)
from corral._compute.scheduler import Scheduler, deadline_after, time_left
from corral._compute.session import Lease, Session, SessionState

__all__ = [
    "DEFAULT_INLINE_RUN_US",
    "DEFAULT_MAX_BATCH_SIZE",
    "DEFAULT_MODEL_LATENCY_HISTOGRAMS",
    "DEFAULT_QUEUE_LIMIT",
    "LOAD_FAILURE_REASONS",
    "REQUEST_FAILURE_REASONS",
    "REQUEST_SECONDS_BUCKETS",
    "UNBATCHED",
    "BatchPlan",
    "HostCounters",
    "InlineLane",
    "LaneState",
    "LatencyStats",
    "Lease",
    "ModelQueue",
    "PythonSession",
    "QueueKey",
    "QueueStats",
    "RequestStats",
    "RunCounters",
    "Runtime",
    "RuntimeOptions",
    "RuntimeState",
    "RuntimeStats",
    "Scheduler",
    "Session",
    "SessionState",
    "SignatureRunner",
    "TimedRuns",
    "deadline_after",
    "inference_error",
    "lane_at_load",
    "load_failure_reason",
    "measure_lane",
    "one_line",
    "plan_batching",
    "python_signature",
    "request_failure_reason",
    "runtime",
    "shape_key",
    "split_rows",
    "stack",
    "time_left",
]
