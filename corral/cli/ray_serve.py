"""``corral ray-serve``: corral's application on Ray Serve, from the command line.

The flags are made by the parser (``corral.cli.commands``): one per field of
:class:`corral.ray.RayServeConfig` (whose Host and Runtime options are made from their one
declaration) and one per :data:`RAY_SERVE_OPTIONS`; each takes its default from its
``CORRAL_*`` variable. This module builds the config from them and starts Ray.
"""

from __future__ import annotations

import argparse
import dataclasses
import difflib
import os
from collections.abc import Callable
from importlib.util import find_spec

from corral._base import ENV_PREFIX, install_hint
from corral.cli.progress import exit_missing_extra

__all__ = ["RAY_SERVE_OPTIONS", "ray_serve_variables", "run_ray_serve"]


#: ``corral ray-serve``'s options that are not RayServeConfig fields: (name, how its text
#: becomes a value, default, help).
RAY_SERVE_OPTIONS: tuple[tuple[str, Callable[[str], object], object, str], ...] = (
    ("address", str, None, "Ray cluster to join: auto, HOST:PORT or ray://... (default: local)"),
    ("host", str, "127.0.0.1", "HTTP address (and gRPC's, unless --grpc-host)"),
    ("port", int, 8000, "HTTP port"),
    ("log_level", str, "info", "error, warning, info, debug"),
)


def ray_serve_variables() -> list[str]:
    """The ``CORRAL_*`` variables ``corral ray-serve`` reads (needs the ray extra)."""
    from corral.ray._config import RayServeConfig

    names = [option[0] for option in RAY_SERVE_OPTIONS]
    names += [field.name for field in dataclasses.fields(RayServeConfig)]
    return [ENV_PREFIX + name.upper() for name in names]


def run_ray_serve(args: argparse.Namespace) -> int:
    """``corral ray-serve``: the config from the flags and ``CORRAL_*``, then serve on Ray.

    Runs until SIGTERM or SIGINT, which remove the application (and a local Ray node).
    """
    if not all(find_spec(module) for module in ("ray", "uvicorn", "orjson")):
        exit_missing_extra(
            "corral ray-serve needs the ray and server extras: " + install_hint("ray", "server")
        )
    import logging

    from corral.ray import RayServeConfig, serve_on_ray
    from corral.ray._config import check_cache_options

    values = {field.name: getattr(args, field.name) for field in dataclasses.fields(RayServeConfig)}
    if values["cache_dir"] is not None:
        # The replicas' working folder is Ray's, not this one's.
        values["cache_dir"] = os.path.abspath(values["cache_dir"])
    config = RayServeConfig(**values)
    repository: str
    if isinstance(args.repository, str):
        # In object storage: each replica reads the URL itself (its credentials and endpoint
        # come from the replica's environment, which a local Ray node inherits from here).
        repository = args.repository
    else:
        folder = args.repository.resolve()
        if not folder.is_dir():
            raise ValueError(f"{args.repository} is not a folder")
        repository = str(folder)
    check_cache_options(repository, config)
    logging.basicConfig(
        level=args.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    known = ray_serve_variables()
    for variable in sorted(v for v in os.environ if v.startswith(ENV_PREFIX) and v not in known):
        # Reported, not refused: Kubernetes sets <SERVICE>_PORT-style variables of its own.
        nearest = difflib.get_close_matches(variable, known, n=1)
        logging.getLogger("corral.cli").warning(
            "corral ray-serve: %s names no option of corral ray-serve and is not used%s",
            variable,
            f"; did you mean {nearest[0]}?" if nearest else "",
        )

    def started(url: str, grpc: str | None) -> None:
        served = url if grpc is None else f"{url}, gRPC at {grpc}"
        print(f"corral ray-serve: serving {repository} at {served}", flush=True)

    return serve_on_ray(
        repository,
        config,
        address=args.address,
        host=args.host,
        port=args.port,
        started=started,
    )
