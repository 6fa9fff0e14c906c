"""The repository check: every problem a load would meet, found without loading a model.

:func:`find_problems` lists the root (names that cannot name a model, an empty repository),
reads each model's entry as a load does (:meth:`Repository.entry`: layout, versions, model.toml
and config.pbtxt parsed and validated by the same code), resolves its execution providers
against this onnxruntime build as a load does, and, when it reads the model files (their
protobuf headers: :func:`read_model_file`), finds those that are not ONNX, holds a
config.pbtxt's declared tensors against the file's own inputs and outputs as the load does
(:func:`declaration_mismatches`: names, types, ranks, sizes that contradict fixed ones), loads
each custom operator library a model names into options then dropped (once per library file
as it is: its outcome is kept with the files read), and,
with a memory budget, estimates each served version's size as the load's budget check does
(:func:`estimate_version_bytes`) to find versions larger than the whole budget.

What it cannot see without loading: whether it can be batched, whether onnxruntime accepts
its graph (and the shapes onnxruntime infers for outputs the file leaves dynamic). ``corral
check --load`` loads every model for that.

:class:`ProblemWatch` keeps the problems of the last check and logs each problem once, when
it first appears (again if it goes away and comes back); ``corral serve`` checks at start and
at every poll.
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import NamedTuple

from corral._base import ModelLoadError, ModelNotFound, Problem, ProblemKind, ProviderUnavailable
from corral._host.budget import Charge, estimate_footprint_bytes
from corral._models import (
    CONFIG_PBTXT,
    ModelConfig,
    ModelEntry,
    Repository,
    declaration_mismatches,
)
from corral._onnx import (
    ModelFile,
    ModelFootprint,
    footprint_and_value_dependence,
    ort,
    read_footprint,
    read_model_file_and_proof,
    resolve_policy,
    resolve_providers,
)

__all__ = [
    "Estimate",
    "ProblemWatch",
    "declared_bytes",
    "estimate_version_bytes",
    "estimate_with_proof",
    "find_problems",
]

logger = logging.getLogger(__name__)

# A model file as it was read: its path, size and mtime.
FileKey = tuple[str, int, int]
# What a model file holds, with the inline lane's proof read in the same pass (what a load
# needs of it), or why it could not be read; for a custom operator library: "" when it
# loaded, else why not.
_FileFacts = tuple[ModelFile, str | None] | str
#: What a load may take instead of reading a model file: its footprint and the inline lane's
#: proof, as the repository check read them from the file as it is (None: not read).
KnownReads = Callable[[FileKey], tuple[ModelFootprint, str | None] | None]


def estimate_version_bytes(
    entry: ModelEntry,
    version: int,
    *,
    pool_size: int,
    read: Callable[[Path], ModelFootprint] = read_footprint,
) -> int:
    """Estimated resident bytes of ``version`` of ``entry`` once loaded, as the load checks it.

    Resolves the providers and the concurrency policy (``pool_size``: the Runtime's compute
    workers) and reads the model file's headers with ``read`` (:func:`read_footprint`; a
    load's reads the inline lane's proof in the same pass). Raises
    :class:`ProviderUnavailable` or :class:`ModelLoadError` as the load would.
    """
    providers = resolve_providers(entry.config.providers)
    policy = resolve_policy(entry.config.concurrency, providers, pool_size=pool_size)
    footprint = read(entry.versions[version].path)
    return estimate_footprint_bytes(footprint, policy.replicas)


class Estimate(NamedTuple):
    """What a load reads of a version's model file before building it."""

    #: What the budget counts it as once loaded: ``charge.bytes``, or the bytes a load
    #: reserved for it.
    size_bytes: int
    #: Why its run time may depend on its inputs' values, or None when its file proves it
    #: does not (the inline lane's proof, :func:`corral._onnx.value_dependence.value_dependence`).
    values: str | None
    #: Its charge: the estimate from the file, and the size its configuration declares.
    charge: Charge


def declared_bytes(config: ModelConfig) -> int | None:
    """The bytes a model's configuration declares one version costs (``memory_bytes``)."""
    declared = config.memory_bytes
    return declared if isinstance(declared, int) else None


def _charged(entry: ModelEntry, size: int, values: str | None) -> Estimate:
    charge = Charge(size, declared_bytes(entry.config))
    return Estimate(charge.bytes, values, charge)


