"""Repository: where model files live, how they are laid out, and when they change.

The layout is Triton's, so an existing model repository needs no change::

    <root>/
      fraud/
        model.toml          optional: see corral._models.config
        1/model.onnx
        2/model.onnx        a version is a folder named by a positive integer
      churn.onnx            a bare file is version 1 of the model "churn"

A root that looks like one model's folder instead (a version folder holding its
``model.onnx``, or a ``config.pbtxt`` or ``model.toml`` at the top) is refused, naming its
parent: served, its version folders would be models of their own.

The root may also be a URL in object storage (``s3://bucket/prefix``): its models are then
listed from the store and each one's files copied into a local cache folder on first use
(:mod:`corral._models.store`), where everything below reads them.

The root may be a symlink (the usual ``current -> release-N`` deployment): it is resolved
again on every listing and every entry read (one ``realpath``), so switching it takes effect
at the next poll or cold load, and every check below is made against its current target.

Nothing outside the root is ever read. Every path the repository reads (a model folder, a
model.toml, a model.onnx) has its symlinks resolved and must stay inside the resolved root;
symlinks that stay inside are fine. An escaping path makes the model unloadable
(:attr:`ModelEntry.error`) without touching the rest of the repository. Model files are only
stat'ed here; the only file read is model.toml, and only up to :data:`MAX_CONFIG_BYTES`.

Here: model names, the root and its listing, the overrides a load puts in place, and reading
one model's folder. Every path check and bounded read is :mod:`corral._models.confined`'s; the
entries built, with the fingerprints that tell a change, are :mod:`corral._models.model_entry`'s
(:class:`ModelEntry` and :class:`ModelVersion` are importable from here too).
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import logging
import os
import re
import stat
import threading
from pathlib import Path
from typing import NamedTuple

from corral._base import (
    InvalidModelName,
    InvalidOption,
    ModelConfigError,
    ModelInvalid,
    ModelLoadError,
    ModelNotFound,
    ProblemKind,
    RepositoryError,
)
from corral._models.config import ModelConfig
from corral._models.confined import (
    Found,
    Root,
    beside_stamps,
    locate,
    locate_library,
    only_if,
    outside_error,
    read_text,
    read_warmup,
)
from corral._models.model_entry import (
    VERSION_FOLDER,
    ModelEntry,
    ModelVersion,
    Problems,
    make_entry,
)
from corral._models.overrides import ModelOverride
from corral._models.pbtxt.parse import (
    CONFIG_PBTXT,
    PYTHON_BACKEND,
    PYTHON_MODEL_FILE,
    ParsedConfigs,
)
from corral._models.provider_options import locate_provider_paths, refuse_provider_paths
from corral._models.store import DEFAULT_FETCH_TIMEOUT_S, Store, is_store_url
from corral._onnx import EXTENSIONS_LIBRARY

__all__ = [
    "MAX_CONFIG_BYTES",
    "MAX_LABELS_BYTES",
    "MODEL_NAME_PATTERN",
    "Listing",
    "Repository",
    "validate_model_name",
]

logger = logging.getLogger(__name__)

#: What a model name may be; use it with ``re.fullmatch``. A leading letter or digit already
#: rules out ".", ".." and hidden files; the character set rules out "/" and "\\".
MODEL_NAME_PATTERN = r"[A-Za-z0-9][A-Za-z0-9_.\-]{0,127}"

#: The largest model.toml or config.pbtxt read; a bigger one is a ModelConfigError, not a
#: memory hazard.
MAX_CONFIG_BYTES = 64 * 1024
#: The largest label file (a config.pbtxt's label_filename) read.
MAX_LABELS_BYTES = 4 * 1024 * 1024

_MAX_NAME_LENGTH = 128
_NAME_RE = re.compile(MODEL_NAME_PATTERN)
_NAME_CHAR_RE = re.compile(r"[A-Za-z0-9_.\-]")
_BARE_SUFFIX = ".onnx"
_CONFIG_FILE = "model.toml"
_FIX_READABLE = "make it readable by the server's user"
_FIX_INSIDE = "keep every file of the model inside the repository (copy it in, not a symlink out)"


def _one_models_folder(root: str) -> str | None:
    """What makes ``root`` look like one model's folder, not a repository; None if nothing.

    That is a version folder with its model file, or a model's config, at the top.
    In a repository, a model's config is one level down (``<model>/config.pbtxt``) and its
    files two (``<model>/<version>/model.onnx``): at the root, neither is ever read, so a
    server given a model's folder would serve its version folders as models of their own.
    """
    for config in (CONFIG_PBTXT, "model.toml"):
        if os.path.isfile(os.path.join(root, config)):
            return config
    try:
        names = os.listdir(root)
    except OSError:
        return None  # the listing's own error says what is wrong, on first use
    for name in sorted(names):
        if name.isdigit() and os.path.isfile(os.path.join(root, name, "model.onnx")):
            return f"the version folder {name}/ with its model.onnx"
    return None


_DIGITS = re.compile(r"(\d+)")


@functools.lru_cache(maxsize=1 << 16)  # bounded: names come and go with the repository
def natural_key(name: str) -> tuple[tuple[tuple[int, int, str], ...], str]:
    """A model name's sort key in natural order: ``m2`` before ``m10``, as people count.

    Runs of digits compare as numbers, the rest as text; names equal that way (``m01`` and
    ``m1``) keep their plain order.
    """
    parts = tuple(
        (0, int(part), "") if index % 2 else (1, 0, part)
        for index, part in enumerate(_DIGITS.split(name))
        if part
    )
    return parts, name


def validate_model_name(name: object) -> str:
    """Return ``name`` if it can name a model; else raise InvalidModelName naming the rule broken.

    A name is 1 to 128 characters of ASCII letters, digits, ``_``, ``.`` and ``-``, starting
    with a letter or digit: it is always one path component inside the repository.

    >>> validate_model_name("fraud-v2")
    'fraud-v2'
    """
    if not isinstance(name, str):
        raise InvalidModelName(f"a model name must be a string, got {type(name).__name__}")
    if _NAME_RE.fullmatch(name):
        return name
    shown = _shorten(repr(name))
    if not name:
        raise InvalidModelName("a model name must not be empty")
    if len(name) > _MAX_NAME_LENGTH:
        raise InvalidModelName(
            f"a model name must be at most {_MAX_NAME_LENGTH} characters, got {len(name)}: {shown}"
        )
    bad = sorted({char for char in name if not _NAME_CHAR_RE.fullmatch(char)})
    if bad:
        raise InvalidModelName(
            f"a model name may contain only ASCII letters, digits, '_', '.' and '-'; "
            f"{shown} contains {', '.join(repr(char) for char in bad)}"
        )
    raise InvalidModelName(f"a model name must start with a letter or digit, got {shown}")


class Listing(NamedTuple):
    """The root folder's models, and the entries it skipped because of their names."""

    #: The models' names, sorted.
    names: list[str]
    #: Folders and ``.onnx`` files whose names cannot name a model (as found on disk, sorted);
    #: hidden ones (a leading dot) are left out.
    invalid: list[str]


