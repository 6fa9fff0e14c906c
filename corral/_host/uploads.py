"""Uploads: model control's loads that carry a config and files, each one transaction.

Triton's model repository extension lets a load request carry a ``config`` (a model
configuration as JSON) and ``file:<path>`` parameters (the bytes of a model folder's files);
an unload may drop what such a load put in place. Model control reads as one story across
three rooms: the protocol's :class:`~corral.protocol.model_control.ModelControl` (Triton's
API, its rules), this part of the Host (the transaction), and the repository, which reads a
model through the :class:`~corral._models.overrides.ModelOverride` in place.

:class:`UploadControl` runs each such operation as one transaction:

- **one at a time per model** (:class:`ControlTurns`), as Triton runs a model's loads and
  unloads: an override is put in place, loaded and the one it replaced removed before the
  next load or unload of that model begins, so no load reads a folder another deleted, and
  no upload is left behind by two loads that raced;
- **compare and swap**: the override is put in place only if the one read at the start is
  still there (:meth:`Repository.replace_override`), and its generation, a number given under
  ``_generation_lock``, makes a new one a change of the model's entry;
- **rolled back**: a load that fails puts back what was in place, and a failure the request's
  config or files caused is answered :class:`LoadRequestInvalid`;
- **files go when unread**: a replaced upload's folder is deleted once the model's loads
  under way are done (:meth:`Loader.when_idle`).

Uploaded files are written by :class:`Uploads`, never into the repository: into a private
folder (``tempfile.mkdtemp``, mode 0700, made with the first upload) that holds one
sub-folder per upload, written in full under a temporary name and renamed into place, so a
reader sees all of an upload or none of it. Paths are checked before anything is written
(:func:`check_upload_paths`): ``<version>/<file>`` or ``<file>``, each part a plain name (no
``..``, no absolute path, no separators but the one ``/``, no hidden file); the files are
created with ``O_EXCL`` and ``O_NOFOLLOW`` in folders made here, so no symlink is followed or
made. The uploads together hold at most ``max_bytes`` (``HostOptions.max_upload_bytes``): an
upload past it is refused (:class:`UploadTooLarge`) before a byte is written.
:meth:`Uploads.close` removes the folder at once, whatever is being written; a write still
running then fails (it makes no folder but its version's, inside its own), and removes what is
left as it ends.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import os
import re
import shutil
import tempfile
import threading
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from corral._base import (
    DeadlineExceeded,
    LoadRequestInvalid,
    ModelConfigError,
    ModelInvalid,
    UploadRefused,
    UploadTooLarge,
)
from corral._compute import deadline_after, time_left
from corral._models import ModelOverride, Repository, pbtxt_from_json

if TYPE_CHECKING:
    from corral._host.loader import Loader
    from corral._host.table import ModelTable

__all__ = ["ControlTurns", "UploadControl", "Uploads", "UploadsStatus", "check_upload_paths"]

logger = logging.getLogger(__name__)

# A plain file name: what a model folder's files are called (model.onnx, labels.txt ...).
_FILE_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.\-]{0,127}")
_VERSION_RE = re.compile(r"[1-9][0-9]{0,17}")
# Read from the override, never from uploaded files: settings come only with ``config``.
_SETTINGS_FILES = frozenset({"config.pbtxt", "model.toml"})
# Triton's words for an upload it cannot write, which its clients match on.
_POLL_FAILED = "failed to poll from model repository"


@dataclass(frozen=True)
class UploadsStatus:
    """What model control's uploads hold now (:attr:`Host.uploads`)."""

    #: Their private folder; None before the first upload, and once the Host closed.
    folder: str | None
    #: The bytes of the uploads in place and of those being written.
    held_bytes: int


