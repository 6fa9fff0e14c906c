"""A model repository in object storage, read through a local cache folder.

A repository URL (``s3://bucket/prefix``, Triton's ``s3://host:port/bucket/prefix``, and the
other schemes obstore reaches: ``gs://``, ``az://``) holds the layout a local repository
holds (:mod:`corral._models.repository`). :class:`Store` lists its models (one paginated listing
request per 1,000 names) and copies one model's files (its config and version folders) into
``<cache>/<name>/`` the first time the model is read; the local repository code then reads that
copy as it reads any folder. Nothing is downloaded at start beyond the listing.

Each cached model keeps a manifest (``<cache>/.manifests/<name>.json``: every file's ETag and
size). A model is read again by listing its prefix: a file whose ETag changed (or whose copy
is not of the listed size) is fetched again (written beside, put on disk, then renamed over the
old one), a file gone from the store is removed, and an unchanged copy is used as it is, across
restarts too. The manifest never vouches for a copy that is not the store's file of that ETag:
it drops the copies about to change before any is replaced, and names the new ones only once
they and their renames are on disk. The cache holds at most
``cache_bytes``: past it, the least recently read models are removed, never one that is being
fetched, being read, kept for a load (:meth:`Store.kept`), or that :attr:`Store.in_use` says is
loaded or loading. A Store claims its cache folder (an exclusive ``flock``) until it closes.

Each file is read as listed: asked for with its listed ETag, and for no more than one byte past
its listed size. What can never be copied from the store as it is, is refused for its model
alone, by name, nothing of it kept in the cache: a key that is no path (an empty, ``.`` or
``..`` part) or that has a part longer than the cache's file system takes, an object larger or
smaller than listed (:class:`ModelInvalid`; the files the manifest does not name are removed),
a model larger than the whole cache
(:class:`ModelTooLarge`). A key that is no path beside the models (``repo/../x``) names no
model: the listing goes past it (:meth:`Store.names`).

The library, obstore (the ``s3`` extra), is imported when a Store is made, never by
``import corral``. Credentials come from its standard chain (``AWS_*`` variables, instance
metadata, web identity); ``AWS_ENDPOINT_URL`` points it at an S3-compatible store. A failure to
reach the store is :class:`StoreUnavailable`, naming the repository URL, never a credential.
"""

from __future__ import annotations

import contextlib
import datetime
import json
import logging
import os
import re
import shutil
import stat
import tempfile
import threading
import time
import urllib.parse
import weakref
from collections.abc import Callable, Iterable, Iterator, Mapping
from concurrent.futures import Future
from concurrent.futures import TimeoutError as FutureTimeout
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from corral._base import (
    InvalidOption,
    ModelInvalid,
    ModelLoadError,
    ModelNotFound,
    ModelTooLarge,
    RepositoryError,
    StoreUnavailable,
    fresh,
    install_hint,
)
from corral._models.aws_profile import ProfileSettings, profile_settings
from corral._models.model_entry import VERSION_FOLDER

if TYPE_CHECKING:
    from obstore import GetOptions
    from obstore.store import ClientConfig, RetryConfig, S3Config

__all__ = [
    "DEFAULT_FETCH_TIMEOUT_S",
    "SCHEMES",
    "START_TIMEOUT_S",
    "Store",
    "StoreStats",
    "is_store_url",
]

logger = logging.getLogger(__name__)

#: The URL schemes a repository may have to be read through a Store.
SCHEMES = ("s3", "gs", "az", "abfs", "abfss")
#: Seconds one model's fetch (its listing and every file) may take by default.
DEFAULT_FETCH_TIMEOUT_S = 60.0
#: Seconds the listing at start may take: a store that hangs stops the start within a minute.
START_TIMEOUT_S = 30.0
#: The variables whose values are never shown in an error or log line: every store's keys,
#: secrets, tokens and signatures (obstore reads AWS_*, AZURE_* and GOOGLE_* variables).
_SECRET = re.compile(r"(?:AWS|AZURE|GOOGLE)_\w*(?:KEY|SECRET|TOKEN|SAS|PASSWORD)\w*")
_MANIFESTS = ".manifests"
_PARTIAL = ".partial"
_LOCK = ".lock"
_RETRIES = 2
_PAGE = 1000
# The least a read of an object hands over at once: at most this past its listed size is read.
_CHUNK = 1 << 20
_CONNECT = datetime.timedelta(seconds=5)
_TRITON_ENDPOINT = re.compile(r"[A-Za-z0-9.\-]+:[0-9]{1,5}")
# Triton's s3://http://host:port/... and s3://https://...: the endpoint's URL inside the store's.
_NESTED_ENDPOINT = re.compile(r"s3://(https?://.*)", re.IGNORECASE | re.DOTALL)


def is_store_url(root: object) -> bool:
    """Whether ``root`` is a repository URL a :class:`Store` reads (``s3://...``)."""
    if not isinstance(root, str) or "://" not in root:
        return False
    return root.split("://", 1)[0].lower() in SCHEMES


