"""Overrides: a model's configuration and files given with a load, instead of the repository's.

Triton's model repository extension lets a load request carry a ``config`` (a model
configuration as JSON) and ``file:<path>`` parameters (the bytes of a model folder's files).
A :class:`ModelOverride` is what such a load puts in place of the model's own settings and,
with files, of its own folder; the :class:`Repository` reads a model's entry through it for
as long as it stays in place (every later load, lazy or explicit, and every poll), until a
load without them puts the repository's files back.

Uploaded files are written by :class:`Uploads`, never into the repository: into a private
folder (``tempfile.mkdtemp``, mode 0700, made with the first upload) that holds one
sub-folder per upload, written in full under a temporary name and renamed into place, so a
reader sees all of an upload or none of it. Paths are checked before anything is written:
``<version>/<file>`` or ``<file>``, each part a plain name (no ``..``, no absolute path, no
separators but the one ``/``, no hidden file); the files are created with ``O_EXCL`` and
``O_NOFOLLOW`` in folders made here, so no symlink is followed or made.

The uploads together hold at most ``max_bytes`` (``HostOptions.max_upload_bytes``): an upload
past it is refused (:class:`UploadTooLarge`) before a byte is written. :meth:`Uploads.close`
removes the folder at once, whatever is being written; a write still running then fails (it
makes no folder but its version's, inside its own), and removes what is left as it ends.

One model-control operation of a model runs at a time (:class:`ControlTurns`), as Triton's
do: a load's override is put in place, loaded and the one it replaced removed before the next
load or unload of that model begins, so no load reads a folder another deleted, and no upload
is left behind by two loads that raced.
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
import shutil
import tempfile
import threading
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from corral._errors import DeadlineExceeded, ModelConfigError, UploadRefused, UploadTooLarge

__all__ = ["ControlTurns", "ModelOverride", "Uploads", "check_upload_paths"]

logger = logging.getLogger(__name__)

# A plain file name: what a model folder's files are called (model.onnx, labels.txt ...).
_FILE_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.\-]{0,127}")
_VERSION_RE = re.compile(r"[1-9][0-9]{0,17}")
# Read from the override, never from uploaded files: settings come only with ``config``.
_SETTINGS_FILES = frozenset({"config.pbtxt", "model.toml"})
# Triton's words for an upload it cannot write, which its clients match on.
_POLL_FAILED = "failed to poll from model repository"


@dataclass(frozen=True)
class ModelOverride:
    """What a load put in place of a model's own configuration and, with files, its folder."""

    #: The configuration, as config.pbtxt text (``corral._pbtxt.pbtxt_from_json``'s): read
    #: instead of the folder's model.toml or config.pbtxt, through the same checks.
    config_text: str
    #: The uploaded model folder, read instead of the repository's; None: the repository's.
    folder: str | None
    #: Distinguishes overrides: part of the entry's fingerprint, so that a new one is a change.
    generation: int


def check_upload_paths(files: Mapping[str, bytes]) -> dict[str, bytes]:
    """Check the relative paths of a load's files; return them as ``{path: bytes}``.

    A path is ``<version>/<file>`` (a positive integer, then a plain file name) or ``<file>``
    (a file of the model's folder, such as a label file). Raises :class:`UploadRefused`
    naming the first path that is not, or whose content is not bytes, and for a settings file
    (config.pbtxt, model.toml: settings come with ``config``); :class:`ModelConfigError` for an
    empty set.
    """
    if not files:
        raise ModelConfigError("no files were given to load")
    checked: dict[str, bytes] = {}
    for path, content in files.items():
        if not isinstance(path, str):
            raise UploadRefused(f"{_POLL_FAILED}: file path {path!r} must be a string")
        if not isinstance(content, bytes | bytearray | memoryview):
            raise UploadRefused(
                f"{_POLL_FAILED}: file {path!r} must be given as bytes, got "
                f"{type(content).__name__}"
            )
        parts = path.split("/")
        if not (
            (len(parts) == 1 and _FILE_RE.fullmatch(parts[0]))
            or (
                len(parts) == 2 and _VERSION_RE.fullmatch(parts[0]) and _FILE_RE.fullmatch(parts[1])
            )
        ):
            raise UploadRefused(
                f"{_POLL_FAILED}: file path {path!r} is not '<version>/<file name>' or "
                "'<file name>': a positive version number and plain names of letters, "
                "digits, '_', '.' and '-' (no '..', no absolute path, no hidden file), inside "
                "the model's folder"
            )
        if parts[-1] in _SETTINGS_FILES:
            raise UploadRefused(
                f"{_POLL_FAILED}: file path {path!r}: a model's settings come with the "
                "'config' parameter, not as a file"
            )
        checked[path] = bytes(content)
    return checked


