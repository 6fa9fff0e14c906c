"""Regenerate corral's gRPC modules from ``corral/protocol/proto/grpc_service.proto``.

Usage::

    python scripts/gen_proto.py            # rewrite the modules beside the .proto
    python scripts/gen_proto.py --out DIR  # write them to DIR instead (the tests compare)

Runs ``grpc_tools.protoc`` (pinned in the ``dev`` extra, so that output is the same on every
machine) and then makes two fixes, each checked to apply exactly once:

* the gRPC module imports its messages package-relatively (protoc writes a top-level
  ``import grpc_service_pb2``, which only works with the folder on ``sys.path``);
* the messages go into a descriptor pool of their own, not protobuf's default pool.
  tritonclient (and MLServer, KServe) register the same ``inference.*`` names in the default
  pool, and protobuf refuses a second definition of a name, so without this a process could
  not import both corral's server and a stock client.

The generated files are never edited by hand: ``tests/test_server_grpc.py`` regenerates them
and fails if the committed copies differ.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

PROTO_DIR = Path(__file__).resolve().parent.parent / "corral" / "protocol" / "proto"
PROTO = "grpc_service.proto"

# (file, what protoc writes, what corral needs): each must match exactly once.
_FIXES = (
    (
        "grpc_service_pb2_grpc.py",
        "import grpc_service_pb2 as grpc__service__pb2\n",
        "from . import grpc_service_pb2 as grpc__service__pb2\n",
    ),
    (
        "grpc_service_pb2.py",
        "DESCRIPTOR = _descriptor_pool.Default().AddSerializedFile(",
        "# corral: a pool of its own, so that tritonclient's copy of these names can coexist.\n"
        "DESCRIPTOR = _descriptor_pool.DescriptorPool().AddSerializedFile(",
    ),
)


def generate(out: Path) -> list[Path]:
    """Write ``grpc_service_pb2.py``, ``.pyi`` and ``_pb2_grpc.py`` into ``out``; return them."""
    from grpc_tools import protoc  # a dev dependency: only this script needs it

    out.mkdir(parents=True, exist_ok=True)
    status = protoc.main(
        [
            "grpc_tools.protoc",
            f"--proto_path={PROTO_DIR}",
            f"--python_out={out}",
            f"--pyi_out={out}",
            f"--grpc_python_out={out}",
            str(PROTO_DIR / PROTO),
        ]
    )
    if status != 0:
        raise RuntimeError(f"protoc failed on {PROTO_DIR / PROTO} (exit status {status})")
    for name, written, needed in _FIXES:
        path = out / name
        text = path.read_text()
        if text.count(written) != 1:
            raise RuntimeError(
                f"{path}: expected protoc to write {written!r} once; the generator changed, "
                "so update scripts/gen_proto.py"
            )
        path.write_text(text.replace(written, needed))
    return [out / "grpc_service_pb2.py", out / "grpc_service_pb2.pyi", out / _FIXES[0][0]]


def main(argv: list[str] | None = None) -> int:
    """Parse the command line and regenerate; returns the exit status."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=PROTO_DIR, help="where to write the modules")
    args = parser.parse_args(argv)
    for path in generate(args.out):
        print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
