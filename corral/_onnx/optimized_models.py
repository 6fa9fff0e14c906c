"""Models onnxruntime optimized already, kept in a folder, so that their next load skips it.

onnxruntime spends most of a real model's load optimizing its graph: measured on this
project's 2-core machine (onnxruntime 1.32, ``docs/host.md``), magika loads in 16 ms from its
file and in 5 ms from the graph onnxruntime optimized and saved, ocr-cls in 20 against 5,
ocr-rec in 55 against 17, nudenet in 34 against 13. A session built with
``optimized_model_filepath`` writes the graph it optimized; the same graph, loaded with
optimization off, is what that session ran (onnxruntime's "offline optimization"): same
inputs, outputs and kernels.

:class:`OptimizedModels` keeps one file per model and settings in a folder, named by a
SHA-256 over everything that shapes the optimized graph: the model file's bytes (read, not
its name or time: a copy is found by its content, a change is never mistaken for the old
file), onnxruntime's version, this CPU (its name and instruction set flags: the ``all`` level
lays out tensors for them) and the session's settings (optimization level, providers and
their options, session config entries). A file is written under a temporary name and renamed
into place, so a load never reads half of one.

Only what can be proven the same is kept (:meth:`OptimizedModels.key` answers None
otherwise): the CPU provider alone (other providers' partitions are not portable through a
saved model), no custom operator library, no external data (whose files the key does not
read), and model files of at least :data:`MIN_FILE_BYTES` (below it, graph optimization
costs less than hashing and checking: 0.2 ms of 0.5 for the demo's MLP).
"""

from __future__ import annotations

import functools
import hashlib
import logging
import os
import platform
import tempfile
from collections.abc import Sequence
from pathlib import Path

from corral._base import InvalidOption, ModelLoadError
from corral._onnx.modelfile import read_footprint

__all__ = ["MIN_FILE_BYTES", "OptimizedModels"]

logger = logging.getLogger(__name__)

#: Model files smaller than this are loaded from their own file: their optimization is cheap.
MIN_FILE_BYTES = 64 * 1024
#: The suffix of a kept file; a temporary one ends in ``.partial``.
_SUFFIX = ".onnx"
_CHUNK = 1 << 20


@functools.cache
def _cpu() -> str:
    """The CPU as the ``all`` optimization level sees it: its name and its flags."""
    try:
        with open("/proc/cpuinfo", encoding="ascii", errors="replace") as info:
            wanted = {}
            for line in info:
                name, _, value = line.partition(":")
                name = name.strip()
                if name in ("model name", "flags", "Features", "CPU part") and name not in wanted:
                    wanted[name] = value.strip()
                if not line.strip() and wanted:
                    break  # the first processor's block is enough
        found = ";".join(f"{name}={value}" for name, value in sorted(wanted.items()))
    except OSError:
        found = ""
    return f"{platform.machine()};{platform.processor()};{found}"


class OptimizedModels:
    """A folder of optimized models; safe from any thread and from several processes.

    ``folder`` is created if missing; it must be writable. Raises :class:`InvalidOption`
    naming ``option`` (the setting it came from) when it cannot be made or written to.

    Example::

        cache = OptimizedModels("/var/cache/corral/optimized")
        key = cache.key("model.onnx", (("graph_optimization_level", "all"),))
    """

    def __init__(self, folder: str | os.PathLike[str], *, option: str = "optimized_models") -> None:
        self._folder = Path(folder).absolute()
        try:
            self._folder.mkdir(parents=True, exist_ok=True)
            with tempfile.NamedTemporaryFile(dir=self._folder, suffix=".partial"):
                pass
        except OSError as exc:
            raise InvalidOption(
                f"{option}: cannot keep optimized models in {self._folder}: {exc.strerror}; "
                "give a folder this process can write to",
                option=option,
            ) from None

    @property
    def folder(self) -> Path:
        """Where the optimized models are kept."""
        return self._folder

    def key(
        self,
        model: str | os.PathLike[str],
        settings: Sequence[tuple[str, str]],
        *,
        providers: Sequence[str],
        libraries: bool,
    ) -> str | None:
        """The name of ``model``'s optimized file under ``settings``; None if none may be kept.

        None for another provider than the CPU's, with custom operator ``libraries``, for a
        file below :data:`MIN_FILE_BYTES` or one with external data. Reads the whole file to
        hash it (the GIL is released while it hashes). Raises :class:`ModelLoadError` when
        the file cannot be read, as a load would.
        """
        if list(providers) != ["CPUExecutionProvider"] or libraries:
            return None
        path = Path(model)
        try:
            if path.stat().st_size < MIN_FILE_BYTES:
                return None
            if read_footprint(path).external_bytes:
                return None
            digest = hashlib.sha256()
            with path.open("rb") as file:
                while chunk := file.read(_CHUNK):
                    digest.update(chunk)
        except OSError as exc:
            raise ModelLoadError(f"could not load model {path}: {exc.strerror}") from exc
        from corral._onnx.ort import onnxruntime

        digest.update(f"\0onnxruntime {onnxruntime().__version__}\0{_cpu()}".encode())
        for name, value in sorted(settings):
            digest.update(f"\0{name}={value}".encode())
        return digest.hexdigest()

    def find(self, key: str) -> Path | None:
        """The kept file named ``key``, or None."""
        path = self._folder / f"{key}{_SUFFIX}"
        return path if path.is_file() else None

    def partial(self, key: str) -> Path:
        """A new temporary path to write ``key``'s file to, then :meth:`keep` or :meth:`drop`."""
        handle, name = tempfile.mkstemp(dir=self._folder, prefix=f"{key}.", suffix=".partial")
        os.close(handle)
        return Path(name)

    def keep(self, partial: Path, key: str) -> None:
        """Put a file written to ``partial`` in place as ``key``'s (a rename: all or nothing)."""
        os.replace(partial, self._folder / f"{key}{_SUFFIX}")

    def drop(self, path: Path) -> None:
        """Remove a temporary file, or a kept one that failed to load; gone already is fine."""
        try:
            path.unlink()
        except FileNotFoundError:
            pass
        except OSError as exc:
            logger.warning("corral: could not remove %s: %s", path, exc.strerror)