def estimate_with_proof(
    entry: ModelEntry,
    version: int,
    *,
    pool_size: int,
    prove: bool,
    known: KnownReads | None = None,
) -> Estimate:
    """:func:`estimate_version_bytes`, and the inline lane's proof read in the same pass.

    ``prove`` false (the lane is off): no proof is read, and its reason says so. ``known``
    gives what the repository check read of the version's file, keyed by the path, size and
    mtime the entry found it with (:meth:`ProblemWatch.known_read`): then the file is not
    walked again. Raises as :func:`estimate_version_bytes` does.
    """
    file = entry.versions[version]
    read_before = None if known is None else known((str(file.path), file.size, file.mtime_ns))
    proofs: list[str | None] = []

    def read(path: Path) -> ModelFootprint:
        if read_before is not None:
            footprint, proof = read_before
        elif prove:
            footprint, proof = footprint_and_value_dependence(path)
        else:
            footprint, proof = read_footprint(path), None
        proofs.append(proof)
        return footprint

    size = estimate_version_bytes(entry, version, pool_size=pool_size, read=read)
    return _charged(entry, size, proofs[-1] if prove else "the inline lane is off")


def find_problems(
    repository: Repository,
    *,
    memory_budget: int | None,
    pool_size: int,
    read_model_files: bool = False,
    files: Mapping[FileKey, _FileFacts] | None = None,
    listing_only: bool = False,
    entries: dict[str, ModelEntry] | None = None,
) -> tuple[list[Problem], dict[FileKey, _FileFacts]]:
    """Every problem of ``repository`` now, in model order, and what it read of the files.

    Model files are read (their protobuf headers only) when ``memory_budget`` is set, to
    estimate their sizes, or when ``read_model_files`` is true: then a file that is not ONNX
    and a config.pbtxt whose declarations contradict the file are problems too. ``files``
    are those a previous check read, reused for files not changed since. ``listing_only``:
    the listing's problems alone (no model's entry read: in object storage, nothing fetched).
    ``entries``, when given, gets every entry read, by name. Raises :class:`RepositoryError`
    when the root cannot be listed.
    """
    listing = repository.listing()
    root = repository.root
    # What the problems of the listing name: the store's URL, not the cache folder, for a
    # repository in object storage (a typo'd prefix is found by its URL).
    where = root if repository.store is None else repository.url
    join = os.path.join if repository.store is None else _url_join
    problems = [
        Problem(
            ProblemKind.INVALID_NAME,
            None,
            join(where, raw),
            f"{join(where, raw)} is not served: {raw!r} cannot name a model",
            "rename it to 1 to 128 ASCII letters, digits, '_', '.' or '-' starting with a "
            "letter or digit, or move it out of the repository",
        )
        for raw in listing.invalid
    ]
    if not listing.names:
        problems.append(
            Problem(
                ProblemKind.EMPTY_REPOSITORY,
                None,
                str(where),
                f"model repository {where} holds no model",
                f"add a model: {join(where, '<name>', '1', 'model.onnx')} "
                f"or {join(where, '<name>.onnx')}"
                + ("" if repository.store is None else ", or check the URL's bucket and prefix"),
            )
        )
    if listing_only:
        return problems, {}
    previous = files or {}
    made: dict[FileKey, _FileFacts] = {}
    read_files = read_model_files or memory_budget is not None
    for name in listing.names:
        try:
            entry = repository.entry(name)
        except ModelNotFound:
            continue  # removed between listing and looking: it is simply gone
        if entries is not None:
            entries[name] = entry
        problems.extend(entry.problems)
        if entry.error is not None:
            continue
        try:
            resolve_providers(entry.config.providers)
        except ProviderUnavailable as exc:
            problems.append(_missing_provider(root, entry, exc))
            continue
        if read_files and entry.config.backend in ("python", "ensemble"):
            # A model.py: nothing of it is read before it loads (it is code). An ensemble:
            # no file; its graph is checked when it loads.
            continue
        if read_files:
            problems.extend(_library_problems(root, entry, previous, made))
            problems.extend(_file_problems(root, entry, memory_budget, pool_size, previous, made))
    return problems, made


