"""The one boundary with onnxruntime.

Every call into onnxruntime that touches process-wide state goes through this module, and
every onnxruntime exception becomes one of corral's here (:func:`load_error`,
:func:`run_error`), chained with ``from``. onnxruntime is imported on first use, not when
corral is imported, so ``import corral`` starts nothing.

Facts this module is built on (checked on onnxruntime 1.31 and 1.32):

- ``set_global_thread_pool_sizes`` may be called once per process. A second call fails even
  with the same sizes, and two concurrent calls race; hence :data:`_PROCESS_SETTINGS_LOCK`
  and the record of what was set. It writes process globals (the pool options and a
  "use global pools" flag) that every session construction reads, without a lock, so it
  must finish before the first session is built: the Runtime calls it under its own lock
  before it admits any session. onnxruntime's environment itself is created when the
  module is imported, under Python's import lock.
- After it, a session with per-session threads fails; ``use_per_session_threads = False``
  without it fails too. So every corral session uses the global pools, and the pools are
  set before the first corral session.
- onnxruntime's Python ``InferenceSession`` silently retries on the CPU provider when
  creation fails, printing to stdout; corral turns that off (``enable_fallback=0``).
- A run that fails makes onnxruntime log an ``[E:onnxruntime]`` line to stderr unless the
  run's (or the session's, or the default logger's) severity is 4 (FATAL); 3 (ERROR) is not
  enough. That is one line for each client request with bad values. Runs get
  ``RunOptions.log_severity_level = 4``, which silences runs only (a load's warnings still
  reach stderr); corral logs run failures itself, once per model version per minute at
  most (:data:`RUN_FAILURE_LOG`).
- Custom-op domain registration is not safe under concurrent construction (onnxruntime
  issues #22663, #26366, #20089), nor is first-time setup of some providers (#32461);
  :data:`CONSTRUCTION_LOCK` serializes construction for the providers the table marks, and
  for every session with custom operator libraries: their registration
  (``SessionOptions.register_custom_ops_library`` loads the library and adds its domains to
  the options) and the construction that registers their schemas both run under it.
- ``register_custom_ops_library`` loads the library at once and raises onnxruntime's
  ``Fail`` naming the reason (a missing file, "invalid ELF header", no ``RegisterCustomOps``
  symbol): a library that cannot load fails before any session is built.
- It loads the library with ``dlopen``, and glibc's ``dlopen`` hands back a library already
  loaded under the same path, whatever file that path names now: a library replaced on disk
  (a new release, a store's refreshed copy) while a session still holds the old one would be
  registered as the old one, and the new version of the model would run the old operators.
  So a library is given by its real path, and a version of a file whose path some other file
  is still loaded under is registered through a copy of its own (:func:`_loadable_path`).
"""

from __future__ import annotations

import atexit
import logging
import os
import pathlib
import shutil
import tempfile
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from corral._base import (
    InferenceError,
    InvalidInput,
    ModelConfigError,
    ModelInvalid,
    ModelLoadError,
    RunCancelled,
    RuntimeConfigError,
    install_hint,
)

if TYPE_CHECKING:
    from importlib import metadata
    from types import ModuleType

__all__ = [
    "CONSTRUCTION_LOCK",
    "EXTENSIONS_LIBRARY",
    "RUN_FAILURE_LOG",
    "RUN_LOG_SEVERITY",
    "OncePerInterval",
    "ProviderArg",
    "available_providers",
    "check_custom_op_libraries",
    "check_provider_options",
    "configure_process",
    "create_session",
    "distribution",
    "extensions_library_path",
    "load_error",
    "new_run_options",
    "onnxruntime",
    "process_pools",
    "register_custom_op_libraries",
    "run_error",
    "runner",
    "session_options",
]

#: A provider as onnxruntime takes it: a name, or a name and its options (a mapping, or
#: ``(key, value)`` pairs as model.toml's configuration holds them).
ProviderArg = str | tuple[str, Mapping[str, Any] | tuple[tuple[str, str], ...]]

# Guards _pools and _env_allocator: onnxruntime's process-wide settings, which can be made
# once per process and never changed.
_PROCESS_SETTINGS_LOCK = threading.Lock()
_pools: tuple[int, int] | None = None
_env_allocator = False

#: Serializes session construction for providers known to race while constructing (first-time
#: provider setup), and the registration of custom operator libraries with the construction of
#: the sessions that use them (custom-op domain and schema registration). Never held across a
#: run.
CONSTRUCTION_LOCK = threading.Lock()