@dataclass(frozen=True)
class StoreStats:
    """What the cache holds and what it has done since the Store was made."""

    url: str
    cache_dir: str
    cache_bytes: int | None
    bytes: int
    models: int
    hits: int
    fetches: int
    fetched_bytes: int
    fetch_seconds: float
    failures: int
    evictions: int
    #: Listing requests made: one per page of 1,000 keys S3 answers (counted from what came).
    list_requests: int


@dataclass
class _Cached:
    size: int
    #: When the model was last read, as time.time() gives it: a restart takes it from the
    #: manifest's modification time, so both are the wall clock.
    used: float


class Store:
    """A repository URL and its local cache folder (see the module docstring).

    Thread-safe: one fetch at a time per model (concurrent readers of a model wait for the
    same fetch), any number of models at once.

    Example::

        store = Store("s3://models/prod", "/var/cache/corral", cache_bytes=10 << 30)
        names, invalid = store.names()
        with store.opened("fraud") as folder:
            ...  # folder is <cache>/fraud/ or <cache>/fraud.onnx, as in the store
    """

    def __init__(
        self,
        url: str,
        cache_dir: str | os.PathLike[str] | None = None,
        *,
        cache_bytes: int | None = None,
        timeout_s: float = DEFAULT_FETCH_TIMEOUT_S,
    ) -> None:
        if cache_bytes is not None and (
            isinstance(cache_bytes, bool) or not isinstance(cache_bytes, int) or cache_bytes < 1
        ):
            raise InvalidOption(
                f"cache_bytes must be a positive number of bytes, got {cache_bytes!r}",
                option="cache_bytes",
            )
        self.url = url
        self._store, self._prefix, self._secrets = _open(url, timeout_s)
        # The first listing, at start, gets a deadline of its own: a store that hangs then
        # must stop the start within a minute, whatever the fetches may take.
        self._first, _, _ = _open(url, min(timeout_s, START_TIMEOUT_S))
        if cache_dir is None:
            # A folder of its own, removed with the Store (or at exit): nothing to reuse later.
            cache_dir = tempfile.mkdtemp(prefix="corral-store-")
            weakref.finalize(self, shutil.rmtree, cache_dir, ignore_errors=True)
        self.cache_dir = os.path.realpath(os.fspath(cache_dir))
        os.makedirs(os.path.join(self.cache_dir, _MANIFESTS), exist_ok=True)
        # The folder is this Store's alone until close() (or its collection): another, in this
        # process or another one, would clear its partial downloads, evict the files it
        # reads, and write the same manifests.
        self._claim = _claim_folder(self.cache_dir, url)
        self._release = weakref.finalize(self, _release_folder, self._claim)
        shutil.rmtree(os.path.join(self.cache_dir, _PARTIAL), ignore_errors=True)
        os.makedirs(os.path.join(self.cache_dir, _PARTIAL), exist_ok=True)
        self.cache_bytes = cache_bytes
        self._timeout_s = timeout_s
        #: Whether a model is loaded or loading (its files are then never evicted); the Host
        #: sets it. Called without any of the Store's locks held.
        self.in_use: Callable[[str], bool] = lambda name: False
        # Guards the cache's books: _flights, _readers, _cached, _stray_keys and the counters.
        self._books_lock = threading.Lock()
        # A model's fetch in flight, or its eviction (whose result, False, says to fetch again).
        self._flights: dict[str, Future[bool]] = {}
        self._readers: dict[str, int] = {}
        self._cached: dict[str, _Cached] = self._read_manifests()
        # Keys under the prefix that are no path, each logged once (see names()).
        self._stray_keys: set[str] = set()
        self._hits = self._fetches = self._fetched_bytes = self._failures = self._evictions = 0
        self._list_requests = 0
        self._fetch_seconds = 0.0

    def __repr__(self) -> str:
        return f"Store({self.url!r}, cache {self.cache_dir!r})"

    def close(self) -> None:
        """Give up the cache folder, for another Store to use; idempotent.

        The Host that made the Store calls it when it closes; a Store collected gives the
        folder up too. Nothing may be read through the Store after.
        """
        self._release()

    # -- listing -----------------------------------------------------------------------------

    def names(self, *, first: bool = False) -> tuple[list[str], list[str]]:
        """The store's entries under the prefix: (model folders and bare ``.onnx`` names, other).

        ``first``: the listing at start, within :data:`START_TIMEOUT_S`. Raises
        :class:`RepositoryError` naming the URL when the store cannot be listed.
        """
        import obstore
        from obstore.exceptions import InvalidPathError

        store = self._first if first else self._store
        try:
            found = obstore.list_with_delimiter(store, self._prefix or None)
        except InvalidPathError as exc:
            return self._names_past_stray_keys(store, exc)
        except Exception as exc:  # obstore's errors have no common base but Exception
            raise RepositoryError(
                f"cannot list model repository {self.url!r}: {self._why(exc)}"
            ) from exc
        names = [_last(prefix) for prefix in found["common_prefixes"]]
        files = [_last(str(item["path"])) for item in found["objects"]]
        with self._books_lock:
            self._list_requests += _pages(len(names) + len(files))
        return names, files

    def _names_past_stray_keys(self, store: Any, error: Exception) -> tuple[list[str], list[str]]:
        """:meth:`names` when a key under the prefix is no path (``repo/../x``, ``repo//x``).

        obstore refuses a whole page of a listing for one such key. One whose first part is
        empty, ``.`` or ``..`` sorts before every name a model may have (they start with a
        letter or digit), so the keys after ``<prefix>0`` are listed instead, every one
        (not one per model folder): a page per 1,000 files rather than per 1,000 names, while
        the stray key is there. A key that is no path inside a model's folder as well refuses
        this listing (a page that holds it cannot be read, nor the keys before it there):
        :class:`RepositoryError` naming both.
        """
        import obstore

        stray = _stray_key(error)
        with self._books_lock:
            new = stray not in self._stray_keys
            self._stray_keys.add(stray)
        if new:
            logger.warning(
                "corral: model repository %s holds the key %r, which is not a path (an empty, "
                "'.' or '..' part): it names no model; the models are listed past it, a page "
                "per 1,000 files instead of per 1,000 names, until it is removed",
                self.url,
                stray,
            )
        folders: set[str] = set()
        files: list[str] = []
        keys = 0
        try:
            for chunk in obstore.list(
                store, self._prefix or None, offset=self._prefix + "0", chunk_size=_PAGE
            ):
                for item in chunk:
                    keys += 1
                    first, below, _ = str(item["path"])[len(self._prefix) :].partition("/")
                    if below:
                        folders.add(first)
                    else:
                        files.append(first)
        except Exception as exc:
            raise RepositoryError(
                f"cannot list model repository {self.url!r}: {self._why(exc)}; this "
                f"listing was made past the key {stray!r}, which is no path either: remove "
                "both (a page of a listing that holds such a key cannot be read)"
            ) from exc
        finally:
            with self._books_lock:
                self._list_requests += 1 + _pages(keys)
        return sorted(folders), [file for file in files if file not in folders]

    # -- one model ---------------------------------------------------------------------------

    @contextlib.contextmanager
    def opened(self, name: str) -> Iterator[str]:
        """The local copy of model ``name``, fetched or refreshed first; kept while inside.

        Yields ``<cache>/<name>`` (a folder, or a ``.onnx`` file for a bare model). Raises
        :class:`ModelNotFound` when the store has neither, :class:`StoreUnavailable` when the
        store cannot be read within the fetch deadline (or a file changed while it was read),
        :class:`ModelInvalid` or :class:`ModelTooLarge` when the model can never be copied from
        the store as it is (see the module docstring).
        """
        with self.kept(name):
            yield self._fetch_once(name)

    @contextlib.contextmanager
    def kept(self, name: str) -> Iterator[None]:
        """Keep model ``name``'s copy in the cache while inside, fetching nothing.

        For a caller that read the model's entry through :meth:`opened` and reads its files
        after, before the Host counts the model as loading (:attr:`in_use`).
        """
        with self._books_lock:
            self._readers[name] = self._readers.get(name, 0) + 1
        try:
            yield
        finally:
            with self._books_lock:
                self._readers[name] -= 1
                if not self._readers[name]:
                    del self._readers[name]

    def holds(self, name: str) -> bool:
        """Whether the store has model ``name``: a key under ``<name>/``, or ``<name>.onnx``.

        Fetches nothing: one listing request, and a HEAD when it finds no folder. Raises
        :class:`StoreUnavailable` naming the URL when the store cannot be read.
        """
        import obstore
        from obstore.exceptions import InvalidPathError

        key = f"{self._prefix}{name}"
        try:
            with self._books_lock:
                self._list_requests += 1
            if any(len(chunk) for chunk in obstore.list(self._store, key + "/", chunk_size=1)):
                return True
            obstore.head(self._store, key + ".onnx")
            return True
        except FileNotFoundError:
            return False
        except InvalidPathError:
            return True  # a key under <name>/ that is no path: something of the model's is there
        except Exception as exc:
            raise StoreUnavailable(
                f"model {name!r}: cannot list it in {self.url}: {self._why(exc)}",
                store=self.url,
            ) from exc

    def latest_bytes(self, name: str) -> int | None:
        """Bytes of model ``name``'s latest version as the store lists them, fetching nothing.

        The files under its highest-numbered version folder (the model file and any external
        data), or the bare ``<name>.onnx``; None when the store holds neither. One listing
        request per 1,000 of the model's files, and one HEAD for a bare model. Raises
        :class:`StoreUnavailable` naming the URL when the store cannot be read.
        """
        import obstore

        key = f"{self._prefix}{name}"
        try:
            versions: dict[int, int] = {}
            listed = 0
            for chunk in obstore.list(self._store, key + "/", chunk_size=1000):
                for item in chunk:
                    listed += 1
                    version, _, rest = str(item["path"])[len(key) + 1 :].partition("/")
                    if rest and VERSION_FOLDER.fullmatch(version):
                        versions[int(version)] = versions.get(int(version), 0) + int(item["size"])
            with self._books_lock:
                self._list_requests += _pages(listed)
            if listed:
                return versions[max(versions)] if versions else None
            try:
                return int(obstore.head(self._store, key + ".onnx")["size"])
            except FileNotFoundError:
                return None
        except Exception as exc:
            raise StoreUnavailable(
                f"model {name!r}: cannot list it in {self.url}: {self._why(exc)}",
                store=self.url,
            ) from exc

    def stats(self) -> StoreStats:
        """The cache's bytes and models, and the fetches' counts, bytes and seconds."""
        with self._books_lock:
            return StoreStats(
                url=self.url,
                cache_dir=self.cache_dir,
                cache_bytes=self.cache_bytes,
                bytes=sum(cached.size for cached in self._cached.values()),
                models=len(self._cached),
                hits=self._hits,
                fetches=self._fetches,
                fetched_bytes=self._fetched_bytes,
                fetch_seconds=self._fetch_seconds,
                failures=self._failures,
                evictions=self._evictions,
                list_requests=self._list_requests,
            )

    # -- private -----------------------------------------------------------------------------

    def _fetch_once(self, name: str) -> str:
        while True:
            with self._books_lock:
                flight = self._flights.get(name)
                leader = flight is None
                if flight is None:
                    flight = self._flights[name] = Future()
            if leader:
                break
            # The other fetch ends within its own bound (its deadline, checked between files,
            # and one file's requests, which obstore gives up within the deadline too).
            try:
                error = flight.exception(timeout=2 * self._timeout_s)
            except FutureTimeout:
                raise StoreUnavailable(
                    f"model {name!r}: another caller's fetch of it from {self.url} has taken "
                    f"longer than {2 * self._timeout_s:g} s",
                    store=self.url,
                ) from None
            if error is not None:
                raise fresh(error)
            if flight.result():
                return self._local(name)
            # That was an eviction removing the model's files: fetch them again.
        try:
            self._sync(name)
        except BaseException as exc:
            # Off the books first, so that a reader woken by the outcome does not find the
            # finished flight again; then the outcome, which every waiter shares.
            with self._books_lock:
                del self._flights[name]
            shared = exc if isinstance(exc, Exception) else self._interrupted(name, exc)
            flight.set_exception(shared)
            raise
        with self._books_lock:
            del self._flights[name]
        flight.set_result(True)
        self._evict(keep=name)
        return self._local(name)

    def _interrupted(self, name: str, exc: BaseException) -> StoreUnavailable:
        # What a caller waiting on a fetch gets when the fetching thread was interrupted: the
        # interruption (KeyboardInterrupt, SystemExit) was meant for that thread alone.
        error = StoreUnavailable(
            f"model {name!r}: its fetch from {self.url} was interrupted ({type(exc).__name__})",
            store=self.url,
        )
        error.__cause__ = exc
        return error

    def _local(self, name: str) -> str:
        manifest = self._manifest(name)
        if manifest is not None and manifest.get("bare"):
            return os.path.join(self.cache_dir, name + ".onnx")
        return os.path.join(self.cache_dir, name)

    def _sync(self, name: str) -> None:
        import obstore

        deadline = time.monotonic() + self._timeout_s
        started = time.perf_counter()
        key = f"{self._prefix}{name}"
        try:
            listed = self._list_files(name, key)
            bare = False
            if not listed:
                try:
                    meta = obstore.head(self._store, key + ".onnx")
                except FileNotFoundError:
                    self._forget(name)
                    raise ModelNotFound(
                        f"Request for unknown model: {name!r} is not found: no folder "
                        f"{name}/ or file {name}.onnx in {self.url}"
                    ) from None
                listed = {"": (str(meta["e_tag"]), int(meta["size"]))}
                bare = True
            self._check_fits(name, listed)
            old = self._manifest(name) or {}
            if old.get("bare") is not None and old.get("bare") != bare:
                self._remove_files(name)
                old = {}
            old_files: dict[str, list[Any]] = old.get("files", {})
            target = os.path.join(self.cache_dir, name + (".onnx" if bare else ""))
            whole = {
                relative: [etag, size]
                for relative, (etag, size) in listed.items()
                if old_files.get(relative) == [etag, size]
                and _is_file_of(os.path.join(target, relative) if relative else target, size)
            }
            if any(relative not in whole for relative in old_files):
                # Before any file is replaced or removed, the manifest names only the copies
                # that stay: one cut short then (an error, a crash) is never taken later for
                # the store's file of the ETag the old manifest gave it.
                self._write_manifest(name, bare, whole)
            fetched = 0
            written: set[str] = set()
            for relative, (_, size) in sorted(listed.items()):
                if relative in whole:
                    continue
                if time.monotonic() > deadline:
                    raise TimeoutError(f"the fetch took longer than {self._timeout_s:g} s")
                local = os.path.join(target, relative) if relative else target
                path = f"{key}/{relative}" if relative else key + ".onnx"
                self._get(name, path, listed[relative], local)
                written.add(os.path.dirname(local))
                fetched += size
            if not bare:
                self._drop_unlisted(target, set(listed))
            # The renames reach the disk before the manifest that names their files does.
            _sync_folders(written, self.cache_dir)
            total = sum(size for _, size in listed.values())
            document = _manifest_document(self.url, bare, listed)
            if document == old:
                os.utime(self._manifest_path(name))  # read now: its time orders evictions
            else:
                self._write_manifest(name, bare, listed)
        except ModelInvalid:
            with self._books_lock:
                self._failures += 1
            self._drop_unvouched(name)
            raise
        except (ModelNotFound, ModelLoadError):
            with self._books_lock:
                self._failures += 1
            raise
        except Exception as exc:
            with self._books_lock:
                self._failures += 1
            raise StoreUnavailable(
                f"model {name!r}: cannot fetch it from {self.url}: {self._why(exc)}",
                store=self.url,
            ) from exc
        with self._books_lock:
            self._cached[name] = _Cached(total, time.time())
            if fetched:
                self._fetches += 1
                self._fetched_bytes += fetched
                self._fetch_seconds += time.perf_counter() - started
            else:
                self._hits += 1

    def _list_files(self, name: str, key: str) -> dict[str, tuple[str, int]]:
        """The model's files in the store: ``{path inside its folder: (ETag, size)}``."""
        import obstore
        from obstore.exceptions import InvalidPathError

        listed: dict[str, tuple[str, int]] = {}
        keys = 0
        longest = _longest_part(self.cache_dir)
        try:
            for chunk in obstore.list(self._store, key + "/", chunk_size=_PAGE):
                for item in chunk:
                    keys += 1
                    relative = str(item["path"])[len(key) + 1 :]
                    if not relative and not int(item["size"]):
                        continue  # the model folder's own marker ("<name>/", as consoles make)
                    _check_inside(name, relative, self.url, longest)
                    listed[relative] = (str(item["e_tag"]), int(item["size"]))
        except InvalidPathError as exc:
            # obstore refuses the page that holds such a key: the model cannot be copied
            # until the key is gone, however often it is asked for.
            raise ModelInvalid(
                f"model {name!r} in {self.url}: the object {_stray_key(exc)!r} cannot be "
                "copied into the cache: its key has an empty, '.' or '..' part"
            ) from exc
        finally:
            with self._books_lock:
                self._list_requests += _pages(keys)
        # A folder's marker (an empty object "<folder>/", which consoles make) is listed
        # without its slash: a key that other keys are under is a folder, not a file.
        folders = {
            "/".join(parts[:depth])
            for parts in (relative.split("/") for relative in listed)
            for depth in range(1, len(parts))
        }
        for folder in sorted(folders):
            if listed.get(folder, ("", 0))[1]:
                raise ModelInvalid(
                    f"model {name!r} in {self.url}: {name}/{folder} is both a file and a folder "
                    "(a key, and the start of others): it cannot be copied into a folder"
                )
        return {k: v for k, v in listed.items() if k not in folders}

    def _check_fits(self, name: str, listed: dict[str, tuple[str, int]]) -> None:
        total = sum(size for _, size in listed.values())
        if self.cache_bytes is not None and total > self.cache_bytes:
            # No eviction can make room: it fails alike until the model or the cache changes.
            raise ModelTooLarge(
                f"model {name!r} in {self.url} holds {total} bytes, more than the whole cache "
                f"(cache_bytes={self.cache_bytes})"
            )

    def _get(self, name: str, path: str, listed: tuple[str, int], local: str) -> None:
        """Copy the object ``path`` to ``local``: the one of the listed (ETag, size), whole.

        Asked for with the listed ETag (an object replaced since answers 412, a
        :class:`StoreUnavailable` once the caller wraps it: the next read lists it again) and
        for one byte past the listed size, and read no further than that: an object larger
        (or smaller) than listed is :class:`ModelInvalid` naming its key and both sizes, its
        partial copy removed.
        """
        import obstore

        etag, size = listed
        options: GetOptions = {}
        if etag:
            options["if_match"] = etag
        if size:
            options["range"] = (0, size + 1)  # an empty object has no byte to ask for
        os.makedirs(os.path.dirname(local), exist_ok=True)
        handle, partial = tempfile.mkstemp(dir=os.path.join(self.cache_dir, _PARTIAL))
        try:
            with os.fdopen(handle, "wb") as file:
                answer = obstore.get(self._store, path, options=options)
                said = int(answer.meta["size"])
                if said != size:
                    raise self._not_as_listed(name, path, size, f"holds {said} bytes")
                got = 0
                for chunk in answer.stream(min_chunk_size=_CHUNK):
                    got += len(chunk)
                    if got > size:
                        # Its answer's headers agreed with the listing, its body does not.
                        raise self._not_as_listed(name, path, size, f"sent over {size} bytes")
                    file.write(chunk)
                if got < size:
                    raise ConnectionError(f"{path}: {got} of its {size} bytes came, then none")
                file.flush()
                os.fsync(file.fileno())  # the data on disk before the rename names it
            os.replace(partial, local)
        except BaseException:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(partial)
            raise

    def _not_as_listed(self, name: str, path: str, size: int, found: str) -> ModelInvalid:
        return ModelInvalid(
            f"model {name!r} in {self.url}: the object {path!r} {found}, but the store lists "
            f"it (of the same ETag) as {size} bytes: refused, nothing of it kept in the cache"
        )

    def _drop_unlisted(self, target: str, listed: set[str]) -> None:
        for folder, _, files in os.walk(target, topdown=False):
            for file in files:
                path = os.path.join(folder, file)
                if os.path.relpath(path, target) not in listed:
                    os.unlink(path)
            if folder != target and not os.listdir(folder):
                os.rmdir(folder)

    def _evict(self, keep: str) -> None:
        if self.cache_bytes is None:
            return
        with self._books_lock:
            total = sum(cached.size for cached in self._cached.values())
            if total <= self.cache_bytes:
                return
            candidates = sorted(
                (cached.used, name)
                for name, cached in self._cached.items()
                if name != keep and name not in self._flights and name not in self._readers
            )
        for _, name in candidates:
            if total <= self.cache_bytes:
                break
            if self.in_use(name):
                continue
            with self._books_lock:
                if name in self._flights or name in self._readers or name not in self._cached:
                    continue
                total -= self._cached.pop(name).size
                self._evictions += 1
                # Its files are removed outside the lock; a reader waits for this flight.
                eviction = self._flights[name] = Future()
            try:
                self._remove_files(name)
            finally:
                with self._books_lock:
                    del self._flights[name]
                eviction.set_result(False)
            logger.info("corral: evicted model %r from the cache of %s", name, self.url)
        if total > self.cache_bytes:
            logger.warning(
                "corral: the cache of %s holds %d bytes, over its %d: the rest is in use",
                self.url,
                total,
                self.cache_bytes,
            )

    def _drop_unvouched(self, name: str) -> None:
        """Remove the files of model ``name`` that its manifest does not name.

        After a fetch refused part way (an object larger than listed, say): the files it
        wrote before are no copy the cache counts or vouches for. Those the manifest names
        stay, counted, for a load that may be reading them. Called inside the model's flight.
        """
        manifest = self._manifest(name) or {}
        files: dict[str, list[Any]] = manifest.get("files", {})
        vouched = set(files)
        with self._books_lock:
            cached = self._cached.pop(name, _Cached(0, time.time()))
            if vouched:  # counted as what the manifest names, read when it was read last
                cached.size = sum(int(entry[1]) for entry in files.values())
                self._cached[name] = cached
        target = os.path.join(self.cache_dir, name)
        if manifest.get("bare"):
            # Its one file, which the manifest stopped naming before a new one was fetched.
            if "" not in vouched and os.path.isfile(target + ".onnx"):
                os.unlink(target + ".onnx")
            return
        if not os.path.isdir(target):
            return
        self._drop_unlisted(target, vouched)
        if not os.listdir(target):
            os.rmdir(target)

    def _forget(self, name: str) -> None:
        # Called inside the model's own flight: no other reader of its files can start.
        with self._books_lock:
            self._cached.pop(name, None)
        self._remove_files(name)

    def _remove_files(self, name: str) -> None:
        # <name>/ if it is a folder (a file there is the bare copy of the model name[:-5]),
        # and <name>.onnx if it is a file (a folder there is the model "<name>.onnx"'s).
        shutil.rmtree(os.path.join(self.cache_dir, name), ignore_errors=True)
        bare = os.path.join(self.cache_dir, name + ".onnx")
        if not os.path.isdir(bare):
            with contextlib.suppress(FileNotFoundError):
                os.unlink(bare)
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self._manifest_path(name))

    def _manifest_path(self, name: str) -> str:
        return os.path.join(self.cache_dir, _MANIFESTS, name + ".json")

    def _manifest(self, name: str) -> dict[str, Any] | None:
        try:
            with open(self._manifest_path(name), encoding="utf-8") as file:
                manifest: dict[str, Any] = json.load(file)
        except (FileNotFoundError, ValueError):
            return None
        return manifest

    def _write_manifest(
        self, name: str, bare: bool, files: Mapping[str, tuple[str, int] | list[Any]]
    ) -> None:
        """Write the manifest durably: whole (written beside, then renamed) and on disk."""
        path = self._manifest_path(name)
        with open(path + ".tmp", "w", encoding="utf-8") as file:
            json.dump(_manifest_document(self.url, bare, files), file)
            file.flush()
            os.fsync(file.fileno())
        os.replace(path + ".tmp", path)
        _sync_folder(os.path.dirname(path))

    def _read_manifests(self) -> dict[str, _Cached]:
        cached: dict[str, _Cached] = {}
        folder = os.path.join(self.cache_dir, _MANIFESTS)
        for file in sorted(os.listdir(folder)):
            if not file.endswith(".json"):
                continue
            name = file[: -len(".json")]
            manifest = self._manifest(name)
            if manifest is None or manifest.get("url") != self.url:
                continue  # another repository's cache, or a torn write: fetched again if read
            size = sum(int(entry[1]) for entry in manifest.get("files", {}).values())
            cached[name] = _Cached(size, os.stat(os.path.join(folder, file)).st_mtime)
        return cached

    def _why(self, exc: BaseException) -> str:
        return self._reason(exc, self._secrets)

    @staticmethod
    def _reason(exc: BaseException, secrets: Iterable[str] = ()) -> str:
        """What an obstore error says, in one line, without a secret.

        Neither an ``AWS_*``, ``AZURE_*`` or ``GOOGLE_*`` secret of the environment nor one of
        ``secrets`` (those a shared AWS file gave) is shown.
        """
        # obstore's text ends with a debug dump of the request: its first line says why.
        whole = str(exc)
        text = whole.split("\n", 1)[0].split("<?xml", 1)[0].strip() or type(exc).__name__
        # The store's own words (S3's <Code> and <Message>) follow on the next lines.
        code = re.search(r"<Code>([^<]{1,100})</Code>", whole)
        said = re.search(r"<Message>([^<]{1,300})</Message>", whole)
        if code is not None:
            text += f" {code[1]}" + ("" if said is None else f": {said[1]}")
        hidden = [value for name, value in os.environ.items() if _SECRET.fullmatch(name)]
        for secret in [*hidden, *secrets]:
            # A real one is 40 characters or more; "s" is no secret (and is in every word).
            if len(secret) >= 8:
                text = text.replace(secret, "<secret>")
        return text


