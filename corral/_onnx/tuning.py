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

import re
from dataclasses import dataclass
from typing import Any, Literal

from corral._onnx.ort import new_run_options
from corral._onnx.session_config import check_session_config

__all__ = ["ARENA_SHRINKAGE_KEY", "EXECUTION_MODES", "GRAPH_OPTIMIZATION_LEVELS", "SessionTuning"]

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


#: ``memory.enable_memory_arena_shrinkage``'s value: devices, ``;``-separated.
_SHRINKAGE = re.compile(r"(cpu:0|gpu:[0-9]{1,4})(;(cpu:0|gpu:[0-9]{1,4}))*")

#: The run configuration key onnxruntime reads ``arena_shrinkage`` from.
ARENA_SHRINKAGE_KEY = "memory.enable_memory_arena_shrinkage"


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
    #: Threads of the parallel execution mode's inter-op pool; same note.
    inter_op_threads: int | None = None
    #: Whether the session pools its CPU memory in an arena; None: the Runtime's ``arena``.
    #: False gives this model no arena (not the Runtime's shared one either).
    cpu_mem_arena: bool | None = None
    #: onnxruntime's memory pattern (plan a run's allocations from the previous run's);
    #: None: onnxruntime's default (on).
    mem_pattern: bool | None = None
    #: onnxruntime session configuration entries, sorted ``(key, value)`` pairs, each key
    #: one of :data:`corral._onnx.session_config.SESSION_CONFIG_KEYS`.
    session_config: tuple[tuple[str, str], ...] = ()
    #: onnxruntime's ``memory.enable_memory_arena_shrinkage`` run setting: the devices whose
    #: arena is shrunk after each run, ``"cpu:0"`` or ``"gpu:<id>"``, ``;``-separated; None:
    #: none. A device without an arena fails every run, as in onnxruntime.
    arena_shrinkage: str | None = None

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
        for name in ("intra_op_threads", "inter_op_threads"):
            threads = getattr(self, name)
            if threads is not None and (
                isinstance(threads, bool) or not isinstance(threads, int) or threads < 1
            ):
                raise ValueError(f"{name} must be an integer >= 1, got {threads!r}")
        for name in ("cpu_mem_arena", "mem_pattern"):
            value = getattr(self, name)
            if value is not None and not isinstance(value, bool):
                raise ValueError(f"{name} must be true or false, got {value!r}")
        entries: object = self.session_config
        if isinstance(entries, dict):
            entries = tuple(entries.items())
        if not isinstance(entries, tuple | list) or not all(
            isinstance(pair, tuple | list) and len(pair) == 2 for pair in entries
        ):
            raise ValueError(f"session_config must be a table of keys and values, got {entries!r}")
        object.__setattr__(self, "session_config", check_session_config(entries))
        shrinkage = self.arena_shrinkage
        if shrinkage is not None and (
            not isinstance(shrinkage, str) or not _SHRINKAGE.fullmatch(shrinkage)
        ):
            raise ValueError(
                "arena_shrinkage must list devices as 'cpu:0' or 'gpu:<id>', separated by ';', "
                f"got {shrinkage!r}"
            )

    def run_options(self) -> Any:
        """Fresh ``RunOptions`` for one run of this model, None when it needs none of its own.

        Only a model that shrinks its arena needs them: a run configuration entry cannot be
        taken off, so such options are never shared with other models' runs.
        """
        if self.arena_shrinkage is None:
            return None
        options = new_run_options()
        options.add_run_config_entry(ARENA_SHRINKAGE_KEY, self.arena_shrinkage)
        return options

    def apply(self, options: Any, ort: Any) -> None:
        """Set these values on an onnxruntime ``SessionOptions``.

        Threads and the arena are the Runtime's (``Runtime._session_options``), which made
        ``options``.
        """
        if self.graph_optimization_level is not None:
            level = GRAPH_OPTIMIZATION_LEVELS[self.graph_optimization_level]
            options.graph_optimization_level = getattr(ort.GraphOptimizationLevel, level)
        if self.execution_mode is not None:
            mode = EXECUTION_MODES[self.execution_mode]
            options.execution_mode = getattr(ort.ExecutionMode, mode)
        if self.mem_pattern is not None:
            options.enable_mem_pattern = self.mem_pattern
        for key, value in self.session_config:
            options.add_session_config_entry(key, value)
