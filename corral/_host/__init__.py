"""Thousands of models under a budget, on the four core folders below it.

The Host façade and its parts: the table, the loader, reloads, served versions, the budget's
rules, status, warm-up, lane measuring, the repository check.

This is the folder's face: the layers above import these names from here, never a module
inside it (tests/test_layers.py).
"""

from corral._host.budget import estimate_footprint_bytes, estimate_model_bytes
from corral._host.check import find_problems
from corral._host.host import Host
from corral._host.options import HostOptions, edge_options, positive_int
from corral._host.served import HostLease
from corral._host.status import (
    HostState,
    HostStats,
    ModelState,
    ModelStatus,
    VersionCharge,
    VersionSettings,
    VersionStatus,
)

__all__ = [
    "Host",
    "HostLease",
    "HostOptions",
    "HostState",
    "HostStats",
    "ModelState",
    "ModelStatus",
    "VersionCharge",
    "VersionSettings",
    "VersionStatus",
    "edge_options",
    "estimate_footprint_bytes",
    "estimate_model_bytes",
    "find_problems",
    "positive_int",
]