def _check_inside(name: str, relative: str, url: str, longest: int) -> None:
    """Refuse a key that would be written outside the model's folder in the cache.

    Or that the cache's file system cannot name: a part longer than ``longest`` bytes.
    """
    parts = relative.split("/")
    if "\\" in relative or any(part in ("", ".", "..") for part in parts):
        raise ModelInvalid(
            f"model {name!r} in {url}: the object {name}/{relative} cannot be copied into the "
            "cache: its key has an empty, '.' or '..' part, or a backslash"
        )
    for part in parts:
        if len(os.fsencode(part)) > longest:
            raise ModelInvalid(
                f"model {name!r} in {url}: the object {_shortened(f'{name}/{relative}')} cannot be "
                f"copied into the cache: its part {_shortened(part)} is "
                f"{len(os.fsencode(part))} bytes, more than the {longest} a file name may have "
                "there"
            )


def _longest_part(folder: str) -> int:
    """The longest file name, in bytes, ``folder``'s file system takes (255 if it won't say)."""
    try:
        return os.pathconf(folder, "PC_NAME_MAX")
    except (AttributeError, OSError, ValueError):  # no pathconf (Windows), or no answer
        return 255


def _shortened(text: str, limit: int = 80) -> str:
    return repr(text) if len(text) <= limit else repr(text[: limit - 3] + "...")


