"""The memory budget's rules: size estimates, charges, what fits, what to evict.

Pure functions over plain numbers and a small :class:`Resident` protocol: no onnxruntime, no
disk, no locks. The Host's table calls them under its own lock with a snapshot of what it
holds, so that every rule here is unit-tested on its own (``tests/core/host/test_budget.py``).

Memory is accounted with an estimate made *before* loading, so that the budget is checked
before memory is spent (:func:`estimate_footprint_bytes`); once a version is loaded its
:class:`Charge` may be measured (``corral._host.charges``), and a model may declare it.
"""

from __future__ import annotations

from collections.abc import Hashable, Iterable
from dataclasses import dataclass
from typing import Protocol, TypeVar

from corral._onnx import ModelFootprint

__all__ = [
    "EXTERNAL_BYTES_FACTOR",
    "FILE_BYTES_FACTOR",
    "NODES_IN_OVERHEAD",
    "NODE_BYTES",
    "SESSION_OVERHEAD_BYTES",
    "TENSOR_BYTES_PER_4",
    "Charge",
    "Limits",
    "Resident",
    "Usage",
    "choose_victims",
    "estimate_footprint_bytes",
    "estimate_model_bytes",
    "fits",
]

#: Resident memory of one tiny onnxruntime session on corral's Runtime, measured (about
#: 80 KiB for a tree, a linear model or a small MLP on onnxruntime 1.32), rounded up.
SESSION_OVERHEAD_BYTES = 96 * 1024
#: Resident bytes per byte of model file that is not tensor values (graph structure and
#: attributes). Measured: 5.8x for a 100-tree forest (onnxruntime expands tree ensembles);
#: 4 keeps forests within a factor of 1.5. :func:`estimate_model_bytes` applies it to the
#: whole file.
FILE_BYTES_FACTOR = 4

#: Resident bytes per 4 bytes of tensor values held in the model file: 7 (1.75x). onnxruntime
#: copies them out of the parsed model and prepacks some (measured 1.3x to 2.0x).
TENSOR_BYTES_PER_4 = 7
#: Resident bytes per byte of tensor values held in external data files (measured 1.0x).
EXTERNAL_BYTES_FACTOR = 1
#: Resident bytes per graph node past the first :data:`NODES_IN_OVERHEAD`: measured about
#: 3,080 on a 40,000-node graph of tiny tensors.
NODE_BYTES = 3072
#: Nodes that :data:`SESSION_OVERHEAD_BYTES` already covers (the small models it was measured on).
NODES_IN_OVERHEAD = 16

_Key = TypeVar("_Key", bound=Hashable)


def estimate_model_bytes(file_bytes: int, replicas: int = 1) -> int:
    """Resident memory a model known only by its file's size is expected to take once loaded.

    ``replicas`` onnxruntime sessions (a ``pool:N`` policy builds N) of a model file of
    ``file_bytes``: each costs :data:`SESSION_OVERHEAD_BYTES` plus
    :data:`FILE_BYTES_FACTOR` times the file. On small models it stays within a factor
    of 2.5 of the measured RSS (``tests/core/host/test_host.py``); it knows nothing of external data
    or graph size. The Host estimates from what the file holds
    (:func:`estimate_footprint_bytes`); this one sizes Ray replicas from file sizes.

    >>> estimate_model_bytes(1000)
    102304
    """
    return replicas * (SESSION_OVERHEAD_BYTES + FILE_BYTES_FACTOR * file_bytes)


