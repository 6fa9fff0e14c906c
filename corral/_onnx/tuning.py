"""SessionTuning: the onnxruntime session options one model may set (model.toml, Session).

These matter for large models: how hard onnxruntime optimizes the graph when it loads, whether
independent branches run in parallel (on the Runtime's inter-op threads), and how many threads
one run uses. Every value is checked here, by name; nothing is passed to onnxruntime unchecked.

Threads are the constraint (``corral._onnx.ort`` has the facts): under the Runtime's global pools
(its default, ``thread_pools="global"``) every session runs on the same intra-op pool and
onnxruntime ignores a session's own thread count, so a model may ask only for the pool's size.
A model that needs its own count needs a Runtime with ``thread_pools="per_session"``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

__all__ = ["EXECUTION_MODES", "GRAPH_OPTIMIZATION_LEVELS", "SessionTuning"]

GraphOptimizationLevel = Literal["disable", "basic", "extended", "all"]
ExecutionMode = Literal["sequential", "parallel"]

#: model.toml's names for onnxruntime's ``GraphOptimizationLevel`` members.
GRAPH_OPTIMIZATION_LEVELS: dict[str, str] = {
    "disable": "ORT_DISABLE_ALL",
    "basic": "ORT_ENABLE_BASIC",
    "extended": "ORT_ENABLE_EXTENDED",
    "all": "ORT_ENABLE_ALL",
}
#: model.toml's names for onnxruntime's ``ExecutionMode`` members.
EXECUTION_MODES: dict[str, str] = {"sequential": "ORT_SEQUENTIAL", "parallel": "ORT_PARALLEL"}


@dataclass(frozen=True)
class SessionTuning:
    """Session options for one model; None everywhere leaves onnxruntime's defaults.

    Raises ValueError naming the field and the accepted values.
    """

    #: ``disable``, ``basic``, ``extended`` or ``all`` (onnxruntime's default: ``all``).
    graph_optimization_level: str | None = None
    #: ``sequential`` (the default) or ``parallel``: independent nodes at once, on the
    #: Runtime's inter-op threads.
    execution_mode: str | None = None
    #: Threads one run of this model uses; see the module's note on thread pools.
    intra_op_threads: int | None = None

    def __post_init__(self) -> None:
        for name, table in (
            ("graph_optimization_level", GRAPH_OPTIMIZATION_LEVELS),
            ("execution_mode", EXECUTION_MODES),
        ):
            value = getattr(self, name)
            if value is not None and (not isinstance(value, str) or value not in table):
                raise ValueError(
                    f"{name} must be one of {', '.join(map(repr, table))}, got {value!r}"
                )
        threads = self.intra_op_threads
        if threads is not None and (
            isinstance(threads, bool) or not isinstance(threads, int) or threads < 1
        ):
            raise ValueError(f"intra_op_threads must be an integer >= 1, got {threads!r}")

    def apply(self, options: Any, ort: Any) -> None:
        """Set these values on an onnxruntime ``SessionOptions`` (threads are the Runtime's)."""
        if self.graph_optimization_level is not None:
            level = GRAPH_OPTIMIZATION_LEVELS[self.graph_optimization_level]
            options.graph_optimization_level = getattr(ort.GraphOptimizationLevel, level)
        if self.execution_mode is not None:
            mode = EXECUTION_MODES[self.execution_mode]
            options.execution_mode = getattr(ort.ExecutionMode, mode)
