"""model.toml: the per-model configuration, as frozen dataclasses.

A model folder may hold a ``model.toml`` next to its version folders::

    max_batch_size = 32          # 0: never batch; absent: decided from the model
    batch_window_us = 500        # absent: the scheduler's default
    concurrency = "pool:2"       # "auto", "shared", "exclusive" or "pool:N"
    providers = [{ name = "CUDAExecutionProvider", device_id = 1 }, "CPUExecutionProvider"]
    graph_optimization_level = "all"   # "disable", "basic", "extended" or "all"
    execution_mode = "sequential"      # or "parallel"
    intra_op_threads = 4         # needs the Runtime's per-session thread pools
    inter_op_threads = 2         # likewise (the parallel execution mode's threads)
    cpu_mem_arena = false        # no CPU arena for this model (absent: the Runtime's arena)
    mem_pattern = false          # onnxruntime's memory pattern (absent: on)
    arena_shrinkage = "cpu:0"    # shrink the CPU arena after each run
    pinned = true                # never evicted
    warmup = true                # run once on zeros after loading
    version_policy = { latest = 2 }
    custom_op_libraries = ["onnxruntime_extensions", "lib/libmyops.so"]
    response_cache = true        # answers kept in the server's response cache (--cache-config)
    memory_bytes = "64MiB"       # its charge against the memory budget: the user's word

``version_policy`` is ``"latest"``, ``"all"``, ``{ latest = N }`` or ``{ specific = [1, 3] }``;
Triton's spellings (``{ latest = { num_versions = N } }``, ``{ specific = { versions = [...] } }``,
``{ all = {} }``) are accepted too, so an existing repository's policy carries over.

``custom_op_libraries`` (config.pbtxt's ``model_operations { op_library_filename }``) names
libraries of custom operators registered with each of the model's sessions: a path relative
to the model's folder (it must stay inside it, symlinks followed: the repository checks it),
or ``"onnxruntime_extensions"``, the library of the onnxruntime-extensions package.

``[session_config]`` is a table of onnxruntime session configuration entries, applied with
``add_session_config_entry`` (``"session.set_denormal_as_zero" = "1"``). onnxruntime drops a
key it does not know without a word, so only the keys corral knows are taken
(:data:`corral._onnx.session_config.SESSION_CONFIG_KEYS`): any other is an error naming it,
the closest known key and the list.

``providers``' options are checked when the repository reads the settings, against what each
option names (:mod:`corral._models.provider_options`): an option corral does not know is
refused, and one that names a file must name it inside the model's folder.

Every mistake is an error, never a silent default: an unknown key (a typo), a wrong type
(``true`` is not a number), a negative number. :meth:`ModelConfig.from_toml` raises
:class:`ModelConfigError` naming the file, the field and what is wrong.
"""

from __future__ import annotations

import difflib
import tomllib
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, fields
from typing import Any, Literal

from corral._base import InvalidOption, ModelConfigError, parse_bytes
from corral._onnx import ConcurrencyPolicy, SessionTuning

__all__ = [
    "EnsembleStep",
    "ModelConfig",
    "ProviderEntry",
    "TensorConfig",
    "VersionPolicy",
    "VersionPolicyKind",
    "WarmupInput",
    "WarmupSample",
]

VersionPolicyKind = Literal["latest", "all", "specific"]

#: A provider as a ModelConfig holds it: a name, or a name and its options as sorted
#: ``(key, value)`` pairs, every value text (as onnxruntime takes them); hashable.
ProviderEntry = str | tuple[str, tuple[tuple[str, str], ...]]


class _FieldError(ValueError):
    """One field's value is wrong; ``str()`` is ``"<field> <problem>"``."""

    def __init__(self, name: str, problem: str) -> None:
        super().__init__(f"{name} {problem}")


def _check_positive_int(name: str, value: object) -> int:
    # bool is a subclass of int: `true` must not pass for 1.
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise _FieldError(name, f"must be an integer >= 1, got {_describe(value)}")
    return value


def _describe(value: object) -> str:
    """A value as a model.toml author would recognise it, with its TOML type."""
    if isinstance(value, bool):
        return f"the boolean {str(value).lower()}"
    if isinstance(value, int):
        return f"the integer {value}"
    if isinstance(value, float):
        return f"the float {value}"
    if isinstance(value, str):
        return f"the string {value!r}"
    if isinstance(value, list | tuple):
        return f"the array {_shorten(repr(list(value)))}"
    if isinstance(value, dict):
        return f"the table {_shorten(repr(value))}"
    return f"a {type(value).__name__} ({_shorten(repr(value))})"


