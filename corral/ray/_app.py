"""build_app: corral's Ray Serve application, an ingress and a deployment of model replicas."""

from __future__ import annotations

import os
from typing import Any

from ray import serve
from ray.serve import Application
from ray.serve.schema import LoggingConfig

from corral._base import InvalidOption
from corral.ray._autoscaling import ReplicasWanted
from corral.ray._config import RayServeConfig, check_cache_options
from corral.ray._grpc_ingress import GrpcListener
from corral.ray._ingress import V2Ingress
from corral.ray._replica import ModelReplica

__all__ = [
    "INGRESS_NAME",
    "MODELS_NAME",
    "app",
    "build_app",
    "grpc_listener",
    "most_replicas",
    "replica_count",
]

#: The deployments' names, as Ray's dashboard and ``serve status`` show them.
MODELS_NAME = "corral-models"
INGRESS_NAME = "corral-ingress"

# No line per request in Ray's logs: at thousands of requests a second they cost more than
# the models. corral's own log lines (loads, unloads, evictions) stay.
_QUIET = LoggingConfig(enable_access_log=False)


def build_app(
    repository: str | os.PathLike[str], config: RayServeConfig | None = None
) -> Application:
    """The application to hand ``serve.run``: the v2 ingress and ``config.replicas`` replicas.

    ``repository`` is a folder readable at the same path on every node a replica may run on
    (a shared volume), or a URL in object storage (``s3://bucket/prefix``) that each replica
    reads into a cache folder of its own (:mod:`corral.ray._replica`): no shared disk.
    ``cache_dir`` and ``cache_bytes`` apply to a URL only. Each ingress replica also serves
    gRPC on ``grpc_host:grpc_port`` itself (:mod:`corral.ray._grpc_ingress`), unless
    ``grpc_port`` is -1. Example::

        serve.run(build_app("/models", RayServeConfig(replicas=4, memory_budget="8GiB")),
                  name="corral", route_prefix="/")
    """
    config = RayServeConfig() if config is None else config
    path = os.fspath(repository)
    check_cache_options(path, config)
    models = serve.deployment(
        name=MODELS_NAME,
        **replica_count(config),
        max_ongoing_requests=config.max_ongoing_requests,
        max_queued_requests=config.max_queued_requests,
        ray_actor_options={"num_cpus": config.replica_cpus},
        # Longer than the Host's own drain, so that the Host closes before Ray gives up.
        graceful_shutdown_timeout_s=config.drain_timeout_s + 5,
        logging_config=_QUIET,
    )(ModelReplica).bind(path, config)
    ingress = serve.deployment(
        name=INGRESS_NAME,
        num_replicas=config.ingress_replicas,
        max_ongoing_requests=config.max_ongoing_requests * most_replicas(config),
        ray_actor_options={"num_cpus": 0},
        # Longer than its gRPC server's drain (corral.ray._grpc_ingress).
        graceful_shutdown_timeout_s=config.drain_timeout_s + 5,
        logging_config=_QUIET,
    )(V2Ingress)
    return ingress.bind(
        models,
        config.auth_token,
        config.max_request_bytes,
        config.hot_model_in_flight,
        grpc_listener(config),
    )


def grpc_listener(config: RayServeConfig) -> GrpcListener | None:
    """Where each ingress replica serves gRPC, as ``config`` says; None: ``grpc_port`` -1.

    On ``grpc_host`` (default 127.0.0.1), sharing the port when there are several ingress
    replicas (SO_REUSEPORT).
    """
    if config.grpc_port == -1:
        return None
    return GrpcListener(
        host=config.grpc_host or "127.0.0.1",
        port=config.grpc_port,
        reuse_port=config.ingress_replicas > 1,
        drain_timeout_s=config.drain_timeout_s,
    )


def most_replicas(config: RayServeConfig) -> int:
    """The most model replicas the deployment runs: ``max_replicas`` when it scales."""
    return config.replicas if config.max_replicas is None else config.max_replicas


def replica_count(config: RayServeConfig) -> dict[str, Any]:
    """The model deployment's count, as ``serve.deployment``'s keywords.

    ``num_replicas`` fixed; with ``max_replicas``, Ray's ``autoscaling_config`` between
    ``replicas`` and ``max_replicas`` under corral's policy
    (:class:`corral.ray._autoscaling.ReplicasWanted`).
    """
    if config.max_replicas is None:
        return {"num_replicas": config.replicas}
    return {
        "autoscaling_config": {
            "min_replicas": config.replicas,
            "initial_replicas": config.replicas,
            "max_replicas": config.max_replicas,
            "policy": {
                "policy_function": f"{ReplicasWanted.__module__}:{ReplicasWanted.__name__}",
                "policy_kwargs": {"queued_per_replica": config.queued_per_replica},
            },
        }
    }


def app(args: dict[str, Any]) -> Application:
    """Ray Serve's application builder: ``import_path: corral.ray:app`` in a config file.

    ``args`` holds ``repository`` and any :class:`RayServeConfig` field by name::

        applications:
          - name: corral
            route_prefix: /
            import_path: corral.ray:app
            args: {repository: /models, replicas: 4, memory_budget: 8GiB}
    """
    options = dict(args)
    repository = options.pop("repository", None)
    if not isinstance(repository, str) or not repository:
        raise InvalidOption(
            "corral.ray:app needs args.repository: the repository's path or s3:// URL"
        )
    return build_app(repository, RayServeConfig.from_mapping(options))