def estimate_footprint_bytes(footprint: ModelFootprint, replicas: int = 1) -> int:
    """Resident memory a model is expected to take once loaded, from what its file holds.

    ``replicas`` onnxruntime sessions (a ``pool:N`` policy builds N), each costing
    :data:`SESSION_OVERHEAD_BYTES`; 1.75 times the bytes of its tensors in the file
    (:data:`TENSOR_BYTES_PER_4`); :data:`EXTERNAL_BYTES_FACTOR` times those in external data
    files; :data:`FILE_BYTES_FACTOR` times the rest of the file (graph structure and
    attributes: a tree ensemble's trees are attributes); :data:`NODE_BYTES` per node past
    :data:`NODES_IN_OVERHEAD`. On the calibration set (``benchmarks/calibrate.py``, 17
    models, ``docs/host.md``) it is within a factor of 1.7 of the RSS measured.

    >>> estimate_footprint_bytes(ModelFootprint(file_bytes=1000))
    102304
    """
    structure = max(0, footprint.file_bytes - footprint.tensor_bytes)
    nodes = max(0, footprint.nodes - NODES_IN_OVERHEAD)
    return replicas * (
        SESSION_OVERHEAD_BYTES
        + FILE_BYTES_FACTOR * structure
        + -(-TENSOR_BYTES_PER_4 * footprint.tensor_bytes // 4)  # rounded up
        + EXTERNAL_BYTES_FACTOR * footprint.external_bytes
        + NODE_BYTES * nodes
    )


@dataclass(frozen=True, slots=True)
class Charge:
    """What one loaded version counts for against the budget, and how that was found.

    The user's word first (``declared``: model.toml's ``memory_bytes``), then what it was
    measured to cost (``measured``: ``corral._host.charges``), then the estimate made before
    it loaded. All three are kept, so that status shows estimated against measured.

    >>> Charge(estimated=100, measured=80).bytes
    80
    >>> Charge(estimated=100, declared=120, measured=80).basis
    'declared'
    """

    #: The estimate made from the file before loading (:func:`estimate_footprint_bytes`).
    estimated: int
    #: What the model's configuration declares one version costs; None: nothing declared.
    declared: int | None = None
    #: What a loaded copy was measured to cost; None: not measured (yet, or at all).
    measured: int | None = None

    @property
    def bytes(self) -> int:
        """The bytes the budget counts: declared, else measured, else estimated."""
        if self.declared is not None:
            return self.declared
        return self.estimated if self.measured is None else self.measured

    @property
    def basis(self) -> str:
        """Which of the three :attr:`bytes` is: ``declared``, ``measured`` or ``estimated``."""
        if self.declared is not None:
            return "declared"
        return "estimated" if self.measured is None else "measured"


@dataclass(frozen=True, slots=True)
class Limits:
    """What may stay loaded: estimated bytes and model versions (None: no cap)."""

    budget: int | None = None
    max_loaded: int | None = None


@dataclass(frozen=True, slots=True)
class Usage:
    """What is held now: loaded and reserved by loads in flight, in bytes and in versions."""

    bytes_used: int = 0
    bytes_reserved: int = 0
    loaded: int = 0
    loads_reserved: int = 0


class Resident(Protocol):
    """A loaded model version, as eviction sees it."""

    @property
    def size_bytes(self) -> int:
        """Its estimated resident bytes."""

    @property
    def pinned(self) -> bool:
        """Never evicted."""

    @property
    def busy(self) -> bool:
        """Requests hold it now: it cannot be evicted until they end."""


def fits(limits: Limits, usage: Usage, size: int, freed_bytes: int = 0, freed: int = 0) -> bool:
    """Whether one more version of ``size`` bytes fits once ``freed`` versions are evicted.

    >>> fits(Limits(budget=100), Usage(bytes_used=60), 40)
    True
    """
    if limits.budget is not None and (
        usage.bytes_used - freed_bytes + usage.bytes_reserved + size > limits.budget
    ):
        return False
    return limits.max_loaded is None or (
        usage.loaded - freed + usage.loads_reserved + 1 <= limits.max_loaded
    )


def choose_victims(
    limits: Limits, usage: Usage, size: int, by_last_use: Iterable[tuple[_Key, Resident]]
) -> tuple[list[_Key] | None, bool]:
    """The idle versions to evict, least recently used first, so that ``size`` fits.

    ``by_last_use`` lists what is loaded, least recently used first; it is read only as far
    as needed. Evicts nothing unless that makes enough room: returns ``(None,
    worth_waiting)`` if ``size`` cannot fit now, where ``worth_waiting`` tells whether it
    would once the busy versions and the loads in flight are done (pinned ones never go).
    """
    chosen: list[_Key] = []
    if fits(limits, usage, size):
        return chosen, False
    freed_bytes = freed = pinned_bytes = pinned = 0
    for key, resident in by_last_use:
        if fits(limits, usage, size, freed_bytes, freed):
            return chosen, False
        if resident.pinned:
            pinned_bytes += resident.size_bytes
            pinned += 1
        elif not resident.busy:
            chosen.append(key)
            freed_bytes += resident.size_bytes
            freed += 1
    if fits(limits, usage, size, freed_bytes, freed):
        return chosen, False
    worth_waiting = (limits.budget is None or pinned_bytes + size <= limits.budget) and (
        limits.max_loaded is None or pinned + 1 <= limits.max_loaded
    )
    return None, worth_waiting