def _shorten(text: str, limit: int = 80) -> str:
    return text if len(text) <= limit else text[: limit - 3] + "..."


@dataclass(frozen=True)
class VersionPolicy:
    """Which of a model's versions are served.

    - ``latest`` with ``count`` N: the N newest versions (the default serves the newest one).
    - ``all``: every version on disk.
    - ``specific`` with ``versions``: those listed, when they exist.

    ``str()`` gives ``"latest:1"``, ``"all"`` or ``"specific:1,3"``.
    """

    kind: VersionPolicyKind
    #: For ``latest``: how many of the newest versions are served.
    count: int = 1
    #: For ``specific``: the versions served (kept sorted, without duplicates).
    versions: tuple[int, ...] = ()

    def __post_init__(self) -> None:
        if self.kind not in ("latest", "all", "specific"):
            raise ValueError(
                f"version policy kind must be 'latest', 'all' or 'specific', got {self.kind!r}"
            )
        _check_positive_int("count", self.count)
        if self.kind != "latest" and self.count != 1:
            raise ValueError(f"count applies only to the 'latest' policy, not {self.kind!r}")
        if self.kind == "specific":
            if not self.versions:
                raise ValueError("the 'specific' policy needs at least one version")
            for version in self.versions:
                _check_positive_int("each version", version)
            # A set of versions: order and repeats carry no meaning, so equal policies compare
            # equal and print the same.
            object.__setattr__(self, "versions", tuple(sorted(set(self.versions))))
        elif self.versions:
            raise ValueError(f"versions apply only to the 'specific' policy, not {self.kind!r}")

    def select(self, available: Iterable[int]) -> tuple[int, ...]:
        """The versions served out of ``available``, ascending.

        >>> VersionPolicy("latest", 2).select([1, 5, 3])
        (3, 5)
        """
        ordered = sorted(set(available))
        if self.kind == "latest":
            return tuple(ordered[-self.count :])
        if self.kind == "all":
            return tuple(ordered)
        wanted = set(self.versions)
        return tuple(version for version in ordered if version in wanted)

    def __str__(self) -> str:
        if self.kind == "latest":
            return f"latest:{self.count}"
        if self.kind == "all":
            return "all"
        return "specific:" + ",".join(str(version) for version in self.versions)


@dataclass(frozen=True)
class TensorConfig:
    """An input or output as a Triton ``config.pbtxt`` declares it (``corral._models.pbtxt.parse``).

    Checked against the model when it loads: a declaration that does not match the model
    fails the load, so what ``/config`` reports is what the model takes.
    """

    name: str
    #: Triton's type name: ``TYPE_FP32``, ``TYPE_STRING`` (the protocol's BYTES) ...
    data_type: str
    #: Without the batch dimension when the model's max_batch_size is above 0; -1: any size.
    dims: tuple[int, ...]
    #: Inputs only: ``FORMAT_NONE``, ``FORMAT_NHWC`` or ``FORMAT_NCHW`` (reported, not acted on:
    #: it describes the layout the dims already give).
    format: str = "FORMAT_NONE"
    #: Outputs only: the file the labels came from, relative to the model's folder.
    label_filename: str = ""
    #: Outputs only: one label per class index, for the classification extension.
    labels: tuple[str, ...] = ()
    #: Triton's ``reshape``: the shape the model itself takes or gives (without the batch
    #: dimension, as ``dims``), while clients send or get ``dims``; ``()`` is a scalar;
    #: None: no reshape.
    reshape: tuple[int, ...] | None = None


@dataclass(frozen=True)
class WarmupInput:
    """One input of a config.pbtxt's warm-up sample (Triton's ``model_warmup.inputs``)."""

    name: str
    #: Triton's type name, as in :class:`TensorConfig`.
    data_type: str
    #: The input's shape without the batch dimension (when max_batch_size is above 0).
    dims: tuple[int, ...]
    #: ``"zero_data"``, ``"random_data"`` or ``"input_data_file"``.
    kind: str
    #: The file's raw bytes (``input_data_file`` only), already checked against dims and type.
    data: bytes = field(default=b"", repr=False)


