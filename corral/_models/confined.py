"""Reading inside a root only: each path resolved, kept inside the root, read up to a limit.

The repository reads nothing outside its root (resolved again on each read: a symlinked root
may switch releases). Every path it reads has its symlinks resolved by :func:`locate`; a path
that resolves outside the root is never stat'ed, only reported (:func:`outside_error`), and
a file is read only when it is a regular file, and only up to a byte limit
(:func:`read_bytes`, :func:`read_text`). A config.pbtxt's warm-up file is confined to its
model's folder the same way (:func:`read_warmup`), and so are a custom operator library or a
provider's (:func:`locate_library`: found, never read here) and a provider's other paths
(:func:`locate_inside`); the files beside a model file (its external
data among them) are stat'ed to tell a change (:func:`beside_stamps`). Nothing here logs or
keeps state.
"""

from __future__ import annotations

import errno
import os
import stat
from collections.abc import Callable
from typing import NamedTuple

from corral._base import ModelConfigError, ModelInvalid

__all__ = [
    "Found",
    "Root",
    "beside_stamps",
    "locate",
    "locate_inside",
    "locate_library",
    "only_if",
    "outside_error",
    "read_bytes",
    "read_text",
    "read_warmup",
]


class Root(NamedTuple):
    """The root's target at one call: paths inside it start with ``prefix``."""

    real: str
    prefix: str


class Found(NamedTuple):
    """A path that exists: where it really is, and what it is (None when outside the root)."""

    real: str
    stat: os.stat_result | None


def locate(root: Root, path: str, *, dangling_ok: bool = True) -> Found | None:
    """Where ``path`` really is; None if it does not exist (or dangles inside the root).

    The target of a path that resolves outside the root is never stat'ed. Raises OSError
    when it cannot be stat'ed for another reason (permissions, a symlink loop), or when
    it is a dangling symlink and ``dangling_ok`` is false.
    """
    try:
        own = os.lstat(path)
    except FileNotFoundError:
        return None
    if not stat.S_ISLNK(own.st_mode):
        # Its parent is already resolved, so a non-link is its own real path.
        return Found(path, own)
    real = os.path.realpath(path)
    if not _inside(root, real):
        return Found(real, None)
    try:
        return Found(real, os.stat(real))
    except FileNotFoundError:
        if dangling_ok:
            return None
        raise FileNotFoundError(
            errno.ENOENT, "it is a symlink to a path that does not exist", real
        ) from None


def _inside(root: Root, real: str) -> bool:
    return real == root.real or real.startswith(root.prefix)


def outside_error(root: Root, name: str, path: str, real: str) -> ModelInvalid:
    """The error of model ``name``'s ``path``, which resolves to ``real`` outside ``root``."""
    return ModelInvalid(
        f"model {name!r}: {path} resolves outside the repository root "
        f"{root.real} (to {real}); it is not read"
    )


def only_if(found: Found | None, is_kind: Callable[[int], bool]) -> Found | None:
    """``found`` if it is of the kind wanted, or resolves outside the root (kind unknown)."""
    if found is None or found.stat is None or is_kind(found.stat.st_mode):
        return found
    return None


def read_bytes(real: str, info: os.stat_result, source: str, limit: int) -> bytes:
    """A regular file's bytes, at most ``limit`` of them; errors name ``source``."""
    if not stat.S_ISREG(info.st_mode):
        raise ModelConfigError(f"{source}: not a regular file")
    if info.st_size > limit:
        raise ModelConfigError(
            f"{source}: {info.st_size} bytes is larger than the {limit}-byte limit"
        )
    try:
        with open(real, "rb") as file:
            # Read one byte past the limit: the file may have grown since it was stat'ed.
            data = file.read(limit + 1)
    except OSError as exc:
        raise ModelConfigError(f"{source}: cannot read it: {exc}") from exc
    if len(data) > limit:
        raise ModelConfigError(f"{source}: larger than the {limit}-byte limit")
    return data


def read_text(real: str, info: os.stat_result, source: str, limit: int) -> str:
    """A regular file's UTF-8 text, at most ``limit`` bytes of it; errors name ``source``."""
    data = read_bytes(real, info, source, limit)
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ModelConfigError(f"{source}: not UTF-8 text: {exc}") from exc