class ProblemWatch:
    """The problems of a repository as of its last check, each logged once when it appears.

    :meth:`check` scans and logs; :meth:`recheck` (the poll's) does the same once a first
    check was made, reading model files if that check did. Safe from any thread; checks that
    run at once each scan on their own thread, and the one that ends last sets the problems
    shown.

    What the last check read is lent to the loads, so that a server that checks and then
    loads every model at start reads nothing twice: each model file's reading, by the path,
    size and mtime it was read at (:meth:`known_read`), and, when that check was asked to
    keep them, its entries, taken once (:meth:`take_entries`).
    """

    def __init__(
        self, repository: Repository, *, memory_budget: int | None, pool_size: int
    ) -> None:
        self._repository = repository
        self._memory_budget = memory_budget
        self._pool_size = pool_size
        # Guards _current, _files, _entries, _watching, _read_files and _listing_only:
        # bookkeeping only, never held over a scan.
        self._problems_lock = threading.Lock()
        self._current: tuple[Problem, ...] = ()
        self._files: dict[FileKey, _FileFacts] = {}
        self._entries: dict[str, ModelEntry] = {}
        self._watching = False
        self._read_files = False
        self._listing_only = False

    @property
    def problems(self) -> tuple[Problem, ...]:
        """The problems found by the last check (none before the first)."""
        with self._problems_lock:
            return self._current

    def known_read(self, key: FileKey) -> tuple[ModelFootprint, str | None] | None:
        """What the last check read of the model file ``key`` names: its footprint and proof.

        None when that check did not read it as it is now (another path, size or mtime), or
        could not: a load then reads the file itself.
        """
        with self._problems_lock:
            facts = self._files.get(key)
        if facts is None or isinstance(facts, str):
            return None
        model_file, proof = facts
        return model_file.footprint, proof

    def take_entries(self) -> dict[str, ModelEntry]:
        """The entries the last check kept (``keep_entries``), by name; kept no longer."""
        with self._problems_lock:
            entries, self._entries = self._entries, {}
        return entries

    def check(
        self,
        *,
        read_model_files: bool | None = None,
        listing_only: bool | None = None,
        keep_entries: bool = False,
    ) -> tuple[Problem, ...]:
        """Scan the repository now; log new problems at WARNING and those gone at INFO.

        Model files are read (:func:`find_problems`) with a memory budget, or with
        ``read_model_files``; None: as the last check did (False before any). So is
        ``listing_only`` (the listing's problems alone, no model's entry read). With
        ``keep_entries``, the entries read are kept for :meth:`take_entries`. Raises
        :class:`RepositoryError` when the root cannot be listed (the problems of the last
        check stay).
        """
        with self._problems_lock:
            self._watching = True
            if read_model_files is not None:
                self._read_files = read_model_files
            if listing_only is not None:
                self._listing_only = listing_only
            read_files = self._read_files
            only_listing = self._listing_only
            files = self._files
        entries: dict[str, ModelEntry] | None = {} if keep_entries else None
        found, made = find_problems(
            self._repository,
            memory_budget=self._memory_budget,
            pool_size=self._pool_size,
            read_model_files=read_files,
            files=files,
            listing_only=only_listing,
            entries=entries,
        )
        current = tuple(dict.fromkeys(found))  # one of each, in order
        with self._problems_lock:
            before, self._current, self._files = self._current, current, made
            if entries is not None:
                self._entries = entries
        seen = set(before)
        for problem in current:
            if problem not in seen:
                logger.warning("corral: repository problem %s", _described(problem))
        now = set(current)
        for problem in before:
            if problem not in now:
                logger.info(
                    "corral: repository problem (%s) in %s is gone",
                    problem.kind.value,
                    problem.path,
                )
        return current

    def recheck(self) -> None:
        """Check again if :meth:`check` was ever called; a no-op otherwise."""
        with self._problems_lock:
            watching = self._watching
        if watching:
            self.check()


def _url_join(url: str | os.PathLike[str], *parts: str) -> str:
    """``parts`` under the repository URL ``url``, with ``/``."""
    return "/".join([os.fspath(url).rstrip("/"), *parts])


def _described(problem: Problem) -> str:
    """A problem as its log line says it: kind, what is wrong, the file (if not named), fix."""
    where = "" if problem.path in problem.message else f" (file: {problem.path})"
    return f"({problem.kind.value}): {problem.message}{where}; fix: {problem.fix}"