class Repository:
    """A folder of models laid out as Triton lays them out (see the module docstring).

    Nothing is cached: every call looks at the disk, and :attr:`ModelEntry.fingerprint` tells
    a caller whether a model changed since it last looked. A root that is a symlink is
    resolved again by each call, which reads everything against that one target. Its only
    mutable state is the target last seen (to log a switch once) and the models' overrides
    (:meth:`replace_override`), each under its lock, so any number of threads may call
    :meth:`names`, :meth:`entry` and :meth:`scan` at once.

    A model with an override (``corral._models.overrides``: a load's ``config`` and files) is read
    through it: its settings from the override's text, its versions and files from the
    override's folder when it has one (a folder outside the root, written by corral itself).

    Example::

        repo = Repository("models/")
        entry = repo.entry("fraud")
        if entry.error is None and entry.latest is not None:
            path = entry.versions[entry.latest].path
    """

    def __init__(
        self,
        root: str | os.PathLike[str],
        *,
        cache_dir: str | os.PathLike[str] | None = None,
        cache_bytes: int | None = None,
        fetch_timeout_s: float = DEFAULT_FETCH_TIMEOUT_S,
    ) -> None:
        #: The object store the models come from (``s3://...``), or None: a local folder.
        self.store: Store | None = None
        if is_store_url(root):
            # The store's models are read from their copies in the cache folder: listing one
            # at start says at once whether the store can be reached.
            assert isinstance(root, str)  # is_store_url takes only a str
            self.store = Store(root, cache_dir, cache_bytes=cache_bytes, timeout_s=fetch_timeout_s)
            try:
                self.store.names(first=True)
            except BaseException:
                self.store.close()  # its cache folder is free for the next try at once
                raise
            root = self.store.cache_dir
        elif cache_dir is not None or cache_bytes is not None:
            raise InvalidOption(
                f"cache_dir and cache_bytes apply to a repository in object storage "
                f"(s3://...), not to the folder {os.fspath(root)!r}",
                option="cache_dir" if cache_dir is not None else "cache_bytes",
            )
        given = os.fspath(root)
        real = os.path.realpath(given)
        if not os.path.exists(real):
            raise RepositoryError(f"model repository {given!r} does not exist")
        if not os.path.isdir(real):
            raise RepositoryError(f"model repository {given!r} is not a folder")
        one_model = _one_models_folder(real)
        if one_model is not None:
            parent = os.path.dirname(os.path.abspath(given))
            raise RepositoryError(
                f"{given!r} looks like one model's folder, not a repository of models: it "
                f"holds {one_model}; give the folder that holds the model folders instead "
                f"(its parent, {parent!r}, if that is the repository)"
            )
        # Absolute, so that a change of the working directory does not move the repository.
        self._given = os.path.abspath(given)
        # Guards _target: the root's target last seen, to log each switch once.
        self._target_lock = threading.Lock()
        self._target = real
        # Guards _overrides: each overridden model's ModelOverride.
        self._overrides_lock = threading.Lock()
        self._overrides: dict[str, ModelOverride] = {}
        # Every config.pbtxt parsed, by its text: the check and the load read each one.
        self._parsed = ParsedConfigs()

    @property
    def url(self) -> str:
        """Where the models come from, as given: the store's URL, or the folder."""
        return self._given if self.store is None else self.store.url

    @property
    def root(self) -> Path:
        """The repository's folder, symlinks resolved now: a switched symlink's new target."""
        return Path(self._resolve().real)

    @property
    def given(self) -> Path:
        """The repository's folder as given (made absolute), before symlinks are resolved."""
        return Path(self._given)

    def __repr__(self) -> str:
        if self.store is not None:
            return f"Repository({self.store.url!r}, cache {self._given!r})"
        with self._target_lock:
            target = self._target
        if target == self._given:
            return f"Repository({target!r})"
        return f"Repository({self._given!r} -> {target!r})"

    def _resolve(self) -> Root:
        """The root's target now (one ``realpath``); a switch is logged once."""
        real = os.path.realpath(self._given)
        with self._target_lock:
            previous, self._target = self._target, real
        if previous != real:
            logger.warning(
                "corral: model repository %s now resolves to %s (was %s)",
                self._given,
                real,
                previous,
            )
        return Root(real, real if real.endswith(os.sep) else real + os.sep)

    def override(self, name: str) -> ModelOverride | None:
        """The override a load put in place for model ``name``, or None."""
        with self._overrides_lock:
            return self._overrides.get(name)

    def replace_override(
        self, name: str, override: ModelOverride | None, *, expected: ModelOverride | None
    ) -> bool:
        """Put ``override`` in place for ``name`` (None: none), if ``expected`` is in place.

        Returns False, changing nothing, when another override (or none) is in place: a
        compare-and-set, so that a failed load gives back only what it took.
        """
        validate_model_name(name)
        with self._overrides_lock:
            if self._overrides.get(name) is not expected:
                return False
            if override is None:
                self._overrides.pop(name, None)
            else:
                self._overrides[name] = override
            return True

    def names(self) -> list[str]:
        """The names of all models, sorted: sub-folders and bare ``<name>.onnx`` files.

        Entries whose names cannot name a model (hidden files, spaces ...) are skipped
        (:meth:`listing` names them). This reads the root folder only, so it stays fast for
        tens of thousands of models. Models whose files were uploaded by a load are listed too.
        """
        return self.listing().names

    def listing(self) -> Listing:
        """The models' names as :meth:`names` lists them, and the entries skipped for their name.

        Raises :class:`RepositoryError` when the root cannot be listed.
        """
        with self._overrides_lock:
            found = {name for name, o in self._overrides.items() if o.folder is not None}
        invalid: list[str] = []
        if self.store is not None:
            return self._store_listing(found)
        root = self._resolve()
        try:
            with os.scandir(root.real) as listing:
                for item in listing:
                    name = self._model_name(item)
                    if name is None:
                        continue
                    if _NAME_RE.fullmatch(name):
                        found.add(name)
                    else:
                        logger.debug("skipping %r in %s: not a valid model name", name, self)
                        if not item.name.startswith("."):
                            invalid.append(item.name)
        except OSError as exc:
            raise RepositoryError(
                f"cannot list model repository {self._given!r} (resolved to {root.real!r}): {exc}"
            ) from exc
        return Listing(sorted(found), sorted(invalid))

    def entry(self, name: str) -> ModelEntry:
        """The model ``name`` as it is on disk now.

        Raises :class:`InvalidModelName` for a name that cannot name a model,
        :class:`ModelNotFound` when neither ``<root>/<name>/`` nor ``<root>/<name>.onnx``
        exists, and :class:`RepositoryError` when the root folder itself is gone; for a
        repository in object storage, :class:`StoreUnavailable` when the model's files cannot
        be fetched within the deadline (:mod:`corral._models.store`). Every other
        problem (a malformed model.toml, a path leading outside the root, no version at all) is
        reported in :attr:`ModelEntry.error`, never raised.
        """
        validate_model_name(name)
        override = self.override(name)
        while override is not None and override.folder is not None:
            entry = self._uploaded_entry(name, override, override.folder)
            now = self.override(name)
            if entry.error is None or now is override:
                return entry
            # Replaced while its folder was read (and the folder removed): read what is in
            # place now instead of answering with the files another load deleted.
            override = now
        if self.store is None:
            return self._repository_entry(name, override)
        # The model's files are copied from the store (or found unchanged in the cache), then
        # read as a local folder's; kept in the cache while they are read.
        with self.store.opened(name):
            return self._repository_entry(name, override)

    def holds(self, name: str) -> bool:
        """Whether the repository itself has model ``name`` (a folder or a bare file).

        Uploads (a load's override) aside, and whether or not it can be served: one ``lstat``
        of each for a folder, a listing request (and a HEAD) for object storage, whose
        :class:`StoreUnavailable` it raises (:meth:`corral._models.store.Store.holds`).
        """
        validate_model_name(name)
        if self.store is not None:
            return self.store.holds(name)
        folder = os.path.join(self._resolve().real, name)
        return os.path.lexists(folder) or os.path.lexists(folder + _BARE_SUFFIX)

    def kept(self, name: str) -> contextlib.AbstractContextManager[None]:
        """Keep model ``name``'s files where :meth:`entry` found them while inside.

        For a repository in object storage: its copy is not evicted from the cache meanwhile
        (:meth:`corral._models.store.Store.kept`). For a folder, nothing to do.
        """
        return contextlib.nullcontext() if self.store is None else self.store.kept(name)

    def is_current(self, entry: ModelEntry) -> bool:
        """Whether ``entry`` was read through the load's override in place now (or none).

        An entry read through an override another load replaced since may name files that
        are gone: it is read again before a load uses it.
        """
        override = self.override(entry.name)
        return entry.override_generation == (None if override is None else override.generation)

    def _repository_entry(self, name: str, override: ModelOverride | None) -> ModelEntry:
        root = self._resolve()
        folder_path = os.path.join(root.real, name)
        bare_path = folder_path + _BARE_SUFFIX
        try:
            folder = only_if(locate(root, folder_path), stat.S_ISDIR)
            bare = only_if(locate(root, bare_path), stat.S_ISREG)
        except OSError as exc:
            error = ModelLoadError(f"model {name!r}: cannot stat it: {exc}")
            found = Problems.one(name, ProblemKind.BAD_LAYOUT, error, folder_path, _FIX_READABLE)
            return make_entry(name, {}, ModelConfig(), None, found, layout="unreadable")
        if folder is not None and bare is not None:
            error = ModelInvalid(
                f"model {name!r}: both {folder_path}{os.sep} and {bare_path} exist; "
                f"keep the folder or the file, not both"
            )
            fix = f"remove {folder_path}{os.sep} or {bare_path}"
            found = Problems.one(name, ProblemKind.BAD_LAYOUT, error, bare_path, fix)
            return make_entry(name, {}, ModelConfig(), None, found, layout="both")
        if folder is not None:
            return self._folder_entry(root, name, folder_path, folder, override)
        if bare is not None:
            if override is not None:
                error = ModelConfigError(
                    f"model {name!r} is the file {bare_path}: a load's config applies only "
                    "to a model folder"
                )
                fix = f"move {bare_path} to {os.path.join(folder_path, '1', 'model.onnx')}"
                found = Problems.one(name, ProblemKind.BAD_CONFIG_PBTXT, error, bare_path, fix)
                return make_entry(name, {}, ModelConfig(), None, found, layout="file")
            return self._bare_entry(root, name, bare_path, bare)
        if not os.path.isdir(root.real):
            # Moved away or unmounted: that says nothing of whether the model exists, and a
            # Host must not drop the models it serves for it.
            raise RepositoryError(
                f"model repository {self._given!r} (resolved to {root.real!r}) is gone"
            )
        # The text Triton's clients match on ("Request for unknown model"), then corral's why.
        raise ModelNotFound(
            f"Request for unknown model: {name!r} is not found: no folder {name}{os.sep} "
            f"or file {name}{_BARE_SUFFIX} in {root.real}"
        )

    def scan(self) -> dict[str, ModelEntry]:
        """Every model, ``{name: entry}`` in name order: for change detection and the index."""
        entries: dict[str, ModelEntry] = {}
        for name in self.names():
            try:
                entries[name] = self.entry(name)
            except ModelNotFound:
                continue  # removed between listing and looking: it is simply gone
        return entries

    # -- private -----------------------------------------------------------------------------

    def _store_listing(self, found: set[str]) -> Listing:
        assert self.store is not None
        folders, files = self.store.names()
        invalid: list[str] = []
        for item, name in [(f, f) for f in folders] + [
            (f, f[: -len(_BARE_SUFFIX)]) for f in files if f.endswith(_BARE_SUFFIX)
        ]:
            if _NAME_RE.fullmatch(name):
                found.add(name)
            elif not item.startswith("."):
                invalid.append(item)
        return Listing(sorted(found), sorted(invalid))

    @staticmethod
    def _model_name(item: os.DirEntry[str]) -> str | None:
        try:
            # Follows a symlink: a link to a folder is a model (whether it escapes the root is
            # entry()'s business, which reports it instead of hiding the model).
            if item.is_dir():
                return item.name
            if item.name.endswith(_BARE_SUFFIX) and item.is_file():
                return item.name[: -len(_BARE_SUFFIX)]
        except OSError:
            logger.debug("skipping %r in the model repository: cannot stat it", item.name)
        return None

    def _bare_entry(self, root: Root, name: str, path: str, found: Found) -> ModelEntry:
        if found.stat is None:
            error = outside_error(root, name, path, found.real)
            problems = Problems.one(name, ProblemKind.BAD_LAYOUT, error, path, _FIX_INSIDE)
            return make_entry(name, {}, ModelConfig(), None, problems, layout="file")
        version = ModelVersion(1, Path(found.real), found.stat.st_size, found.stat.st_mtime_ns)
        return make_entry(name, {1: version}, ModelConfig(), None, Problems(name), layout="file")

    def _uploaded_entry(self, name: str, override: ModelOverride, folder: str) -> ModelEntry:
        # A folder corral wrote itself (corral._host.uploads.Uploads), read as a model folder
        # confined to itself.
        root = Root(folder, folder + os.sep)
        try:
            found = Found(folder, os.stat(folder))
        except OSError as exc:
            error = ModelLoadError(
                f"model {name!r}: its uploaded files in {folder} are gone: {exc}"
            )
            fix = "load the model again with its files"
            problems = Problems.one(name, ProblemKind.BAD_LAYOUT, error, folder, fix)
            return make_entry(name, {}, ModelConfig(), None, problems, layout="uploaded")
        return self._folder_entry(root, name, folder, found, override, layout="uploaded")

    def _folder_entry(
        self,
        root: Root,
        name: str,
        path: str,
        found: Found,
        override: ModelOverride | None = None,
        *,
        layout: str = "folder",
    ) -> ModelEntry:
        if found.stat is None:
            error = outside_error(root, name, path, found.real)
            problems = Problems.one(name, ProblemKind.BAD_LAYOUT, error, path, _FIX_INSIDE)
            return make_entry(name, {}, ModelConfig(), None, problems, layout=layout)
        problems = Problems(name)
        if override is None:
            config, config_stamp = self._read_config(root, name, path, found.real, problems)
        else:
            config, config_stamp = self._read_override(root, name, found.real, override, problems)
        versions: dict[int, ModelVersion] = {}
        try:
            with os.scandir(found.real) as listing:
                children = [item.name for item in listing if VERSION_FOLDER.fullmatch(item.name)]
        except OSError as exc:
            unlisted = ModelLoadError(f"model {name!r}: cannot list {path}: {exc}")
            problems.add(ProblemKind.BAD_LAYOUT, unlisted, path, _FIX_READABLE)
            children = []
        for child in children:
            version = self._read_version(
                root, name, path, found.real, child, config.model_filename, problems
            )
            if version is not None:
                versions[version.version] = version
        if not versions and not problems.errors:
            expected = os.path.join(path, "<N>", config.model_filename)
            error = ModelInvalid(
                f"model {name!r}: no version in {path}: expected {expected} "
                "with N a positive integer"
            )
            fix = f"put the model file in {os.path.join(path, '1', config.model_filename)}"
            problems.add(ProblemKind.NO_VERSION, error, path, fix)
        return make_entry(name, versions, config, config_stamp, problems, layout=layout)

    def _read_override(
        self,
        root: Root,
        name: str,
        real_folder: str,
        override: ModelOverride,
        problems: Problems,
    ) -> tuple[ModelConfig, tuple[object, ...]]:
        """A load's config, read instead of the folder's model.toml and config.pbtxt."""
        source = f"model {name!r}: the load's config"
        try:
            config, files = self._parse_pbtxt(root, source, name, real_folder, override.config_text)
            _refuse_library_paths(source, config)
            refuse_provider_paths(source, config)
        except ModelConfigError as exc:
            fix = "load the model again with a corrected config"
            problems.add(ProblemKind.BAD_CONFIG_PBTXT, exc, real_folder, fix)
            return ModelConfig(), ("override", override.generation)
        return config, ("override", override.generation, *files)

    def _read_config(
        self,
        root: Root,
        name: str,
        folder: str,
        real_folder: str,
        problems: Problems,
    ) -> tuple[ModelConfig, tuple[object, ...] | None]:
        toml = self._find_config(root, name, folder, real_folder, _CONFIG_FILE, problems)
        pbtxt = self._find_config(root, name, folder, real_folder, CONFIG_PBTXT, problems)
        if toml is None and pbtxt is None:
            if self.store is None and _python_model_without_config(real_folder):
                # As Triton infers the Python backend from a model.py: its class's
                # auto_complete_config then gives its inputs and outputs.
                config, _ = self._parse_pbtxt(
                    root,
                    f"model {name!r} (a model.py without a config)",
                    name,
                    real_folder,
                    f'backend: "{PYTHON_BACKEND}"',
                )
                return config, None
            return ModelConfig(), None
        stamp: tuple[object, ...] = (
            None if toml is None else toml[1],
            None if pbtxt is None else pbtxt[1],
        )
        if toml is not None and pbtxt is not None:
            # Two sources of settings would need a rule for which wins; any such rule would
            # drop one file's settings without a word.
            error = ModelConfigError(
                f"model {name!r}: both {toml[0]} and {pbtxt[0]} exist; keep one of them"
            )
            problems.add(ProblemKind.BAD_LAYOUT, error, folder, f"remove {toml[0]} or {pbtxt[0]}")
            return ModelConfig(), stamp
        for chosen in (toml, pbtxt):
            if chosen is not None:
                source, _, found = chosen
        if found is None or found.stat is None:
            return ModelConfig(), stamp  # its problem is already recorded
        try:
            text = read_text(found.real, found.stat, source, MAX_CONFIG_BYTES)
            files: list[tuple[object, ...]] = []
            if toml is not None:
                config = ModelConfig.from_toml(text, source=source)
            else:
                config, files = self._parse_pbtxt(root, source, name, real_folder, text)
            # An absolute library path is the operator's, in a local repository's
            # config.pbtxt; an object store's config names no file on this machine.
            absolute = self.store is None and config.source == "config.pbtxt"
            config = _with_libraries_located(source, real_folder, config, files, absolute)
            config = locate_provider_paths(source, real_folder, config, files)
        except ModelConfigError as exc:
            if toml is not None:
                fix = f"correct the field named in {source} (docs/host.md lists its fields)"
                problems.add(ProblemKind.BAD_MODEL_TOML, exc, source, fix)
            else:
                fix = (
                    f"correct or remove the field named in {source} (docs/host.md: what it honours)"
                )
                problems.add(ProblemKind.BAD_CONFIG_PBTXT, exc, source, fix)
            return ModelConfig(), stamp
        return config, (*stamp, *files)

    def _find_config(
        self,
        root: Root,
        name: str,
        folder: str,
        real_folder: str,
        file_name: str,
        problems: Problems,
    ) -> tuple[str, tuple[object, ...], Found | None] | None:
        """One settings file: (path shown, stamp, where it is; None if unreadable), or None."""
        source = os.path.join(folder, file_name)
        path = os.path.join(real_folder, file_name)
        try:
            # A dangling link means a config was meant: serving with defaults instead would
            # drop its settings (pinning, providers) without a word.
            found = locate(root, path, dangling_ok=False)
        except OSError as exc:
            unreadable = ModelConfigError(f"{source}: cannot read it: {exc}")
            problems.add(ProblemKind.BAD_LAYOUT, unreadable, source, _FIX_READABLE)
            return source, ("unreadable", str(exc)), None
        if found is None:
            return None
        if found.stat is None:
            error = outside_error(root, name, source, found.real)
            problems.add(ProblemKind.BAD_LAYOUT, error, source, _FIX_INSIDE)
            return source, ("outside", found.real), None
        return source, (found.real, found.stat.st_size, found.stat.st_mtime_ns), found

    def _parse_pbtxt(
        self, root: Root, source: str, name: str, real_folder: str, text: str
    ) -> tuple[ModelConfig, list[tuple[object, ...]]]:
        """A config.pbtxt's text as a ModelConfig, and the stamps of the files it read.

        The label and warm-up files it names are read from the model's folder, and each
        one's stamp is part of the entry's fingerprint, so that changing one is a change.
        """
        files: list[tuple[object, ...]] = []
        config = self._parsed.parse(
            text,
            source=source,
            model_name=name,
            read_labels=lambda path, field: self._read_labels(
                root, source, real_folder, path, field, files
            ),
            read_warmup=lambda file_name, field, limit: read_warmup(
                source, real_folder, file_name, field, limit, files
            ),
        )
        return config, files

    def _read_labels(
        self,
        root: Root,
        source: str,
        real_folder: str,
        relative: str,
        field: str,
        stamps: list[tuple[object, ...]],
    ) -> tuple[str, ...]:
        """A label file named by a config.pbtxt, inside the model's folder: one label a line."""
        shown = f"{source}: {field} {relative!r}"
        if os.path.isabs(relative) or ".." in relative.replace("\\", "/").split("/"):
            raise ModelConfigError(f"{shown} must be a path inside the model's folder")
        try:
            found = locate(root, os.path.join(real_folder, relative), dangling_ok=False)
        except OSError as exc:
            raise ModelConfigError(f"{shown}: cannot read it: {exc}") from exc
        if found is None:
            raise ModelConfigError(f"{shown}: no such file in the model's folder")
        if found.stat is None:
            raise ModelConfigError(f"{shown} resolves outside the repository root")
        stamps.append((found.real, found.stat.st_size, found.stat.st_mtime_ns))
        text = read_text(found.real, found.stat, shown, MAX_LABELS_BYTES)
        return tuple(text.splitlines())

    def _read_version(
        self,
        root: Root,
        name: str,
        folder: str,
        real_folder: str,
        child: str,
        model_file: str,
        problems: Problems,
    ) -> ModelVersion | None:
        shown = os.path.join(folder, child)
        try:
            version_dir = locate(root, os.path.join(real_folder, child))
            if version_dir is None:
                return None
            if version_dir.stat is None:
                error = outside_error(root, name, shown, version_dir.real)
                problems.add(ProblemKind.BAD_LAYOUT, error, shown, _FIX_INSIDE)
                return None
            if not stat.S_ISDIR(version_dir.stat.st_mode):
                return None  # a file that happens to have a number for a name
            if not model_file:
                # An ensemble's version: the folder itself (Triton's are empty), by its stamp.
                return ModelVersion(
                    int(child),
                    Path(version_dir.real),
                    version_dir.stat.st_size,
                    version_dir.stat.st_mtime_ns,
                )
            shown = os.path.join(shown, model_file)
            model = locate(root, os.path.join(version_dir.real, model_file))
        except OSError as exc:
            unread = ModelLoadError(f"model {name!r}: cannot stat {shown}: {exc}")
            problems.add(ProblemKind.BAD_LAYOUT, unread, shown, _FIX_READABLE)
            return None
        if model is None:
            logger.debug("ignoring %s: no %s in it", os.path.dirname(shown), model_file)
            problems.note(
                ProblemKind.NO_MODEL_FILE,
                os.path.dirname(shown),
                f"model {name!r}: version folder {os.path.dirname(shown)} has no {model_file}; "
                "that version is not served",
                f"put the model file in {shown}, or remove the folder",
            )
            return None
        if model.stat is None:
            error = outside_error(root, name, shown, model.real)
            problems.add(ProblemKind.BAD_LAYOUT, error, shown, _FIX_INSIDE)
            return None
        if not stat.S_ISREG(model.stat.st_mode):
            error = ModelInvalid(f"model {name!r}: {shown} is not a regular file")
            problems.add(ProblemKind.BAD_LAYOUT, error, shown, f"make {shown} a model file")
            return None
        # The files beside the model file (its external data) are part of the version.
        beside = beside_stamps(version_dir.real, model_file)
        return ModelVersion(
            int(child),
            Path(model.real),
            model.stat.st_size,
            model.stat.st_mtime_ns,
            beside,
            version_dir.real,
        )