@dataclass(frozen=True)
class WarmupSample:
    """A config.pbtxt's warm-up sample, run ``count`` times on the load worker before publishing."""

    name: str
    #: The rows of the batch dimension (1 when the model's max_batch_size is 0: none).
    batch_size: int
    #: How many runs (Triton's count, 0 meaning 1).
    count: int
    inputs: tuple[WarmupInput, ...]


@dataclass(frozen=True)
class EnsembleStep:
    """One step of a Triton ensemble (``ensemble_scheduling.step``): a model run on tensors.

    ``input_map`` and ``output_map`` are Triton's, sorted: (the step model's tensor, the
    ensemble's tensor) pairs.
    """

    model_name: str
    #: The step model's version; -1: the newest its policy serves.
    model_version: int
    input_map: tuple[tuple[str, str], ...]
    output_map: tuple[tuple[str, str], ...]


@dataclass(frozen=True)
class ModelConfig:
    """One model's settings, from its ``model.toml`` or its ``config.pbtxt`` (all optional).

    The fields after ``version_policy`` come only from a Triton ``config.pbtxt``
    (``corral._models.pbtxt.parse``); model.toml does not take them.
    """

    #: None: decided from the model; 0: never batch; > 0: the largest batch formed.
    max_batch_size: int | None = None
    #: How long a batch waits for more requests, in microseconds; None: the scheduler's default.
    batch_window_us: int | None = None
    #: ``"auto"``, ``"shared"``, ``"exclusive"`` or ``"pool:N"`` (see ConcurrencyPolicy).
    concurrency: str = "auto"
    #: Execution providers in order of precedence, each a name or (name, options as sorted
    #: (key, text value) pairs); None: the CPU provider.
    providers: tuple[ProviderEntry, ...] | None = None
    #: Never evicted to make room for other models.
    pinned: bool = False
    #: Run once on zeros after loading, so the first request does not pay for first-run setup.
    warmup: bool = False
    #: Which versions on disk are served.
    version_policy: VersionPolicy = VersionPolicy("latest", 1)
    #: onnxruntime's graph optimization level: ``disable``, ``basic``, ``extended``, ``all``;
    #: None: onnxruntime's default (``all``).
    graph_optimization_level: str | None = None
    #: ``sequential`` or ``parallel`` (on the Runtime's inter-op threads); None: sequential.
    execution_mode: str | None = None
    #: Threads one run uses; other than the Runtime's needs its per-session thread pools.
    intra_op_threads: int | None = None
    #: Threads of the parallel execution mode; other than the Runtime's likewise.
    inter_op_threads: int | None = None
    #: False: no CPU arena for this model; True: one (its own where the Runtime has none);
    #: None: the Runtime's ``arena``.
    cpu_mem_arena: bool | None = None
    #: onnxruntime's memory pattern; None: its default (on).
    mem_pattern: bool | None = None
    #: onnxruntime session configuration entries, sorted (key, text value) pairs.
    session_config: tuple[tuple[str, str], ...] = ()
    #: Devices whose arena is shrunk after each run (``"cpu:0"``, ``"gpu:0"``, ``;``-separated,
    #: onnxruntime's ``memory.enable_memory_arena_shrinkage``); None: none.
    arena_shrinkage: str | None = None
    #: Custom operator libraries registered with the model's sessions, in order: a path
    #: (relative to the model's folder as written; the repository makes it the library's real
    #: path once checked inside the folder) or ``"onnxruntime_extensions"``.
    custom_op_libraries: tuple[str, ...] = ()
    #: Its answers may be kept in the server's response cache (Triton's
    #: ``response_cache { enable: true }``); used only when the server has a cache
    #: (``--cache-config local,size=N``).
    response_cache: bool = False
    #: What one loaded version costs, as its user declares it: bytes, or a size like
    #: ``"64MiB"`` (:func:`corral._base.parse_bytes`; an int once read). The budget charges
    #: it in place of the estimate, and a measured charge does not replace it (the measure is
    #: still shown beside it); None: the estimate, then the measure.
    memory_bytes: int | str | None = None
    #: Where the settings came from: ``"default"``, ``"model.toml"`` or ``"config.pbtxt"``
    #: (not compared: the same settings from either file are equal).
    source: str = field(default="default", compare=False)
    #: The file each version folder holds (Triton's ``default_model_filename``).
    model_filename: str = "model.onnx"
    #: The inputs and outputs a config.pbtxt declares; empty: the model's own, unchecked.
    inputs: tuple[TensorConfig, ...] = ()
    outputs: tuple[TensorConfig, ...] = ()
    #: Requests that may wait in the model's queue; None: the Host's ``max_queue_per_model``.
    max_queue_size: int | None = None
    #: Triton's free-form ``parameters`` (name, string value), reported back as they came.
    parameters: tuple[tuple[str, str], ...] = ()
    #: Whether requests may share runs. A config.pbtxt sets it False when it has no
    #: ``dynamic_batching``: Triton then combines no requests, and ``max_batch_size`` only says
    #: that the first dimension is the batch's (each request brings its own rows).
    combine_requests: bool = True
    #: A config.pbtxt's ``model_warmup`` samples, run in order after loading; a failing one
    #: fails the load.
    warmup_samples: tuple[WarmupSample, ...] = ()
    #: Triton's ``default_queue_policy.default_timeout_microseconds``: a request still queued
    #: this long after it was queued is answered DeadlineExceeded; None: no default.
    queue_timeout_us: int | None = None
    #: Triton's ``allow_timeout_override``: whether a request's own timeout replaces
    #: ``queue_timeout_us`` in the queue (False: the queue keeps the config's).
    queue_timeout_override: bool = False
    #: Triton's ``preferred_batch_size``, ascending: a batch is cut at the largest of these
    #: sizes the queue fills, without waiting for the window (docs/scheduler.md); (): none.
    preferred_batch_sizes: tuple[int, ...] = ()
    #: Triton's ``backend``: ``"onnxruntime"``, or ``"python"`` for a Triton Python model
    #: (``model.py``, run in-process by ``corral._compute.PythonSession``).
    backend: str = "onnxruntime"
    #: A Python model's whole config.pbtxt as Triton's JSON (what its ``initialize`` gets as
    #: ``args["model_config"]``); "" for an ONNX model.
    triton_json: str = ""
    #: An ensemble's steps (``platform: "ensemble"``, backend ``"ensemble"``); () otherwise.
    ensemble_steps: tuple[EnsembleStep, ...] = ()
    #: Settings the config.pbtxt sets that have no effect on this machine, each
    #: ``"<field>: <why>"``: accepted, and named once in the log when the model loads.
    no_effect: tuple[str, ...] = field(default=(), compare=False)

    def __post_init__(self) -> None:
        _check_optional_count("max_batch_size", self.max_batch_size)
        _check_optional_count("batch_window_us", self.batch_window_us)
        object.__setattr__(self, "concurrency", _check_concurrency(self.concurrency))
        if self.providers is not None:
            object.__setattr__(self, "providers", _check_providers(self.providers))
        entries: Any = self.session_config  # any value: SessionTuning checks it
        if isinstance(entries, dict):  # model.toml's table
            entries = tuple(entries.items())
        try:
            tuning = SessionTuning(
                self.graph_optimization_level,
                self.execution_mode,
                self.intra_op_threads,
                self.inter_op_threads,
                self.cpu_mem_arena,
                self.mem_pattern,
                entries,
                self.arena_shrinkage,
            )
        except ValueError as exc:
            name, _, problem = str(exc).partition(" ")
            raise _FieldError(name, problem) from None
        object.__setattr__(self, "session_config", tuning.session_config)
        sizes = self.preferred_batch_sizes
        if not isinstance(sizes, tuple) or any(
            isinstance(size, bool) or not isinstance(size, int) or size < 1 for size in sizes
        ):
            raise _FieldError("preferred_batch_sizes", f"must be sizes >= 1, got {sizes!r}")
        object.__setattr__(self, "preferred_batch_sizes", tuple(sorted(set(sizes))))
        _check_bool("pinned", self.pinned)
        _check_bool("warmup", self.warmup)
        _check_bool("combine_requests", self.combine_requests)
        _check_bool("response_cache", self.response_cache)
        if self.memory_bytes is not None:
            object.__setattr__(self, "memory_bytes", _declared_bytes(self.memory_bytes))
        _check_optional_count("queue_timeout_us", self.queue_timeout_us)
        object.__setattr__(self, "custom_op_libraries", _check_libraries(self.custom_op_libraries))
        _check_bool("queue_timeout_override", self.queue_timeout_override)
        if not isinstance(self.version_policy, VersionPolicy):
            raise _FieldError(
                "version_policy", f"must be a VersionPolicy, got {_describe(self.version_policy)}"
            )
        if self.source not in ("default", "model.toml", "config.pbtxt"):
            raise _FieldError(
                "source", f"must be default, model.toml or config.pbtxt, got {self.source!r}"
            )
        if (
            not isinstance(self.model_filename, str)
            # An ensemble's version is its folder (Triton's are empty): no file name.
            or (not self.model_filename and self.backend != "ensemble")
            or self.model_filename != self.model_filename.strip()
            or any(part in self.model_filename for part in ("/", "\\", "\0"))
            or self.model_filename in (".", "..")
        ):
            raise _FieldError(
                "model_filename",
                f"must be a plain file name inside each version folder, got "
                f"{_describe(self.model_filename)}",
            )
        if self.max_queue_size is not None:
            _check_positive_int("max_queue_size", self.max_queue_size)
        for kind, tensors in (("inputs", self.inputs), ("outputs", self.outputs)):
            names = [t.name for t in tensors]
            if len(set(names)) != len(names):
                raise _FieldError(kind, f"declare a tensor twice: {names!r}")

    @classmethod
    def from_toml(cls, text: str, *, source: str) -> ModelConfig:
        """Parse model.toml text; ``source`` (the file path) is named in every error.

        >>> ModelConfig.from_toml("pinned = true", source="fraud/model.toml").pinned
        True

        Raises :class:`ModelConfigError` for invalid TOML, an unknown key, or a value of the
        wrong type or range; the message names ``source`` and the field.
        """
        try:
            table = tomllib.loads(text)
        except tomllib.TOMLDecodeError as exc:
            raise ModelConfigError(f"{source}: invalid TOML: {exc}") from exc
        try:
            _check_known_keys(table)
            values = dict(table)
            values["source"] = "model.toml"
            if "version_policy" in values:
                values["version_policy"] = _parse_version_policy(values["version_policy"])
            return cls(**values)
        except _FieldError as exc:
            raise ModelConfigError(f"{source}: {exc}") from None