def _missing_provider(root: Path, entry: ModelEntry, error: ProviderUnavailable) -> Problem:
    path = _settings_file(root, entry.name)
    setting = "KIND_GPU or execution_accelerators" if path.endswith(CONFIG_PBTXT) else "providers"
    return Problem(
        ProblemKind.MISSING_PROVIDER,
        entry.name,
        path,
        f"model {entry.name!r}: {error}",
        f"install an onnxruntime build that has it, or take it out of the model's {setting}",
    )


def _library_problems(
    root: Path,
    entry: ModelEntry,
    previous: Mapping[FileKey, _FileFacts],
    made: dict[FileKey, _FileFacts],
) -> list[Problem]:
    problems: list[Problem] = []
    for library in entry.config.custom_op_libraries:
        key = _library_key(library)
        facts = previous.get(key, made.get(key))
        if facts is None:
            try:
                ort.check_custom_op_libraries([library], f"model {entry.name!r}")
                facts = ""
            except ModelLoadError as exc:
                facts = str(exc)
        made[key] = facts
        if facts:
            problems.append(
                Problem(
                    ProblemKind.BAD_CUSTOM_OP_LIBRARY,
                    entry.name,
                    _settings_file(root, entry.name),
                    str(facts),
                    f"replace {library} with a custom operator library built for this "
                    "onnxruntime, or take it out of the model's settings",
                )
            )
    return problems


def _library_key(library: str) -> FileKey:
    """A library's key among the files read: its path, size and mtime as it is now."""
    if library == ort.EXTENSIONS_LIBRARY:
        return (library, 0, 0)
    try:
        info = os.stat(library)
    except OSError:
        return (library, -1, -1)
    return (library, info.st_size, info.st_mtime_ns)


def _file_problems(
    root: Path,
    entry: ModelEntry,
    memory_budget: int | None,
    pool_size: int,
    previous: Mapping[FileKey, _FileFacts],
    made: dict[FileKey, _FileFacts],
) -> list[Problem]:
    problems: list[Problem] = []
    config = entry.config
    replicas: int | None = None
    for version in entry.served_versions:
        file = entry.versions[version]
        key = (str(file.path), file.size, file.mtime_ns)
        facts = previous.get(key)
        if facts is None:
            try:
                facts = read_model_file_and_proof(file.path)
            except ModelLoadError as exc:
                facts = str(exc)
        made[key] = facts
        if isinstance(facts, str):
            problems.append(
                Problem(
                    ProblemKind.BAD_MODEL_FILE,
                    entry.name,
                    str(file.path),
                    f"model {entry.name!r} version {version}: {facts}",
                    f"replace {file.path} with a valid ONNX model and its external data files",
                )
            )
            continue
        model_file, _ = facts
        mismatches = (
            declaration_mismatches(config, model_file.signature)
            if config.inputs or config.outputs
            else []
        )
        if mismatches:
            settings = _settings_file(root, entry.name)
            problems.extend(
                Problem(
                    ProblemKind.BAD_CONFIG_PBTXT,
                    entry.name,
                    settings,
                    f"model {entry.name!r} version {version}: {mismatch.message}",
                    mismatch.fix,
                )
                for mismatch in mismatches
            )
        if memory_budget is None:
            continue
        if replicas is None:
            providers = resolve_providers(config.providers)
            replicas = resolve_policy(config.concurrency, providers, pool_size=pool_size).replicas
        declared = declared_bytes(config)
        estimate = (
            estimate_footprint_bytes(model_file.footprint, replicas)
            if declared is None
            else declared
        )
        if estimate > memory_budget:
            said = "is estimated at" if declared is None else "declares (memory_bytes)"
            problems.append(
                Problem(
                    ProblemKind.TOO_LARGE,
                    entry.name,
                    str(file.path),
                    f"model {entry.name!r} version {version} {said} {estimate:,} bytes "
                    f"once loaded, more than the whole memory budget ({memory_budget:,} bytes)",
                    f"raise --memory-budget to at least {estimate:,} bytes, or serve a smaller "
                    "model (or fewer sessions of it: its concurrency)",
                )
            )
    return problems


def _settings_file(root: Path, name: str) -> str:
    """The model's settings file if it has one, else its folder (or its file)."""
    folder = root / name
    if not folder.is_dir():
        return str(root / f"{name}.onnx")
    for file_name in ("model.toml", CONFIG_PBTXT):
        if (folder / file_name).is_file():
            return str(folder / file_name)
    return str(folder)
