"""RayServeConfig: how corral's application on Ray Serve is sized, and the routing count.

Two caps work together on Ray, one per layer. Ray's model multiplexing keeps, per replica, a
count of model ids it routes there (``max_models_per_replica``); corral's Host on that
replica keeps what is resident under a byte budget (``memory_budget``). By default the count
follows the budget: the budget divided by the estimated size of the repository's models, so
that Ray routes to a replica about as many models as its Host can hold.
"""

from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass, field, fields
from typing import TYPE_CHECKING, Any

from corral._base import InvalidOption, ModelLoadError
from corral._compute import RuntimeOptions
from corral._host import (
    HostOptions,
    edge_options,
    estimate_footprint_bytes,
    estimate_model_bytes,
    positive_int,
)
from corral._models import Repository, is_store_url
from corral._onnx import read_footprint

__all__ = ["UNLIMITED", "RayServeConfig", "check_cache_options", "models_per_replica"]

#: Ray's spelling of "no count": every model id a replica has served stays routed to it.
UNLIMITED = -1

# Models whose size the routing count is estimated from: spread over the sorted names.
_SAMPLE = 200

# Defaults that mean something else on a replica than in the server, as the help says them.
_REPLICA_DEFAULTS = {"compute_workers": "--replica-cpus rounded up"}


def _option(default: Any, help_text: str) -> Any:
    return field(default=default, metadata={"help": help_text})


if TYPE_CHECKING:
    # Made below from the declaration, which a type checker cannot read: Any, so that
    # RayServeConfig(memory_budget=...) type-checks (HostOptions and RuntimeOptions check the
    # values), while the replicas read these options through host_options() and
    # runtime_options(), which are typed.
    _HostAndRuntimeOptions: Any
else:
    # Each replica's Host and Runtime options, one field per declared option (HostOptions'
    # and RuntimeOptions' fields).
    _HostAndRuntimeOptions = dataclasses.make_dataclass(
        "_HostAndRuntimeOptions",
        [
            (
                option.name,
                option.annotation,
                _option(
                    option.default,
                    "per replica: " + option.described(_REPLICA_DEFAULTS.get(option.name)),
                ),
            )
            for option in edge_options()
            if option.not_offered is None
        ],
        frozen=True,
        kw_only=True,
        namespace={"__module__": __name__},
    )