# model.toml's keys: the fields a config.pbtxt alone sets (and the source) are not among them.
_PBTXT_ONLY = frozenset(
    {
        "source",
        "model_filename",
        "inputs",
        "outputs",
        "max_queue_size",
        "parameters",
        "combine_requests",
        "warmup_samples",
        "queue_timeout_us",
        "queue_timeout_override",
        "preferred_batch_sizes",
        "no_effect",
    }
)
_KNOWN_KEYS = tuple(sorted(f.name for f in fields(ModelConfig) if f.name not in _PBTXT_ONLY))


def _check_known_keys(table: Mapping[str, object]) -> None:
    unknown = sorted(set(table) - set(_KNOWN_KEYS))
    if not unknown:
        return
    hints = []
    for key in unknown:
        close = difflib.get_close_matches(key, _KNOWN_KEYS, n=1)
        hints.append(f"{key!r} (did you mean {close[0]!r}?)" if close else repr(key))
    noun = "key" if len(unknown) == 1 else "keys"
    raise _FieldError(
        f"unknown {noun}", f"{', '.join(hints)}; the known keys are {', '.join(_KNOWN_KEYS)}"
    )


def _parse_version_policy(value: object) -> VersionPolicy:
    forms = (
        'must be "latest", "all", { latest = N }, { specific = [1, 3] } or Triton\'s '
        "{ latest = { num_versions = N } }, { specific = { versions = [...] } }, { all = {} }"
    )
    if value == "latest":
        return VersionPolicy("latest", 1)
    if value == "all":
        return VersionPolicy("all")
    if not isinstance(value, dict) or len(value) != 1:
        raise _FieldError("version_policy", f"{forms}; got {_describe(value)}")
    ((kind, body),) = value.items()
    name = f"version_policy.{kind}"
    if kind == "latest":
        if isinstance(body, dict):
            count = _only_key(body, "num_versions", name)
            return VersionPolicy("latest", _check_positive_int(f"{name}.num_versions", count))
        return VersionPolicy("latest", _check_positive_int(name, body))
    if kind == "specific":
        if isinstance(body, dict):
            listed = _only_key(body, "versions", name)
            return VersionPolicy("specific", versions=_version_list(f"{name}.versions", listed))
        return VersionPolicy("specific", versions=_version_list(name, body))
    if kind == "all":
        if body != {}:
            raise _FieldError(name, f"must be an empty table {{}}, got {_describe(body)}")
        return VersionPolicy("all")
    raise _FieldError("version_policy", f"{forms}; got the key {kind!r}")


