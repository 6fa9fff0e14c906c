"""RayServeConfig: how corral's application on Ray Serve is sized, and the routing count.

Two caps work together on Ray, one per layer. Ray's model multiplexing keeps, per replica, a
count of model ids it routes there (``max_models_per_replica``); corral's Host on that
replica keeps what is resident under a byte budget (``memory_budget``). By default the count
follows the budget: the budget divided by the estimated size of the repository's models, so
that Ray routes to a replica about as many models as its Host can hold.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, fields

from corral._budget import estimate_model_bytes
from corral._errors import InvalidOption
from corral._options import HostOptions, positive_int
from corral._repository import Repository
from corral._scheduler import DEFAULT_QUEUE_LIMIT

__all__ = ["UNLIMITED", "RayServeConfig", "models_per_replica"]

#: Ray's spelling of "no count": every model id a replica has served stays routed to it.
UNLIMITED = -1

# Models whose size the routing count is estimated from: spread over the sorted names.
_SAMPLE = 200


@dataclass(frozen=True)
class RayServeConfig:
    """corral's application on Ray Serve: replicas, their budget and their limits.

    Example::

        config = RayServeConfig(replicas=4, memory_budget="8GiB")
        serve.run(corral.ray.build_app("/models", config), route_prefix="/")
    """

    #: Model replicas: processes that each hold a Host on the repository.
    replicas: int = 2
    #: CPUs Ray reserves for each replica (fractions allowed). Also its compute workers,
    #: rounded up, unless ``compute_workers`` says otherwise.
    replica_cpus: float = 1.0
    #: Bytes (or "2GiB") each replica's Host keeps loaded; None: no byte cap.
    memory_budget: int | str | None = None
    #: Model ids Ray routes to one replica (its multiplexed cache). None: follow the budget
    #: (see :func:`models_per_replica`); -1: no count.
    max_models_per_replica: int | None = None
    #: Model versions each replica's Host keeps loaded; None: no count.
    max_loaded_models: int | None = None
    #: Compute threads per replica; None: ``replica_cpus`` rounded up.
    compute_workers: int | None = None
    #: Requests one model version may have queued in a replica; more get 429 at once.
    max_queue_per_model: int = DEFAULT_QUEUE_LIMIT
    #: Seconds between checks of the repository for changed models; None: off.
    poll_interval_s: float | None = None
    #: Requests one replica (and the ingress) works on at once.
    max_ongoing_requests: int = 64
    #: Requests waiting for a replica beyond those; more are refused with 429 at once.
    max_queued_requests: int = 1024
    #: Ingress replicas: they parse nothing but the path, so one is usually plenty.
    ingress_replicas: int = 1
    #: Largest request body the ingress accepts (413 above it).
    max_request_bytes: int = 64 * 1024 * 1024
    #: When set, every path but ``/v2/health/*`` needs ``Authorization: Bearer <token>``.
    auth_token: str | None = None
    #: Seconds a stopping replica waits for its models' runs before closing them anyway.
    drain_timeout_s: float = 10.0

    def __post_init__(self) -> None:
        for name in (
            "replicas",
            "max_ongoing_requests",
            "max_queued_requests",
            "ingress_replicas",
            "max_request_bytes",
        ):
            positive_int(name, getattr(self, name))
        positive_int("compute_workers", self.compute_workers, optional=True)
        if not _non_negative(self.replica_cpus):
            raise InvalidOption(f"replica_cpus must be >= 0, got {self.replica_cpus!r}")
        if not _non_negative(self.drain_timeout_s):
            raise InvalidOption(f"drain_timeout_s must be >= 0, got {self.drain_timeout_s!r}")
        count = self.max_models_per_replica
        if count is not None and count != UNLIMITED:
            try:
                positive_int("max_models_per_replica", count)
            except InvalidOption:
                raise InvalidOption(
                    f"max_models_per_replica must be a positive integer or -1, got {count!r}"
                ) from None
        self.host_options()  # the Host's options are checked where they are defined

    def host_options(self) -> HostOptions:
        """The options of each replica's Host."""
        return HostOptions(
            memory_budget=self.memory_budget,
            max_loaded_models=self.max_loaded_models,
            poll_interval_s=self.poll_interval_s,
            max_queue_per_model=self.max_queue_per_model,
        )

    @classmethod
    def from_mapping(cls, args: dict[str, object]) -> RayServeConfig:
        """A config from a mapping (a Ray Serve config file's ``args``); unknown keys refused."""
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(args) - known)
        if unknown:
            raise InvalidOption(
                f"unknown option(s) {', '.join(unknown)}; known: {', '.join(sorted(known))}"
            )
        return cls(**args)  # type: ignore[arg-type]

    @property
    def replica_compute_workers(self) -> int:
        """Compute threads each replica's Runtime runs."""
        if self.compute_workers is not None:
            return self.compute_workers
        return max(1, -int(-self.replica_cpus // 1))


def models_per_replica(
    repository: Repository | str | os.PathLike[str], config: RayServeConfig
) -> int:
    """How many model ids Ray routes to one replica: the count the config gives or implies.

    ``max_models_per_replica`` when set; else the memory budget divided by the mean
    estimated size (:func:`corral._budget.estimate_model_bytes`) of up to 200 of the repository's
    models, capped by ``max_loaded_models``; else ``max_loaded_models``; else
    :data:`UNLIMITED`. Never below 1.
    """
    if config.max_models_per_replica is not None:
        return config.max_models_per_replica
    counts: list[int] = []
    if config.max_loaded_models is not None:
        counts.append(config.max_loaded_models)
    budget = config.host_options().budget_bytes
    if budget is not None:
        counts.append(max(1, budget // _mean_model_bytes(repository)))
    return min(counts) if counts else UNLIMITED


def _mean_model_bytes(repository: Repository | str | os.PathLike[str]) -> int:
    repo = repository if isinstance(repository, Repository) else Repository(repository)
    names = repo.names()
    step = max(1, len(names) // _SAMPLE)
    sizes: list[int] = []
    for name in names[::step][:_SAMPLE]:
        entry = repo.entry(name)
        if entry.error is None and entry.latest is not None:
            sizes.append(estimate_model_bytes(entry.versions[entry.latest].size))
    # An empty or unreadable repository: one tiny session's worth, so the count stays finite.
    return sum(sizes) // len(sizes) if sizes else estimate_model_bytes(0)


def _non_negative(value: object) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and value >= 0