def _shorten(text: str, limit: int = 60) -> str:
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _with_libraries_located(
    source: str,
    real_folder: str,
    config: ModelConfig,
    stamps: list[tuple[object, ...]],
    absolute: bool,
) -> ModelConfig:
    """``config`` with each custom op library path made its real path.

    Inside the model's folder, or with ``absolute`` also an absolute path anywhere.
    """
    if not config.custom_op_libraries:
        return config
    located = tuple(
        library
        if library == EXTENSIONS_LIBRARY
        else locate_library(source, real_folder, library, stamps, absolute=absolute)
        for library in config.custom_op_libraries
    )
    return dataclasses.replace(config, custom_op_libraries=located)


def _refuse_library_paths(source: str, config: ModelConfig) -> None:
    """A load's config may name onnxruntime-extensions' library, never a library file.

    Its files come from the client that sent it: loading one would run the client's code.
    """
    for library in config.custom_op_libraries:
        if library != EXTENSIONS_LIBRARY:
            raise ModelConfigError(
                f"{source}: model_operations.op_library_filename {library!r}: a load's config "
                f"may name only {EXTENSIONS_LIBRARY!r}; a library file is loaded only from a "
                "config.pbtxt or model.toml in the repository, never from a load's config or "
                "files"
            )


def _python_model_without_config(folder: str) -> bool:
    """Whether a model folder without a config holds a Triton Python model, as Triton infers it.

    A version folder holds ``model.py`` and none holds ``model.onnx`` (an ONNX model then,
    whatever else lies beside it).
    """
    try:
        with os.scandir(folder) as listing:
            versions = [item.path for item in listing if VERSION_FOLDER.fullmatch(item.name)]
    except OSError:
        return False  # the listing's own error is the entry's to report
    python = any(os.path.isfile(os.path.join(v, PYTHON_MODEL_FILE)) for v in versions)
    return python and not any(os.path.isfile(os.path.join(v, "model.onnx")) for v in versions)