def _only_key(table: dict[str, object], key: str, name: str) -> object:
    if set(table) != {key}:
        raise _FieldError(name, f"must be a table with the one key {key!r}, got {_describe(table)}")
    return table[key]


def _version_list(name: str, value: object) -> tuple[int, ...]:
    if not isinstance(value, list) or not value:
        raise _FieldError(name, f"must be a non-empty array of versions, got {_describe(value)}")
    return tuple(_check_positive_int(f"{name}[{i}]", item) for i, item in enumerate(value))


def _declared_bytes(value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int | str):
        raise _FieldError("memory_bytes", f"must be bytes or a size like '64MiB', got {value!r}")
    try:
        return parse_bytes(value, option="memory_bytes")
    except InvalidOption as exc:
        raise _FieldError("memory_bytes", str(exc).removeprefix("memory_bytes ")) from None


def _check_optional_count(name: str, value: object) -> None:
    if value is None:
        return
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise _FieldError(name, f"must be an integer >= 0, got {_describe(value)}")


def _check_bool(name: str, value: object) -> None:
    if not isinstance(value, bool):
        raise _FieldError(name, f"must be true or false, got {_describe(value)}")


def _check_libraries(value: object) -> tuple[str, ...]:
    name = "custom_op_libraries"
    if not isinstance(value, tuple | list):
        raise _FieldError(name, f"must be an array of library paths, got {_describe(value)}")
    for index, item in enumerate(value):
        if not isinstance(item, str) or not item.strip() or "\0" in item:
            raise _FieldError(
                f"{name}[{index}]",
                "must be a path inside the model's folder or 'onnxruntime_extensions', got "
                f"{_describe(item)}",
            )
    if len(set(value)) != len(value):
        raise _FieldError(name, f"lists a library twice: {list(value)!r}")
    return tuple(value)