class UploadControl:
    """The Host's loads with a config (and files) and unloads that drop them (see the module).

    ``repository``: where the overrides are put in place; ``table`` and ``loader``: the Host's,
    to forget a model's entry and to wait for its loads under way before deleting a folder;
    ``max_bytes``: what the uploads may hold together (None: no cap). The Host's own load and
    unload run inside each transaction, passed in as callables of the time left.
    """

    def __init__(
        self,
        repository: Repository,
        table: ModelTable,
        loader: Loader,
        max_bytes: int | None,
    ) -> None:
        self._repository = repository
        self._table = table
        self._loader = loader
        # Files uploaded by loads with files: a private folder, made on first use.
        self._files = Uploads(max_bytes)
        # One load (or unload that drops an upload) of a model at a time.
        self._turns = ControlTurns()
        # Guards _generation: the last number given to a load's override.
        self._generation_lock = threading.Lock()
        self._generation = 0

    @property
    def root(self) -> str | None:
        """The uploads' folder, once made; None before the first upload and after close."""
        return self._files.root

    @property
    def held_bytes(self) -> int:
        """The bytes the uploads in place (and those being written) hold."""
        return self._files.held_bytes

    def load(
        self,
        name: str,
        timeout: float | None,
        config: str | None,
        files: Mapping[str, bytes] | None,
        load: Callable[[float | None], None],
    ) -> None:
        """In ``name``'s turn, put ``config`` and ``files`` in place and ``load`` with them.

        ``load`` is the Host's load of the model, given the time left. Without ``config``
        and with nothing in place, it is only that load. Raises what :meth:`Host.load` says.
        """
        deadline = deadline_after(timeout)
        with self._turns.turn(name, time_left(deadline)):
            left = time_left(deadline)
            previous = self._repository.override(name)
            override = self._new_override(name, config, files)
            if override is None and previous is None:
                load(left)
                return
            if not self._repository.replace_override(name, override, expected=previous):
                self._files.remove(None if override is None else override.folder)
                raise ModelConfigError(
                    f"model {name!r}: another load changed its config or files meanwhile; "
                    "nothing was changed by this one"
                )
            try:
                load(left)
            except BaseException as exc:
                if self._repository.replace_override(name, previous, expected=override):
                    self._remove_when_unread(name, override)
                refused = isinstance(exc, ModelInvalid) and not isinstance(exc, LoadRequestInvalid)
                if override is not None and refused:
                    # The model cannot be served with this request's config or files: the
                    # request is at fault, and what was in place is back in place.
                    raise LoadRequestInvalid(
                        f"model {name!r}: the load's config or files: {exc}"
                    ) from exc
                raise
            self._remove_when_unread(name, previous)

    def has_files(self, name: str) -> bool:
        """Whether a load put uploaded files in place for model ``name`` (read without a turn)."""
        override = self._repository.override(name)
        return override is not None and override.folder is not None

    def drop(
        self,
        name: str,
        timeout: float | None,
        unload: Callable[[float | None], None],
        *,
        only_if_uploaded_alone: bool = False,
    ) -> None:
        """In ``name``'s turn, take out what a load put in place, then ``unload`` the model.

        Dropped before the unload, so that no request loads the upload meanwhile; its folder
        goes once the loads under way are done, whether the unload succeeds or not.
        ``only_if_uploaded_alone``: drop it only if the repository does not hold the model
        (:meth:`Repository.holds`, which may raise :class:`StoreUnavailable`: then nothing is
        dropped nor unloaded); else only ``unload``.
        """
        deadline = deadline_after(timeout)
        with self._turns.turn(name, time_left(deadline)):
            dropped = self._repository.override(name)
            if dropped is not None and only_if_uploaded_alone and self._repository.holds(name):
                dropped = None  # the repository's model: what a load put in place stays
            if dropped is not None and not self._repository.replace_override(
                name, None, expected=dropped
            ):
                dropped = None  # only loads change it, and they wait for this turn
            if dropped is not None:
                self._table.forget_entry(name)  # read again: the repository's, or none
            try:
                unload(time_left(deadline))
            finally:
                self._remove_when_unread(name, dropped)

    def close(self) -> None:
        """Delete every upload; later uploads are refused. Idempotent."""
        self._files.close()

    def _remove_when_unread(self, name: str, replaced: ModelOverride | None) -> None:
        """Delete the folder of an override no longer in place, once no load reads it.

        A request's load may have read it just before it was replaced: the folder goes when
        the model's load jobs under way are done (at once if none is).
        """
        if replaced is not None and replaced.folder is not None:
            self._loader.when_idle(name, functools.partial(self._files.remove, replaced.folder))

    def _new_override(
        self, name: str, config: str | None, files: Mapping[str, bytes] | None
    ) -> ModelOverride | None:
        if config is None:
            if files is not None:
                raise LoadRequestInvalid(
                    f"model {name!r}: files ({', '.join(sorted(map(str, files)))}) were given "
                    "without a config: a load's files need the 'config' parameter too"
                )
            return None
        if not isinstance(config, str):
            raise LoadRequestInvalid(
                f"model {name!r}: the load's config must be JSON text, got {type(config).__name__}"
            )
        text = pbtxt_from_json(config, source=f"model {name!r}: the load's config")
        folder = None if files is None else self._files.write(name, check_upload_paths(files))
        with self._generation_lock:
            self._generation += 1
            generation = self._generation
        return ModelOverride(text, folder, generation)


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