# Keyword-only: the Host's and the Runtime's options left the positional order (memory_budget
# was the third), so a positional call is refused rather than read into another field.
@dataclass(frozen=True, kw_only=True)
class RayServeConfig(_HostAndRuntimeOptions):  # type: ignore[misc]  # Any: made above
    """corral's application on Ray Serve: replicas, their budget and their limits.

    Besides its own fields, it has one for each of the Host's and the Runtime's options
    (:func:`corral._host.options.edge_options`: ``memory_budget``, ``max_loaded_models``,
    ``compute_workers`` ...), for each replica's Host and Runtime.

    Example::

        config = RayServeConfig(replicas=4, memory_budget="8GiB")
        serve.run(corral.ray.build_app("/models", config), route_prefix="/")
    """

    # Each field's help is also its `corral ray-serve` flag's (--<field> with dashes).
    replicas: int = _option(
        2, "model replicas: processes that each hold a Host (the fewest, with --max-replicas)"
    )
    max_replicas: int | None = _option(
        None,
        "scale the model replicas from --replicas up to this many on corral's signals: "
        "queued requests and memory pressure (default: a fixed --replicas)",
    )
    queued_per_replica: float = _option(
        16.0, "with --max-replicas: the queued requests one replica is meant to carry"
    )
    replica_cpus: float = _option(
        1.0, "CPUs Ray reserves per replica (fractions allowed); also its compute workers"
    )
    max_models_per_replica: int | None = _option(
        None, "model ids Ray routes to one replica (default: from the budget; -1: no count)"
    )
    max_ongoing_requests: int = _option(64, "requests one replica (and the ingress) works on")
    max_queued_requests: int = _option(
        1024, "requests waiting for a replica beyond those; more get 429 at once"
    )
    ingress_replicas: int = _option(1, "ingress replicas (they read only the path)")
    hot_model_in_flight: int = _option(
        8,
        "requests of one model in flight at an ingress past which its requests are spread "
        "over every replica, each loading it under its own budget (0: never)",
    )
    max_request_bytes: int = _option(
        64 * 1024 * 1024, "largest request body the ingress accepts; larger ones get 413"
    )
    auth_token: str | None = _option(
        None, "require Authorization: Bearer <token> on all but health endpoints"
    )
    grpc_port: int = _option(
        8001,
        "the port each ingress replica serves the Open Inference Protocol's gRPC on "
        "(0: any free port, with one ingress replica; -1: no gRPC)",
    )
    grpc_host: str | None = _option(
        None, "the address the gRPC server binds (default: the HTTP proxy's --host)"
    )
    drain_timeout_s: float = _option(
        10.0, "seconds a stopping replica waits for its runs before closing anyway"
    )

    def __post_init__(self) -> None:
        for name in (
            "replicas",
            "max_ongoing_requests",
            "max_queued_requests",
            "ingress_replicas",
            "max_request_bytes",
        ):
            positive_int(name, getattr(self, name))
        hot = self.hot_model_in_flight
        if isinstance(hot, bool) or not isinstance(hot, int) or hot < 0:
            raise InvalidOption(
                f"hot_model_in_flight must be a whole number, 0 or more, got {hot!r}",
                option="hot_model_in_flight",
            )
        self._check_grpc()
        if self.max_replicas is not None:
            positive_int("max_replicas", self.max_replicas)
            if self.max_replicas < self.replicas:
                raise InvalidOption(
                    f"max_replicas ({self.max_replicas}) must be at least replicas "
                    f"({self.replicas})",
                    option="max_replicas",
                )
        queued = self.queued_per_replica
        if not (_non_negative(queued) and queued > 0):
            raise InvalidOption(
                f"queued_per_replica must be a number above 0, got {queued!r}",
                option="queued_per_replica",
            )
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
        self.runtime_options()  # the Runtime's and the Host's options are checked where
        self.host_options()  # they are defined

    def _check_grpc(self) -> None:
        port = self.grpc_port
        if isinstance(port, bool) or not isinstance(port, int) or not -1 <= port <= 65535:
            raise InvalidOption(
                f"grpc_port must be a port number, 0 (any free port) or -1 (no gRPC), got {port!r}",
                option="grpc_port",
            )
        if port == 0 and self.ingress_replicas > 1:
            # Each ingress replica would take a port of its own, and one address is printed.
            raise InvalidOption(
                f"grpc_port 0 takes a free port per ingress replica: give a port for "
                f"{self.ingress_replicas} ingress replicas to share",
                option="grpc_port",
            )
        if self.grpc_host is not None and not (isinstance(self.grpc_host, str) and self.grpc_host):
            raise InvalidOption(
                f"grpc_host must be an address, got {self.grpc_host!r}", option="grpc_host"
            )

    def runtime_options(self) -> RuntimeOptions:
        """The options of each replica's Runtime: its fields of the same names."""
        return RuntimeOptions.taken_from(self, compute_workers=self.replica_compute_workers)

    def host_options(self) -> HostOptions:
        """The options of each replica's Host: its fields of the same names."""
        return HostOptions.taken_from(self)

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
        workers: int | None = self.compute_workers
        if workers is not None:
            return workers
        return max(1, -int(-self.replica_cpus // 1))


def check_cache_options(repository: str, config: RayServeConfig) -> None:
    """Refuse ``cache_dir`` and ``cache_bytes`` for a repository that is not in object storage.

    Checked before any replica starts, rather than by every replica's Host.
    """
    if is_store_url(repository):
        return
    for name in ("cache_dir", "cache_bytes"):
        if getattr(config, name) is not None:
            raise InvalidOption(
                f"{name} applies to a repository in object storage (s3://...), not to the "
                f"folder {repository!r}",
                option=name,
            )


def models_per_replica(
    repository: Repository | str | os.PathLike[str], config: RayServeConfig
) -> int:
    """How many model ids Ray routes to one replica: the count the config gives or implies.

    ``max_models_per_replica`` when set; else the memory budget divided by the mean
    estimated size (:func:`corral._host.budget.estimate_footprint_bytes`, the Host's own estimate)
    of up to 200 of the repository's
    models, capped by ``max_loaded_models``; else ``max_loaded_models``; else
    :data:`UNLIMITED`. Never below 1. For a repository in object storage the sample is sized
    from what the store lists (:meth:`corral._models.store.Store.latest_bytes`,
    :func:`corral._host.budget.estimate_model_bytes`): a listing request per sampled model, no
    model fetched.
    """
    if config.max_models_per_replica is not None:
        return config.max_models_per_replica
    counts: list[int] = []
    options = config.host_options()
    if options.max_loaded_models is not None:
        counts.append(options.max_loaded_models)
    budget = options.budget_bytes
    if budget is not None:
        counts.append(max(1, budget // _mean_model_bytes(repository)))
    return min(counts) if counts else UNLIMITED


def _mean_model_bytes(repository: Repository | str | os.PathLike[str]) -> int:
    repo = repository if isinstance(repository, Repository) else Repository(repository)
    names = repo.names()
    step = max(1, len(names) // _SAMPLE)
    sizes: list[int] = []
    store = repo.store
    for name in names[::step][:_SAMPLE]:
        if store is not None:
            # In object storage the sample is sized from the listing: reading each model's
            # file would fetch every sampled model into this replica's cache at its start.
            listed = store.latest_bytes(name)
            if listed is not None:
                sizes.append(estimate_model_bytes(listed))
            continue
        entry = repo.entry(name)
        if entry.error is None and entry.latest is not None:
            try:
                footprint = read_footprint(entry.versions[entry.latest].path)
            except ModelLoadError:
                continue  # it will fail its own load, with this error; it takes no room
            sizes.append(estimate_footprint_bytes(footprint))
    # An empty or unreadable repository: one tiny session's worth, so the count stays finite.
    return sum(sizes) // len(sizes) if sizes else estimate_model_bytes(0)


def _non_negative(value: object) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and value >= 0
