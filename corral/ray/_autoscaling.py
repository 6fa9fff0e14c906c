"""Ray Serve's autoscaling of the model replicas on corral's own signals.

Each replica reports two figures (:func:`replica_signals`, Ray Serve's custom autoscaling
metrics): the requests waiting in its Host's queues, and its memory pressure, the larger of
its charged bytes over its budget and its working set over its memory limit. Ray aggregates
them per replica over its look-back period, and :class:`ReplicasWanted` (the deployment's
policy) turns them into a number of replicas, which Ray then holds between ``replicas`` and
``max_replicas``:

- **queued requests**: one replica for every ``queued_per_replica`` waiting, all replicas
  together;
- **memory pressure**: Ray routes each model to the replicas that hold it (model
  multiplexing), so another replica takes models off the others: one more while any replica
  is past ``pressure_high`` (0.9), and none fewer while any is past ``pressure_low`` (0.6),
  since a replica fewer would move its models onto the others.

The larger count wins; Ray's own delays and smoothing apply on top (``upscale_delay_s``,
``downscale_delay_s``).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from corral._host import Host

__all__ = [
    "PRESSURE",
    "PRESSURE_HIGH",
    "PRESSURE_LOW",
    "QUEUED",
    "QUEUED_PER_REPLICA",
    "ReplicasWanted",
    "replica_signals",
]

#: The names of the two figures each replica reports to Ray.
QUEUED = "corral_queued_requests"
PRESSURE = "corral_memory_pressure"
#: Waiting requests one replica is meant to carry.
QUEUED_PER_REPLICA = 16.0
#: Memory pressure past which one more replica is wanted, and past which none fewer.
PRESSURE_HIGH = 0.9
PRESSURE_LOW = 0.6


def replica_signals(host: Host) -> dict[str, float]:
    """What one replica reports: its Host's queued requests and its memory pressure.

    The pressure is the larger of the bytes charged over the budget and the working set
    over the memory limit (each 0 when the Host has no budget, or no memory watch).
    """
    queued = sum(stats.pending for stats in host.queue_stats().values())
    stats = host.stats()
    shares = [0.0]
    if stats.memory_budget:
        shares.append(stats.bytes_used / stats.memory_budget)
    if stats.memory_in_use is not None and stats.memory_limit:
        shares.append(stats.memory_in_use / stats.memory_limit)
    return {QUEUED: float(queued), PRESSURE: max(shares)}


class ReplicasWanted:
    """Ray Serve's policy: the replicas corral's signals ask for (Ray makes one, then calls it).

    Ray builds it once from the deployment's ``policy_kwargs`` (``queued_per_replica``, the
    two pressure marks), then calls it with its ``AutoscalingContext`` every period: its
    ``aggregated_metrics`` (each figure of :func:`replica_signals` by replica) and
    ``current_num_replicas`` are read. Ray clamps the answer to the deployment's
    ``min_replicas`` and ``max_replicas``. Holds no state between calls.
    """

    def __init__(
        self,
        queued_per_replica: float = QUEUED_PER_REPLICA,
        pressure_high: float = PRESSURE_HIGH,
        pressure_low: float = PRESSURE_LOW,
    ) -> None:
        self.queued_per_replica = queued_per_replica
        self.pressure_high = pressure_high
        self.pressure_low = pressure_low

    def __call__(self, context: Any) -> tuple[int, dict[str, Any]]:
        """The replicas wanted now, and the policy's state (none)."""
        metrics: Mapping[str, Mapping[Any, float]] = context.aggregated_metrics or {}
        current = int(context.current_num_replicas)
        queued = sum(metrics.get(QUEUED, {}).values())
        by_queue = math.ceil(queued / self.queued_per_replica)
        pressure = max(metrics.get(PRESSURE, {}).values(), default=0.0)
        if pressure >= self.pressure_high:
            by_memory = current + 1
        elif pressure > self.pressure_low:
            by_memory = current
        else:
            by_memory = 0
        return max(by_queue, by_memory, 1), {}
