"""corral on Ray Serve: replicas that each own a Host, routed to by model.

Needs the ``ray`` extra (Ray Serve). Past one machine, corral runs as a
Ray Serve application: a v2 ingress (HTTP, and gRPC on a server of its own) and a deployment
of model replicas, each holding a
:class:`corral.Host` under its own byte budget. Ray's model multiplexing sends each model's
requests to a replica that already has it; corral's leases decide when a model closes.

- :func:`build_app`, :func:`app`: the application, for ``serve.run`` or a Serve config file.
- :class:`RayServeConfig`: replicas, budget, limits; :func:`models_per_replica`.
- :class:`ReplicasWanted`, :func:`replica_signals`: Ray's autoscaling on corral's signals
  (``max_replicas``).
- :class:`ModelReplica`, :class:`V2Ingress`: the two deployments' classes.
- :func:`serve_on_ray`: what ``corral ray-serve`` runs.
- :class:`HttpCall`, :class:`HttpAnswer`: what the ingress and a replica exchange.
- :class:`GrpcIngress`, :class:`GrpcListener`: the ingress's gRPC server and where it listens;
  :class:`GrpcCall`, :class:`GrpcAnswer`, :func:`call_handlers`: a gRPC call forwarded.

See ``docs/scale-out.md``.
"""

try:
    import ray.serve  # noqa: F401
except ImportError as exc:  # pragma: no cover - the dev extra installs ray
    from corral._base import install_hint

    raise ImportError(f"corral.ray needs Ray Serve (the ray extra): {install_hint('ray')}") from exc

from corral.ray._app import INGRESS_NAME, MODELS_NAME, app, build_app
from corral.ray._autoscaling import ReplicasWanted, replica_signals
from corral.ray._config import UNLIMITED, RayServeConfig, models_per_replica
from corral.ray._exchange import REPLICA_HEADER, HttpAnswer, HttpCall, call_asgi, model_in_path
from corral.ray._grpc_exchange import GrpcAnswer, GrpcCall, call_handlers
from corral.ray._grpc_ingress import GrpcIngress, GrpcListener
from corral.ray._ingress import V2Ingress
from corral.ray._launch import APP_NAME, serve_on_ray
from corral.ray._replica import ModelReplica

__all__ = [
    "APP_NAME",
    "INGRESS_NAME",
    "MODELS_NAME",
    "REPLICA_HEADER",
    "UNLIMITED",
    "GrpcAnswer",
    "GrpcCall",
    "GrpcIngress",
    "GrpcListener",
    "HttpAnswer",
    "HttpCall",
    "ModelReplica",
    "RayServeConfig",
    "ReplicasWanted",
    "V2Ingress",
    "app",
    "build_app",
    "call_asgi",
    "call_handlers",
    "model_in_path",
    "models_per_replica",
    "replica_signals",
    "serve_on_ray",
]