# Guards _library_copies and _library_folder: the copy made of each version of a library file
# that had to be loaded under a path of its own, and the folder that holds them.
_LIBRARY_COPIES_LOCK = threading.Lock()
_library_copies: dict[tuple[int, int, int, int], str] = {}
_library_folder: str | None = None

#: The name that stands for onnxruntime-extensions' library of operators (its
#: ``get_library_path()``), instead of a path, in model.toml and config.pbtxt.
EXTENSIONS_LIBRARY = "onnxruntime_extensions"
# The package that provides it, and its extension module that is the library.
_EXTENSIONS_PACKAGE = "onnxruntime_extensions"
_EXTENSIONS_MODULE = "_extensions_pydll"

_TERMINATED_MARK = "terminate flag"

#: onnxruntime's severity for runs: 4 (FATAL) is the one level at which a failed run writes
#: nothing to stderr; the failure is raised, translated, and logged by corral.
RUN_LOG_SEVERITY = 4

logger = logging.getLogger(__name__)


class OncePerInterval:
    """Says, per key, whether to log now: at most once per ``interval_s`` seconds.

    Thread-safe; a key's first event is always let through. ``allow`` returns None to stay
    quiet, or how many events of that key it kept quiet since the last one let through.
    Keys whose interval has passed are forgotten when more than ``max_keys`` are held, so
    memory stays bounded by the keys active within one interval.

    >>> limiter = OncePerInterval(60.0)
    >>> limiter.allow("fraud"), limiter.allow("fraud")
    (0, None)
    """

    def __init__(
        self,
        interval_s: float,
        *,
        max_keys: int = 4096,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if not interval_s > 0:
            raise ValueError(f"interval_s must be positive, got {interval_s!r}")
        self._interval_s = interval_s
        self._max_keys = max_keys
        self._clock = clock
        # Guards _last: key -> (time of the last event let through, events kept quiet since).
        self._last_lock = threading.Lock()
        self._last: dict[str, tuple[float, int]] = {}

    def allow(self, key: str) -> int | None:
        """Whether to log an event of ``key`` now: None for no, else the events kept quiet.

        None if one was let through less than an interval ago; else how many of ``key``
        were kept quiet since the last let through.
        """
        now = self._clock()
        with self._last_lock:
            last = self._last.get(key)
            if last is not None and now - last[0] < self._interval_s:
                self._last[key] = (last[0], last[1] + 1)
                return None
            if last is None and len(self._last) >= self._max_keys:
                self._forget_expired_locked(now)
            self._last[key] = (now, 0)
            return 0 if last is None else last[1]

    def _forget_expired_locked(self, now: float) -> None:
        expired = [k for k, (at, _) in self._last.items() if now - at >= self._interval_s]
        for key in expired:
            del self._last[key]


#: Failed runs are logged at most once per model per minute: a client sending bad values in
#: a loop must not flood the server's log.
RUN_FAILURE_LOG = OncePerInterval(60.0)


def onnxruntime() -> ModuleType:
    """Return the onnxruntime module, importing it on first use."""
    import onnxruntime as ort

    module: ModuleType = ort
    return module


def available_providers() -> list[str]:
    """The execution providers this onnxruntime build has."""
    providers: list[str] = onnxruntime().get_available_providers()
    return providers


def process_pools() -> tuple[int, int] | None:
    """The (intra, inter) global pool sizes set in this process, or None if not yet set."""
    with _PROCESS_SETTINGS_LOCK:
        return _pools


def configure_process(
    intra_op_threads: int,
    inter_op_threads: int,
    *,
    env_allocator: bool,
    global_pools: bool = True,
) -> None:
    """Set onnxruntime's global thread pools (once per process) and, if asked, its env allocator.

    Setting the same pool sizes again is a no-op; other sizes raise :class:`RuntimeConfigError`,
    because onnxruntime cannot replace its global pools. With ``global_pools=False`` (sessions
    with their own pools) no pools are set, and pools set earlier are an error: a session with
    its own threads cannot be built once they exist.
    """
    global _pools, _env_allocator
    ort = onnxruntime()
    wanted = (intra_op_threads, inter_op_threads)
    with _PROCESS_SETTINGS_LOCK:
        if not global_pools:
            if _pools is not None:
                raise RuntimeConfigError(
                    "onnxruntime's global thread pools were already set in this process "
                    f"(intra_op_threads={_pools[0]}, inter_op_threads={_pools[1]}); sessions "
                    "with their own thread pools cannot be built after that"
                )
        elif _pools is None:
            try:
                ort.set_global_thread_pool_sizes(intra_op_threads, inter_op_threads)
            except Exception as exc:
                raise RuntimeConfigError(
                    "onnxruntime refused to set its global thread pools "
                    f"(intra_op_threads={intra_op_threads}, inter_op_threads={inter_op_threads}): "
                    f"{exc}. If code outside corral already called "
                    "onnxruntime.set_global_thread_pool_sizes in this process, corral cannot "
                    "know or change those pools: let corral set them instead."
                ) from exc
            _pools = wanted
        elif _pools != wanted:
            raise RuntimeConfigError(
                "onnxruntime's global thread pools were already set in this process to "
                f"intra_op_threads={_pools[0]}, inter_op_threads={_pools[1]} and cannot be "
                f"changed; asked for intra_op_threads={wanted[0]}, inter_op_threads={wanted[1]}"
            )
        if env_allocator and not _env_allocator:
            memory_info = ort.OrtMemoryInfo(
                "Cpu", ort.OrtAllocatorType.ORT_ARENA_ALLOCATOR, 0, ort.OrtMemType.DEFAULT
            )
            try:
                ort.create_and_register_allocator(memory_info, None)
            except Exception as exc:
                raise RuntimeConfigError(
                    f"onnxruntime refused to register a shared CPU allocator: {exc}"
                ) from exc
            _env_allocator = True


def session_options(*, arena: str, own_threads: tuple[int, int] | None = None) -> Any:
    """Options for one corral session: its thread pools, and the arena the Runtime chose.

    ``own_threads`` None: the global pools; else the session's own (intra, inter) pools.
    """
    options = onnxruntime().SessionOptions()
    if own_threads is None:
        options.use_per_session_threads = False
    else:
        options.intra_op_num_threads, options.inter_op_num_threads = own_threads
    if arena == "shared":
        options.add_session_config_entry("session.use_env_allocators", "1")
    elif arena == "off":
        options.enable_cpu_mem_arena = False
    return options


def create_session(model: str | bytes, options: Any, providers: Sequence[ProviderArg]) -> Any:
    """Create one ``onnxruntime.InferenceSession``; failures raise :class:`ModelLoadError`."""
    ort = onnxruntime()
    try:
        return ort.InferenceSession(model, options, providers=list(providers), enable_fallback=0)
    except Exception as exc:
        raise load_error(exc, model) from exc


def register_custom_op_libraries(options: Any, libraries: Sequence[str], source: str) -> None:
    """Register each custom operator library with ``options``, in order.

    Each is a path to a library, or :data:`EXTENSIONS_LIBRARY` (onnxruntime-extensions'
    library, imported now). Raises :class:`ModelLoadError` naming ``source``, the library and
    the reason when one cannot be found or loaded. The caller holds :data:`CONSTRUCTION_LOCK`.
    """
    for library in libraries:
        path = _library_path(library, source)
        try:
            options.register_custom_ops_library(path)
        except Exception as exc:
            raise ModelLoadError(
                f"{source}: custom op library {library!r} failed to load: {_message(exc)}"
            ) from exc


def check_custom_op_libraries(libraries: Sequence[str], source: str) -> None:
    """Load each custom operator library as a session would, into options then dropped.

    Raises :class:`ModelLoadError` as :func:`register_custom_op_libraries` does. Takes
    :data:`CONSTRUCTION_LOCK` itself.
    """
    options = onnxruntime().SessionOptions()
    with CONSTRUCTION_LOCK:
        register_custom_op_libraries(options, libraries, source)


def extensions_library_path(source: str) -> str:
    """The file of onnxruntime-extensions' operator library, found without importing it.

    The package's ``get_library_path()`` names its ``_extensions_pydll`` extension module;
    this finds the same file from the package's location. Importing the package is avoided:
    with onnx installed it imports onnx and sets ``PROTOCOL_BUFFERS_PYTHON_IMPLEMENTATION=
    python`` in the process's environment (onnxruntime-extensions 0.15), which every process
    the server starts would inherit. Raises :class:`ModelLoadError` naming ``source`` and
    the extra to install when the package is missing.
    """
    import importlib.machinery
    import importlib.util
    import os

    spec = importlib.util.find_spec(_EXTENSIONS_PACKAGE)
    folders = [] if spec is None else list(spec.submodule_search_locations or ())
    for folder in folders:
        for suffix in importlib.machinery.EXTENSION_SUFFIXES:
            candidate = os.path.join(folder, _EXTENSIONS_MODULE + suffix)
            if os.path.isfile(candidate):
                return candidate
    where = "is not installed" if not folders else f"has no {_EXTENSIONS_MODULE} in {folders}"
    raise ModelLoadError(
        f"{source}: custom op library {EXTENSIONS_LIBRARY!r} needs the onnxruntime-extensions "
        f"package (the extensions extra), which {where}: {install_hint('extensions')}"
    )


def _library_path(library: str, source: str) -> str:
    if library == EXTENSIONS_LIBRARY:
        return extensions_library_path(source)
    return _loadable_path(os.path.realpath(library))


def _loadable_path(path: str) -> str:
    """The path to load the library file ``path`` (a real path) through, as the file is now.

    ``path`` itself, unless the process has another file mapped under that path (the one it
    named before a replacement, which ``dlopen`` would hand back): then a copy of this file
    in a folder of the process's own, made once per version of the file (its device, inode,
    size and modification time) and removed at exit. A path that cannot be opened is given
    as it is, for onnxruntime's own error to name it.
    """
    global _library_folder
    try:
        source = open(path, "rb")  # noqa: SIM115  # closed by the with below; copied from
    except OSError:
        return path
    with source:
        info = os.fstat(source.fileno())
        if not _other_file_mapped(path, info.st_dev, info.st_ino):
            return path
        version = (info.st_dev, info.st_ino, info.st_size, info.st_mtime_ns)
        with _LIBRARY_COPIES_LOCK:
            copy = _library_copies.get(version)
            if copy is not None:
                return copy
            if _library_folder is None:
                _library_folder = tempfile.mkdtemp(prefix="corral-op-libraries-")
                atexit.register(shutil.rmtree, _library_folder, ignore_errors=True)
            copy = os.path.join(_library_folder, f"{len(_library_copies)}-{os.path.basename(path)}")
            with open(copy, "wb") as target:
                shutil.copyfileobj(source, target)
            _library_copies[version] = copy
        logger.info(
            "corral: the custom op library %s changed since it was loaded and the old one is "
            "still in use: the new one is loaded from its copy %s",
            path,
            copy,
        )
        return copy


def _other_file_mapped(path: str, device: int, inode: int) -> bool:
    """Whether the process maps a file under ``path`` that is not (``device``, ``inode``).

    Read from ``/proc/self/maps`` (Linux); elsewhere, False.
    """
    try:
        with open("/proc/self/maps", encoding="utf-8", errors="replace") as maps:
            lines = maps.read().splitlines()
    except OSError:
        return False
    deleted = path + " (deleted)"
    for line in lines:
        fields = line.split(maxsplit=5)
        if len(fields) < 6 or fields[5] not in (path, deleted):
            continue
        major, _, minor = fields[3].partition(":")
        if int(fields[4]) != inode or os.makedev(int(major, 16), int(minor, 16)) != device:
            return True
    return False


def runner(session: Any) -> Any:
    """What to call ``run(output_names, feed, run_options)`` on for one InferenceSession.

    The binding's own session object when there is one: the Python wrapper around it checks
    input names again and retries failed runs on another provider, and corral has already
    checked the inputs and wants no retry. That skips about 3 µs of a 10 µs run on a tiny
    model. Without the attribute (another onnxruntime layout), the wrapper itself.
    """
    return getattr(session, "_sess", session)


def new_run_options() -> Any:
    """A fresh ``RunOptions``: ``terminate`` stays set once set, so each run gets its own.

    Its log severity is :data:`RUN_LOG_SEVERITY`: a failed run writes nothing to stderr.
    """
    options = onnxruntime().RunOptions()
    options.log_severity_level = RUN_LOG_SEVERITY
    return options


def check_provider_options(
    session: Any, asked: Sequence[tuple[str, tuple[str, ...]]], source: str
) -> None:
    """Refuse provider options onnxruntime did not take.

    onnxruntime refuses unknown options of some providers (CUDA, TensorRT) when it builds the
    session, but drops those of others (the CPU provider takes none) without a word. What the
    session reports it uses must name every option asked for, or the load fails.
    """
    taken: dict[str, dict[str, str]] = session.get_provider_options()
    for name, keys in asked:
        used = taken.get(name, {})
        dropped = [key for key in keys if key not in used]
        if dropped:
            raise ModelConfigError(
                f"{source}: onnxruntime did not take option(s) {', '.join(map(repr, dropped))} "
                f"of {name}; it takes: {', '.join(sorted(used)) or 'none'}"
            )


def distribution() -> str:
    """The installed distribution onnxruntime came from (``onnxruntime``, ``onnxruntime-gpu``...).

    Looked up among the distributions installed beside the ``onnxruntime`` package imported
    (its folder's ``*.dist-info``), by what each says it installs: its ``top_level.txt``, or
    else its ``RECORD``. Not :func:`importlib.metadata.packages_distributions`, which parses
    every installed distribution's metadata on every path (~0.1 s at a server's start).
    ``"unknown"`` when none there provides the ``onnxruntime`` package (a build from source
    on the path).
    """
    from importlib import metadata

    init = onnxruntime().__file__
    if init is None:  # a namespace package: no folder of its own to look beside
        return "unknown"
    package = os.path.dirname(os.path.abspath(init))
    folder = os.path.dirname(package)
    try:
        items = sorted(os.listdir(folder))
    except OSError:
        return "unknown"
    found = set()
    for item in items:
        if item.endswith(".dist-info"):
            dist = metadata.PathDistribution(pathlib.Path(folder, item))
            if _provides(dist, os.path.basename(package)):
                found.add(dist.metadata["Name"])
    return ", ".join(sorted(found)) if found else "unknown"


def _provides(dist: metadata.Distribution, package: str) -> bool:
    """Whether ``dist`` installs the top-level package ``package``, as its files say."""
    top_level = dist.read_text("top_level.txt")
    if top_level is not None:
        return package in top_level.split()
    record = dist.read_text("RECORD") or ""
    return f"\n{package}/__init__.py," in "\n" + record


def load_error(exc: Exception, model: str | bytes) -> ModelLoadError:
    """Translate an exception raised while creating a session.

    :class:`ModelInvalid` for what onnxruntime says of the model's bytes themselves (not a
    protobuf, an invalid graph, an operator or type it does not implement): building it again
    fails the same way. Anything else (memory, a device, a file it could not open) may pass.
    """
    source = f"{len(model)}-byte model" if isinstance(model, bytes) else f"model {model!r}"
    refused = type(exc).__name__ in _REFUSALS_OF_THE_MODEL
    kind = ModelInvalid if refused else ModelLoadError
    return kind(f"onnxruntime could not load {source}: {_message(exc)}")


# onnxruntime's exception classes for a model it refuses as it is: INVALID_PROTOBUF (not
# ONNX), INVALID_GRAPH, NOT_IMPLEMENTED (an unknown operator), INVALID_ARGUMENT, NO_MODEL, and
# FAIL, which its graph checks raise for a type mismatch or an unsupported opset.
_REFUSALS_OF_THE_MODEL = frozenset(
    {"InvalidProtobuf", "InvalidGraph", "NotImplemented", "InvalidArgument", "NoModel", "Fail"}
)


def run_error(exc: Exception, model_name: str, run_options: Any) -> InferenceError | InvalidInput:
    """Translate an exception raised by ``InferenceSession.run``.

    A failure (not a cancellation) is logged as a warning, at most once per model per minute
    (:data:`RUN_FAILURE_LOG`), with the count of those left unlogged since.
    """
    message = _message(exc)
    if run_options.terminate or _TERMINATED_MARK in message:
        return RunCancelled(f"run of {model_name!r} was cancelled before it finished")
    error: InferenceError | InvalidInput
    if type(exc).__name__ == "InvalidArgument":
        error = InvalidInput(f"model {model_name!r} rejected its inputs: {message}")
    else:
        error = InferenceError(f"model {model_name!r} failed while running: {message}")
    quiet = RUN_FAILURE_LOG.allow(model_name)
    if quiet is not None:
        logger.warning(
            "corral: a run failed (%s; %d more since the last logged, at most one logged per "
            "model per minute): %s",
            type(error).__name__,
            quiet,
            error,
        )
    return error


def _message(exc: Exception) -> str:
    # onnxruntime prefixes messages with "[ONNXRuntimeError] : N : CODE :"; keep the reason.
    text = str(exc).strip()
    marker = "[ONNXRuntimeError] :"
    if text.startswith(marker):
        parts = text.split(" : ", 2)
        if len(parts) == 3:
            text = parts[2]
    return " ".join(text.split())
