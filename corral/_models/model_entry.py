"""A model as the repository found it at one look, and the fingerprints that tell a change.

:class:`ModelEntry` holds a model's versions on disk, its configuration, the problems met
reading it and, when one of them makes it unloadable, its error. Its fingerprint is what
change detection compares (the reloader, the Host's scan): it changes when a served file, a
settings file, the set of versions or the error changes; :meth:`ModelEntry.version_fingerprint`
tells whether a loaded copy of one version is still what the disk holds. The repository
(:mod:`corral._models.repository`) builds entries with :func:`make_entry`, gathering what it meets
in :class:`Problems`.
"""

from __future__ import annotations

import os
import re
import types
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from corral._base import ModelInvalid, ModelLoadError, Problem, ProblemKind
from corral._models.config import ModelConfig
from corral._models.confined import beside_stamps

__all__ = ["VERSION_FOLDER", "ModelEntry", "ModelVersion", "Problems", "make_entry"]

#: A version folder's name: a whole number from 1, ASCII digits only (``str.isdigit`` also
#: takes "²" and other scripts' digits), as a local repository and a store's listing read it.
VERSION_FOLDER = re.compile(r"[1-9][0-9]*")


@dataclass(frozen=True)
class ModelVersion:
    """One version of a model on disk."""

    #: The version number (the folder's name; 1 for a bare file).
    version: int
    #: The model file, symlinks resolved; always inside the repository root.
    path: Path
    #: Its size in bytes.
    size: int
    #: Its modification time, in nanoseconds.
    mtime_ns: int
    #: The files beside it in its version folder (external data among them), each as (path
    #: inside the folder, size, modification time): new ones are a new copy of the version.
    beside: tuple[tuple[str, int, int], ...] = ()
    #: The version folder :attr:`beside` was read from (its real path); None for a bare
    #: model file, whose folder (the repository's root) is not read for it.
    folder: str | None = None

    def changed(self) -> str | None:
        """What differs on disk now from what was read, in a clause; None if nothing does.

        Stats the model file and walks its version folder again (no file is read).
        """
        try:
            info = os.stat(self.path)
        except OSError as exc:
            return f"{self.path} can no longer be read ({exc.strerror})"
        if (info.st_size, info.st_mtime_ns) != (self.size, self.mtime_ns):
            return f"{self.path} was replaced"
        if self.folder is not None and beside_stamps(self.folder, self.path.name) != self.beside:
            return f"the files beside {self.path.name} in {self.folder} changed"
        return None


@dataclass(frozen=True)
class ModelEntry:
    """What the repository holds for one model name, as of one look at the disk.

    An entry is never partly valid: when :attr:`error` is set, the model must not be loaded,
    whatever :attr:`versions` lists.
    """

    #: The model's name.
    name: str
    #: Every version found on disk, ascending (read-only).
    versions: Mapping[int, ModelVersion] = field(hash=False)
    #: The model's configuration; the default when there is no model.toml or it is malformed.
    config: ModelConfig
    #: Why the model cannot be loaded, or None. Compared through :attr:`fingerprint`, which
    #: holds its message (exceptions themselves compare by identity).
    error: ModelLoadError | None = field(compare=False)
    #: Changes when a served file, model.toml, the set of versions or the error changes.
    fingerprint: tuple[object, ...]
    #: Every problem met reading it, each with its kind and fix: those that make up
    #: :attr:`error`, and those that do not stop it loading (a version folder without its
    #: model file).
    problems: tuple[Problem, ...] = field(default=(), compare=False)
    #: The generation of the load's override it was read through (``corral._models.overrides``),
    #: or None when there was none.
    override_generation: int | None = field(default=None, compare=False)
    #: The stamps (real path, size, modification time) of the custom operator library files
    #: its config names: a copy built with another version of one is not interchangeable.
    library_stamps: tuple[tuple[object, ...], ...] = field(default=(), compare=False)
    #: Where its files are: ``"folder"`` (the repository's), ``"uploaded"`` (a load's
    #: files, which may not hold a Python model's code unless the Host allows it) ...
    layout: str = field(default="folder", compare=False)

    @property
    def served_versions(self) -> tuple[int, ...]:
        """The versions the version policy serves, ascending."""
        return self.config.version_policy.select(self.versions)

    @property
    def latest(self) -> int | None:
        """The newest served version, or None when none is served."""
        served = self.served_versions
        return served[-1] if served else None

    def version_fingerprint(self, version: int) -> tuple[object, ...]:
        """What a loaded copy of ``version`` was built from: its file and the settings used.

        Two copies with equal fingerprints are interchangeable; a reload swaps a copy in use
        only when its fingerprint changed.
        """
        file = self.versions.get(version)
        # The whole configuration (dataclass equality): a copy built with another batch size,
        # another declared tensor or another override is not interchangeable either. The path
        # tells two uploads apart even of one size written within one tick of the clock.
        stamp = None if file is None else (str(file.path), file.size, file.mtime_ns, file.beside)
        # The config names a library by its path only: its stamp tells a new file there.
        return (stamp, self.config, self.library_stamps)