def read_warmup(
    source: str,
    real_folder: str,
    file_name: str,
    field: str,
    limit: int,
    stamps: list[tuple[object, ...]],
) -> bytes:
    """A warm-up data file, ``warmup/<file_name>`` in the model's folder, as raw bytes.

    Triton's layout: the file lies in the model folder's ``warmup/`` folder. Its real path
    (symlinks followed) must stay inside the model's folder; it is read up to ``limit`` bytes.
    """
    shown = f"{source}: {field} {file_name!r}"
    real = os.path.realpath(os.path.join(real_folder, "warmup", file_name))
    folder = os.path.realpath(real_folder)
    if os.path.commonpath([folder, real]) != folder:
        raise ModelConfigError(f"{shown} resolves outside the model's folder ({real})")
    try:
        info = os.stat(real)
    except FileNotFoundError:
        raise ModelConfigError(f"{shown}: no such file in the model's warmup/ folder") from None
    except OSError as exc:
        raise ModelConfigError(f"{shown}: cannot read it: {exc}") from exc
    stamps.append((real, info.st_size, info.st_mtime_ns))
    return read_bytes(real, info, shown, limit)


def locate_library(
    source: str,
    real_folder: str,
    library: str,
    stamps: list[tuple[object, ...]],
    *,
    shown: str | None = None,
    absolute: bool = False,
) -> str:
    """The real path of a library named by a model's settings (custom operators, a provider's).

    ``library`` is relative to the model's folder; its real path (symlinks followed) must
    stay inside that folder and be a regular file. With ``absolute`` an absolute path is
    taken as it is, wherever it is: for a local repository's config.pbtxt, whose operator
    wrote it (Triton's usual ``/opt/...`` path), never for a config that came over the
    network or from object storage. Raises :class:`ModelConfigError` naming ``source`` and
    the library (or ``shown``, what names it) otherwise. Its stamp is added to ``stamps``: a
    changed library is a changed model.
    """
    shown = f"{source}: custom op library {library!r}" if shown is None else shown
    folder = os.path.realpath(real_folder)
    real = os.path.realpath(os.path.join(folder, library))
    inside = os.path.commonpath([folder, real]) == folder and real != folder
    if not inside and not (absolute and os.path.isabs(library)):
        raise ModelConfigError(
            f"{shown} resolves outside the model's folder {folder} (to {real}): a library is "
            "loaded only from inside the model's folder, or from an absolute path written in "
            "a local repository's config.pbtxt"
        )
    try:
        info = os.stat(real)
    except FileNotFoundError:
        where = "in the model's folder" if inside else "there"
        raise ModelConfigError(f"{shown}: no such file {where}") from None
    except OSError as exc:
        raise ModelConfigError(f"{shown}: cannot read it: {exc}") from exc
    if not stat.S_ISREG(info.st_mode):
        raise ModelConfigError(f"{shown}: not a regular file")
    stamps.append((real, info.st_size, info.st_mtime_ns))
    return real


def locate_inside(shown: str, real_folder: str, path: str) -> str:
    """The real path of a file or folder named by a model's settings, inside the model's folder.

    For what a provider reads or writes (a cache folder, a profile): ``path`` is relative to
    the model's folder, and its real path (symlinks followed, as far as they exist) must stay
    inside that folder; it need not exist yet. Raises :class:`ModelConfigError` starting with
    ``shown`` otherwise.
    """
    folder = os.path.realpath(real_folder)
    real = os.path.realpath(os.path.join(folder, path))
    if os.path.commonpath([folder, real]) != folder:
        raise ModelConfigError(
            f"{shown} resolves outside the model's folder {folder} (to {real}): a "
            "provider opens files only inside the model's folder"
        )
    return real


def beside_stamps(folder: str, model_file: str) -> tuple[tuple[str, int, int], ...]:
    """``(path inside folder, size, modification time)`` of each file under ``folder`` but one.

    The files beside a model file: its external data (which onnxruntime reads from the model
    file's folder) among them, so that new weights in place of the old, the model file left
    as it was, are a change. ``model_file`` (its name in ``folder``) is left out; sub-folders
    are walked, without following links to folders; a file that cannot be stat'ed is stamped
    with -1.
    """
    stamps: list[tuple[str, int, int]] = []
    # os.walk names each sub-folder as ``folder`` joined with its path inside: that path is
    # cut from it, not computed by os.path.relpath (two abspaths a file, on every load).
    prefix = os.path.join(folder, "")
    for current, _, files in os.walk(folder):
        inside = "" if current == folder else current[len(prefix) :]
        for file in files:
            path = os.path.join(current, file)
            relative = os.path.join(inside, file)
            if relative == model_file:
                continue
            try:
                info = os.stat(path)
            except OSError:
                stamps.append((relative, -1, -1))
                continue
            stamps.append((relative, info.st_size, info.st_mtime_ns))
    return tuple(sorted(stamps))