class Uploads:
    """The private folder that uploaded model files are written to, one sub-folder per upload.

    Made with the first upload (never by the constructor), removed by :meth:`close`.
    ``max_bytes``: what the uploads may hold together; None: no cap.
    """

    def __init__(self, max_bytes: int | None = None) -> None:
        self._max_bytes = max_bytes
        # Guards _root (made once, on the first upload), _count, _closed and _sizes.
        self._root_lock = threading.Lock()
        self._root: str | None = None
        self._count = 0
        self._closed = False
        self._sizes: dict[str, int] = {}  # each upload's folder (written or being written): bytes

    @property
    def root(self) -> str | None:
        """The folder, once made (symlinks resolved); None before the first upload."""
        with self._root_lock:
            return self._root

    @property
    def held_bytes(self) -> int:
        """The bytes the uploads kept (and those being written) hold."""
        with self._root_lock:
            return sum(self._sizes.values())

    def write(self, name: str, files: Mapping[str, bytes]) -> str:
        """Write a checked file set (:func:`check_upload_paths`) as a new model folder.

        Returns the folder's path, ``<root>/<name>.<n>``; it appears complete or not at all.
        Raises :class:`UploadTooLarge` past ``max_bytes``, :class:`ModelConfigError` if the
        files cannot be written (the disk is full ...) or the uploads are closed.
        """
        size = sum(len(content) for content in files.values())
        with self._root_lock:
            if self._closed:
                raise ModelConfigError("uploads are closed: the Host is closing")
            held = sum(self._sizes.values())
            if self._max_bytes is not None and held + size > self._max_bytes:
                raise UploadTooLarge(
                    f"{_POLL_FAILED}: the files of model {name!r} ({size:,} bytes) would make "
                    f"the uploads hold {held + size:,} bytes, more than max_upload_bytes "
                    f"({self._max_bytes:,}); unload with drop_upload to remove uploads no "
                    "longer served"
                )
            if self._root is None:
                self._root = os.path.realpath(tempfile.mkdtemp(prefix="corral-uploads-"))
            self._count += 1
            root, number = self._root, self._count
            final = os.path.join(root, f"{name}.{number}")
            self._sizes[final] = size
        try:
            self._write_folder(root, final, name, files)
        except BaseException:
            with self._root_lock:
                self._sizes.pop(final, None)
            raise
        finally:
            self._end_write(root)
        return final

    def _write_folder(self, root: str, final: str, name: str, files: Mapping[str, bytes]) -> None:
        try:
            staging = tempfile.mkdtemp(prefix=".staging-", dir=root)
        except OSError as exc:
            raise ModelConfigError(f"cannot write the files of model {name!r}: {exc}") from exc
        try:
            for path, content in files.items():
                target = os.path.join(staging, *path.split("/"))
                parent = os.path.dirname(target)
                if parent != staging:
                    # One level (a version's folder), never its parents: were the root removed
                    # by close() meanwhile, nothing is made again outside what this made.
                    with contextlib.suppress(FileExistsError):
                        os.mkdir(parent, 0o700)
                flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW
                descriptor = os.open(target, flags, 0o600)
                with os.fdopen(descriptor, "wb") as file:
                    file.write(content)
            os.rename(staging, final)
        except OSError as exc:
            shutil.rmtree(staging, ignore_errors=True)
            raise ModelConfigError(f"cannot write the files of model {name!r}: {exc}") from exc

    def _end_write(self, root: str) -> None:
        with self._root_lock:
            closed = self._closed
        if closed:
            # close() removed the root while this wrote: whatever it wrote there since goes.
            _remove_tree(root)

    def remove(self, folder: str | None) -> None:
        """Delete an upload's folder that no override uses any more; None: nothing."""
        if folder is None:
            return
        with self._root_lock:
            self._sizes.pop(folder, None)
        # A failure is logged: disk space kept until close(), not a reason to fail the load
        # that replaced it. Gone already (with close()) is fine.
        _remove_tree(folder)

    def close(self) -> None:
        """Delete every upload; later uploads are refused. Idempotent.

        A write under way is not waited for (its disk may hang): it removes the root again
        as it ends.
        """
        with self._root_lock:
            root, self._root, self._closed = self._root, None, True
            self._sizes.clear()
        if root is not None:
            _remove_tree(root)


def _remove_tree(root: str) -> None:
    try:
        # A part removed meanwhile (an upload's own folder, by the load that made it) is
        # passed over: an error would stop the walk and leave the rest behind.
        shutil.rmtree(root, onerror=_gone_is_fine)
    except OSError as exc:
        logger.warning("corral: cannot remove the uploaded files in %s: %s", root, exc)


def _gone_is_fine(function: object, path: str, error: tuple[type[BaseException], Any, Any]) -> None:
    if not issubclass(error[0], FileNotFoundError):
        raise OSError(f"cannot remove {path}: {error[1]}")


class ControlTurns:
    """One model-control operation per model name at a time (a load, an unload that drops).

    Held across the operation, loads included, as Triton runs a model's loads and unloads one
    after another; never taken by requests, and only for the model named. A name's lock is
    forgotten once nobody holds or waits for it.
    """

    def __init__(self) -> None:
        # Guards _turns: each name's lock and how many callers hold or wait for it.
        self._turns_lock = threading.Lock()
        self._turns: dict[str, tuple[threading.Lock, list[int]]] = {}

    @contextlib.contextmanager
    def turn(self, name: str, timeout: float | None) -> Iterator[None]:
        """Hold ``name``'s turn; :class:`DeadlineExceeded` if not had within ``timeout``."""
        with self._turns_lock:
            lock, users = self._turns.setdefault(name, (threading.Lock(), [0]))
            users[0] += 1
        try:
            if not lock.acquire(timeout=-1 if timeout is None else max(0.0, timeout)):
                raise DeadlineExceeded(
                    f"model {name!r}: another load or unload of it was still running after "
                    f"{timeout}s"
                )
            try:
                yield
            finally:
                lock.release()
        finally:
            with self._turns_lock:
                users[0] -= 1
                if users[0] == 0:
                    del self._turns[name]
