"""Regenerate corral's protobuf modules from its ``.proto`` files.

``corral/_proto/model_config.proto`` (Triton's model configuration: read from config.pbtxt by
the core, so it lives beside the core), ``corral/protocol/proto/grpc_service.proto`` (the
gRPC service, which imports the first publicly), and beside it ``health.proto`` and
``reflection.proto`` (gRPC's health service and server reflection, whose messages corral
carries itself: the packages that ship them need a protobuf newer than the clients allow).

Usage (``make proto`` does the first in a venv with constraints/proto.txt's grpcio-tools)::

    python scripts/gen_proto.py            # rewrite the modules beside each .proto
    python scripts/gen_proto.py --out DIR  # write them all to DIR instead (the tests compare)

Runs ``grpc_tools.protoc`` (pinned in constraints/proto.txt, so that output is the same on
every machine; its version sets the protobuf and grpcio floors of the ``grpc`` extra) and then
makes these fixes, each checked to apply:

* the modules import each other package-relatively or by their full name (protoc writes a
  top-level ``import grpc_service_pb2`` / ``model_config_pb2``, which only works with the
  folder on ``sys.path``);
* the messages go into a descriptor pool of their own, not protobuf's default pool.
  tritonclient (and MLServer, KServe) register the same ``inference.*`` names in the default
  pool, and protobuf refuses a second definition of a name, so without this a process could
  not import both corral's server and a stock client. ``model_config_pb2`` makes the pool;
  ``grpc_service_pb2`` adds its file to that same pool, since it depends on the first, and so
  do ``health_pb2`` and ``reflection_pb2`` (grpcio-health-checking's and grpcio-reflection's
  copies of the same names sit in the default pool), so that this one pool is everything
  server reflection describes.

The generated files are never edited by hand: ``tests/server/grpc/test_server_grpc.py`` regenerates
them and fails if the committed copies differ.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

PROTO_DIR = Path(__file__).resolve().parent.parent / "corral" / "protocol" / "proto"
PROTO = "grpc_service.proto"
# Messages only: corral registers their services' handlers itself (corral/server/grpc/health.py).
MESSAGE_PROTOS = ("health.proto", "reflection.proto")
CONFIG_PROTO_DIR = Path(__file__).resolve().parent.parent / "corral" / "_proto"
CONFIG_PROTO = "model_config.proto"

# (file, what protoc writes, what corral needs, how many times it must match; None: at least
# once, as the stubs' one import line per name re-exported).
_FIXES: tuple[tuple[str, str, str, int | None], ...] = (
    (
        "grpc_service_pb2_grpc.py",
        "import grpc_service_pb2 as grpc__service__pb2\n",
        "from . import grpc_service_pb2 as grpc__service__pb2\n",
        1,
    ),
    (
        "model_config_pb2.py",
        "DESCRIPTOR = _descriptor_pool.Default().AddSerializedFile(",
        "# corral: a pool of its own, so that tritonclient's copy of these names can coexist.\n"
        "DESCRIPTOR = _descriptor_pool.DescriptorPool().AddSerializedFile(",
        1,
    ),
    (
        "grpc_service_pb2.py",
        "DESCRIPTOR = _descriptor_pool.Default().AddSerializedFile(",
        "# corral: model_config_pb2's pool (its own, see there), which this file imports.\n"
        "DESCRIPTOR = model__config__pb2.DESCRIPTOR.pool.AddSerializedFile(",
        1,
    ),
    (
        "grpc_service_pb2.py",
        "import model_config_pb2 as model__config__pb2\n",
        "from corral._proto import model_config_pb2 as model__config__pb2\n",
        1,
    ),
    (
        "grpc_service_pb2.py",
        "from model_config_pb2 import *\n",
        "from corral._proto.model_config_pb2 import *\n",
        1,
    ),
    (
        "grpc_service_pb2.pyi",
        "import model_config_pb2 as _model_config_pb2\n",
        "from corral._proto import model_config_pb2 as _model_config_pb2\n",
        1,
    ),
    (
        "grpc_service_pb2.pyi",
        "from model_config_pb2 import ",
        "from corral._proto.model_config_pb2 import ",
        None,
    ),
    *(
        (
            f"{name}_pb2.py",
            "DESCRIPTOR = _descriptor_pool.Default().AddSerializedFile(",
            "# corral: model_config_pb2's pool, where server reflection finds every file.\n"
            "from corral._proto.model_config_pb2 import DESCRIPTOR as _CORRAL_POOL_FILE\n"
            "DESCRIPTOR = _CORRAL_POOL_FILE.pool.AddSerializedFile(",
            1,
        )
        for name in ("health", "reflection")
    ),
)


def _protoc(proto: Path, out: Path, *, grpc: bool) -> None:
    from grpc_tools import protoc  # constraints/proto.txt's: only this script needs it

    out.mkdir(parents=True, exist_ok=True)
    arguments = [
        "grpc_tools.protoc",
        f"--proto_path={CONFIG_PROTO_DIR}",
        f"--proto_path={PROTO_DIR}",
        f"--python_out={out}",
        f"--pyi_out={out}",
    ]
    if grpc:
        arguments.append(f"--grpc_python_out={out}")
    status = protoc.main([*arguments, str(proto)])
    if status != 0:
        raise RuntimeError(f"protoc failed on {proto} (exit status {status})")


def generate(out: Path | None = None) -> list[Path]:
    """Write every generated module (beside its .proto, or all into ``out``); return them.

    ``model_config_pb2.py`` and ``.pyi``; ``grpc_service_pb2.py``, ``.pyi`` and
    ``_pb2_grpc.py``; ``health_pb2.py`` and ``reflection_pb2.py`` with their ``.pyi``.
    """
    config_out = CONFIG_PROTO_DIR if out is None else out
    service_out = PROTO_DIR if out is None else out
    _protoc(CONFIG_PROTO_DIR / CONFIG_PROTO, config_out, grpc=False)
    _protoc(PROTO_DIR / PROTO, service_out, grpc=True)
    for proto in MESSAGE_PROTOS:
        _protoc(PROTO_DIR / proto, service_out, grpc=False)
    written_paths = [
        config_out / "model_config_pb2.py",
        config_out / "model_config_pb2.pyi",
        service_out / "grpc_service_pb2.py",
        service_out / "grpc_service_pb2.pyi",
        service_out / "grpc_service_pb2_grpc.py",
        *(
            service_out / f"{Path(proto).stem}_pb2{suffix}"
            for proto in MESSAGE_PROTOS
            for suffix in (".py", ".pyi")
        ),
    ]
    by_name = {path.name: path for path in written_paths}
    for name, written, needed, times in _FIXES:
        path = by_name[name]
        text = path.read_text()
        found = text.count(written)
        if found == 0 or (times is not None and found != times):
            raise RuntimeError(
                f"{path}: expected protoc to write {written!r} "
                f"{'at least once' if times is None else f'{times} time(s)'}, found {found}; "
                "the generator changed, so update scripts/gen_proto.py"
            )
        path.write_text(text.replace(written, needed))
    return written_paths


def main(argv: list[str] | None = None) -> int:
    """Parse the command line and regenerate; returns the exit status."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--out", type=Path, default=None, help="where to write the modules (default: beside each)"
    )
    args = parser.parse_args(argv)
    for path in generate(args.out):
        print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