def _check_concurrency(value: object) -> str:
    if not isinstance(value, str):
        raise _FieldError("concurrency", f"must be a string, got {_describe(value)}")
    try:
        policy = ConcurrencyPolicy.parse(value)
    except ValueError as exc:
        # parse() already names the field; keep its wording without saying it twice.
        raise _FieldError("concurrency", str(exc).removeprefix("concurrency ")) from None
    return "auto" if policy is None else str(policy)


def _check_providers(value: object) -> tuple[ProviderEntry, ...]:
    if not isinstance(value, tuple | list) or not value:
        raise _FieldError(
            "providers",
            f"must be a non-empty array of provider names or tables (leave it out for the CPU), "
            f"got {_describe(value)}",
        )
    entries = tuple(_provider_entry(f"providers[{i}]", item) for i, item in enumerate(value))
    names = [entry if isinstance(entry, str) else entry[0] for entry in entries]
    if len(set(names)) != len(names):
        raise _FieldError("providers", f"lists a provider twice: {names!r}")
    return entries


def _provider_entry(name: str, item: object) -> ProviderEntry:
    """A provider name, a ``{ name = ..., <option> = value }`` table, or an entry already made."""
    if isinstance(item, str) and item.strip():
        return item
    if isinstance(item, tuple) and len(item) == 2 and isinstance(item[1], tuple):
        item = {"name": item[0], **dict(item[1])}
    if not isinstance(item, dict):
        raise _FieldError(
            name, f"must be a provider name or a table with a name, got {_describe(item)}"
        )
    provider = item.get("name")
    if not isinstance(provider, str) or not provider.strip():
        raise _FieldError(f"{name}.name", f"must be a provider name, got {_describe(provider)}")
    options: list[tuple[str, str]] = []
    for key, option in sorted(item.items()):
        if key == "name":
            continue
        if isinstance(option, bool):
            options.append((key, "1" if option else "0"))
        elif isinstance(option, str | int | float):
            options.append((key, str(option)))
        else:
            raise _FieldError(
                f"{name}.{key}",
                f"must be a string, number or boolean (a provider option), got {_describe(option)}",
            )
    return (provider, tuple(options)) if options else provider
