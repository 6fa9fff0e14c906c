"""Reloader: hot reload of the models in use, by polling or on demand.

A reload reads a model's entry again; versions whose files or settings changed, and a newer
version of a model in use, are built on the load workers while the old copies keep serving,
then swapped in at once by the table; the copies replaced drain and close. A bad edit never
takes a serving model down: its copy in use keeps serving and the failure is reported.

Polling runs on one thread, started by :meth:`Reloader.start` (``Host.start()``, its ``with``
block, or its first load), never by a constructor.
"""

from __future__ import annotations

import logging

from corral._base import CorralError, HostClosed, ModelNotFound, Periodic
from corral._host.check import ProblemWatch
from corral._host.loader import BUILDS_ON_CHANGE, FilesChanged, Loader
from corral._host.options import HostOptions
from corral._host.served import ServedVersion
from corral._host.table import ModelTable
from corral._models import Repository

__all__ = ["Reloader"]

logger = logging.getLogger(__name__)


class Reloader:
    """Checks the models in use for changes and swaps new copies in."""

    def __init__(
        self,
        repository: Repository,
        table: ModelTable,
        loader: Loader,
        options: HostOptions,
        problems: ProblemWatch | None = None,
    ) -> None:
        self._repository = repository
        self._problems = problems
        self._table = table
        self._loader = loader
        # Polling, when an interval is set: every poll_interval_s on "corral-host-poll".
        interval = options.poll_interval_s
        self._poller = (
            None if interval is None else Periodic("corral-host-poll", interval, self._poll_once)
        )

    def start(self) -> None:
        """Start polling, if an interval was set; idempotent, and a no-op once stopped."""
        if self._poller is not None:
            self._poller.start()

    def stop(self, timeout: float | None) -> None:
        """Stop polling and wait up to ``timeout`` for a check in progress to end."""
        if self._poller is not None:
            self._poller.stop(timeout)

    def refresh(self) -> None:
        """Check every model in use (or whose last load failed) for changes, now.

        Then scan the repository for problems, if its :class:`ProblemWatch` is watching.
        """
        try:
            for name in self._table.names_to_check():
                self.reload(name)
        finally:
            if self._problems is not None:
                self._problems.recheck()

    def reload(self, name: str, attempt: int = 1) -> None:
        """Load changed or new versions of a model in use, then swap them in at once.

        Files that change while they are built from are read again, and built again, up to
        ``BUILDS_ON_CHANGE`` times in all (``attempt``: this one's number); after that, or on
        any other failure, the copy in use keeps serving and the failure is noted.
        """
        try:
            entry = self._repository.entry(name)
        except ModelNotFound:
            self._table.drain(self._table.retire(name), timeout=0)
            self._table.forget_entry(name)
            return
        old, _ = self._table.cached(name)
        in_use = self._table.in_use(name)
        if old is not None and old.fingerprint == entry.fingerprint:
            return
        if entry.error is not None:
            if in_use:
                # Keep the copy in use (and the entry it came from); report the failure.
                self._table.note_reload_failure(name, entry.error)
            else:
                self._table.store_entry(entry)
            return
        building = {
            version: self._loader.build_on_workers(name, version, entry)
            for version in entry.served_versions
            if _wanted(version, in_use, entry.version_fingerprint(version), entry.latest)
        }
        fresh: dict[int, ServedVersion] = {}
        failure: CorralError | None = None
        for version, future in building.items():
            try:
                fresh[version] = future.result()
            except CorralError as exc:
                failure = failure or exc
        if failure is not None:
            for served in fresh.values():
                served.session.close()
            if isinstance(failure, FilesChanged) and attempt < BUILDS_ON_CHANGE:
                self.reload(name, attempt + 1)  # from the entry as the disk holds it now
                return
            self._table.note_reload_failure(name, failure)
            return
        retired = self._table.swap(entry, fresh)
        if retired is None:  # the Host is closing: nothing was published
            for served in fresh.values():
                served.session.close_when_idle()
            return
        self._table.drain(retired, timeout=0)
        for served in fresh.values():
            self._loader.measure_later(served, entry)

    def _poll_once(self) -> bool:
        # One poll; False once the Host is closing, which ends the polling.
        try:
            self.refresh()
        except HostClosed:
            return False
        except CorralError as exc:
            # One bad model must not stop polling for the others; it is reported here and
            # through Host.models().
            logger.warning("corral: checking the repository for changes failed: %s", exc)
        return True


def _wanted(
    version: int,
    in_use: dict[int, ServedVersion],
    fingerprint: tuple[object, ...],
    latest: int | None,
) -> bool:
    """Whether a reload builds ``version``: a changed copy in use, or a newer version."""
    current = in_use.get(version)
    if current is not None:
        return current.fingerprint != fingerprint
    return bool(in_use) and version == latest