def _stray_key(error: Exception) -> str:
    """The key an obstore ``InvalidPathError`` names (``Error parsing Path "<key>"``)."""
    found = re.search(r'Error parsing Path "((?:[^"\\]|\\.){0,1100})"', str(error))
    return found[1] if found else str(error).split("\n", 1)[0]


def _claim_folder(folder: str, url: str) -> int:
    """Claim ``folder`` for one Store: an exclusive ``flock`` on its ``.lock``, held open.

    Raises :class:`RepositoryError` naming the folder when another Store holds it. Where
    ``flock`` does not exist (Windows) the claim is the descriptor alone: nothing is refused.
    """
    claim = os.open(os.path.join(folder, _LOCK), os.O_RDWR | os.O_CREAT, 0o644)
    try:
        import fcntl
    except ImportError:
        return claim
    try:
        fcntl.flock(claim, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(claim)
        raise RepositoryError(
            f"model repository {url}: its cache folder {folder} is in use by another Store "
            "(another process, or another Host of this one); give each its own cache folder"
        ) from None
    except BaseException:
        os.close(claim)
        raise
    return claim


def _release_folder(claim: int) -> None:
    os.close(claim)  # the flock ends with its descriptor


def _manifest_document(
    url: str, bare: bool, files: Mapping[str, tuple[str, int] | list[Any]]
) -> dict[str, Any]:
    """A model's manifest, as JSON reads it back: ``files`` maps a path to [ETag, size]."""
    return {"url": url, "bare": bare, "files": {k: list(v) for k, v in files.items()}}


def _is_file_of(path: str, size: int) -> bool:
    """Whether ``path`` is a regular file of ``size`` bytes: a whole copy, as a stat tells."""
    try:
        info = os.stat(path)
    except OSError:
        return False
    return stat.S_ISREG(info.st_mode) and info.st_size == size


def _sync_folders(folders: set[str], top: str) -> None:
    """Put on disk the entries of ``folders`` and of their parents up to ``top`` (fsync)."""
    if not folders:
        return
    every = {top}
    for folder in folders:
        while folder.startswith(top + os.sep) and folder not in every:
            every.add(folder)
            folder = os.path.dirname(folder)
    for folder in sorted(every, key=len, reverse=True):
        _sync_folder(folder)


def _sync_folder(folder: str) -> None:
    """Put the entries of ``folder`` (a rename into it, say) on disk."""
    handle = os.open(folder, os.O_RDONLY)
    try:
        os.fsync(handle)
    finally:
        os.close(handle)


def _pages(keys: int) -> int:
    """The listing requests that returned ``keys`` keys: S3 answers 1,000 a page."""
    return max(1, -(-keys // _PAGE))


def _last(path: str) -> str:
    return path.rstrip("/").rsplit("/", 1)[-1]


def _open(url: str, timeout_s: float) -> tuple[Any, str, tuple[str, ...]]:
    """The obstore store of ``url``'s bucket, the repository's prefix inside it, and secrets.

    The secrets are those a shared AWS file gave (:mod:`corral._models.aws_profile`): never
    to be shown.
    """
    scheme, endpoint, bucket, path = _location(url)
    try:
        from obstore.store import S3Store, from_url
    except ImportError as exc:
        raise RepositoryError(
            f"model repository {url!r} is in object storage, which needs obstore (the s3 "
            f"extra): {install_hint('s3')}"
        ) from exc
    # A request (its whole answer read) may take a third of the fetch's deadline, so that two
    # retries of one that hangs still end within it.
    attempt = datetime.timedelta(seconds=timeout_s / (_RETRIES + 1))
    client: ClientConfig = {"timeout": attempt, "connect_timeout": min(attempt, _CONNECT)}
    retry: RetryConfig = {
        "max_retries": _RETRIES,
        "retry_timeout": datetime.timedelta(seconds=timeout_s),
    }
    prefix = path + "/" if path else ""
    if endpoint and endpoint.lower().startswith("http://"):
        client["allow_http"] = True
    secrets: tuple[str, ...] = ()
    try:
        if scheme == "s3":
            shared = profile_settings()
            secrets = tuple(filter(None, (shared.secret_access_key, shared.session_token)))
            store: Any = S3Store(
                bucket,
                endpoint=endpoint,
                config=_s3_config(shared),
                client_options=client,
                retry_config=retry,
            )
        else:
            store = from_url(
                f"{scheme}://{bucket}",
                client_options=client,
                retry_config=retry,
            )
    except Exception as exc:
        raise RepositoryError(f"model repository {url!r}: {Store._reason(exc, secrets)}") from exc
    return store, prefix, secrets


def _s3_config(shared: ProfileSettings) -> S3Config:
    """What the shared AWS files add to obstore's own chain, as its S3Store takes it."""
    config: S3Config = {}
    if shared.access_key_id and shared.secret_access_key:
        config["access_key_id"] = shared.access_key_id
        config["secret_access_key"] = shared.secret_access_key
    if shared.session_token:
        config["session_token"] = shared.session_token
    if shared.region:
        config["region"] = shared.region
    return config


def _location(url: str) -> tuple[str, str | None, str, str]:
    """``url`` as (scheme, endpoint or None, bucket, path inside the bucket).

    The S3 forms Triton takes: ``s3://bucket/path``; ``s3://host:port/bucket/path`` (an
    endpoint over HTTP); ``s3://http://host:port/bucket/path`` and
    ``s3://https://host[:port]/bucket/path`` (an endpoint with its scheme). Otherwise the
    endpoint is ``AWS_ENDPOINT_URL`` (or ``AWS_ENDPOINT``), if set. Raises
    :class:`RepositoryError` for credentials, a query or a fragment in the URL, or no bucket.
    """
    nested = _NESTED_ENDPOINT.fullmatch(url)
    if nested is not None:
        # s3://https://host:port/...: the endpoint's own URL follows the store's scheme.
        scheme, parsed = "s3", urllib.parse.urlsplit(nested[1])
    else:
        parsed = urllib.parse.urlsplit(url)
        scheme = parsed.scheme.lower()
    if parsed.username or parsed.password:
        raise RepositoryError(
            f"model repository {parsed.scheme}://{parsed.hostname}/...: credentials do not "
            "belong in the URL; give them through the store's usual variables or files"
        )
    if parsed.query or parsed.fragment:
        # Not shown: a query is where a signed URL (an Azure SAS, say) keeps its token.
        raise RepositoryError(
            f"model repository {parsed.scheme}://{parsed.netloc}{parsed.path}: a query or "
            "fragment is not a path (it is not shown: it may hold a token)"
        )
    path = parsed.path.strip("/")
    endpoint = os.environ.get("AWS_ENDPOINT_URL") or os.environ.get("AWS_ENDPOINT")
    if nested is not None:
        if not parsed.hostname:
            raise RepositoryError(f"model repository {url!r} names no endpoint host")
        endpoint = f"{parsed.scheme.lower()}://{parsed.netloc}"
        bucket, _, path = path.partition("/")
    elif scheme == "s3" and _TRITON_ENDPOINT.fullmatch(parsed.netloc):
        # Triton's spelling: s3://host:port/bucket/path names the endpoint itself.
        endpoint = f"http://{parsed.netloc}"
        bucket, _, path = path.partition("/")
    else:
        bucket = parsed.netloc
    if not bucket:
        raise RepositoryError(f"model repository {url!r} names no bucket")
    return scheme, endpoint, bucket, path