def make_entry(
    name: str,
    versions: dict[int, ModelVersion],
    config: ModelConfig,
    config_stamp: tuple[object, ...] | None,
    problems: Problems,
    *,
    layout: str,
) -> ModelEntry:
    """An entry of what was found; ``layout`` (a folder, a file ...) is part of its fingerprint."""
    ordered = {number: versions[number] for number in sorted(versions)}
    error = _combine(name, problems.errors)
    served = config.version_policy.select(ordered)
    fingerprint = (
        layout,
        config_stamp,
        tuple(ordered),
        tuple(
            (v, str(ordered[v].path), ordered[v].size, ordered[v].mtime_ns, ordered[v].beside)
            for v in served
        ),
        None if error is None else f"{type(error).__name__}: {error}",
    )
    generation = None
    if config_stamp and config_stamp[0] == "override" and isinstance(config_stamp[1], int):
        generation = config_stamp[1]
    # The repository stamps each library file it located (at its real path, which the config
    # then names) among the config's files.
    libraries = tuple(
        stamp
        for stamp in config_stamp or ()
        if isinstance(stamp, tuple) and stamp and stamp[0] in config.custom_op_libraries
    )
    return ModelEntry(
        name,
        types.MappingProxyType(ordered),
        config,
        error,
        fingerprint,
        tuple(problems.found),
        generation,
        libraries,
        layout,
    )


class Problems:
    """The problems met reading one model's entry: its errors, and every Problem with a fix."""

    def __init__(self, name: str) -> None:
        self.name = name
        #: What makes the model unloadable, combined into ModelEntry.error.
        self.errors: list[ModelLoadError] = []
        #: Every problem: those errors, and those that leave the model loadable.
        self.found: list[Problem] = []

    @classmethod
    def one(
        cls, name: str, kind: ProblemKind, error: ModelLoadError, path: str, fix: str
    ) -> Problems:
        """The problems of a model with this one problem only, which makes it unloadable."""
        problems = cls(name)
        problems.add(kind, error, path, fix)
        return problems

    def add(self, kind: ProblemKind, error: ModelLoadError, path: str, fix: str) -> None:
        """A problem that makes the model unloadable."""
        self.errors.append(error)
        self.found.append(Problem(kind, self.name, path, str(error), fix))

    def note(self, kind: ProblemKind, path: str, message: str, fix: str) -> None:
        """A problem that leaves the model loadable (what is wrong is skipped)."""
        self.found.append(Problem(kind, self.name, path, message, fix))


def _combine(name: str, problems: list[ModelLoadError]) -> ModelLoadError | None:
    if not problems:
        return None
    if len(problems) == 1:
        return problems[0]
    # Invalid when every problem is (what is on disk), else one may pass (a storage error).
    invalid = all(isinstance(problem, ModelInvalid) for problem in problems)
    combined = ModelInvalid if invalid else ModelLoadError
    return combined(
        f"model {name!r} has {len(problems)} problems: " + "; ".join(str(p) for p in problems)
    )
