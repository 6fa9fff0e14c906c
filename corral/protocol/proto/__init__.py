"""Generated protobuf and gRPC modules for the Open Inference Protocol; never edit by hand.

``grpc_service.proto`` is the source. ``make proto`` (``python scripts/gen_proto.py`` in a
venv with the pinned grpcio-tools) regenerates ``grpc_service_pb2.py`` (messages),
``grpc_service_pb2.pyi`` (their types) and ``grpc_service_pb2_grpc.py`` (service stub and
registration); a test checks that the committed files are exactly what the script writes.

The generated modules refuse, at import, a protobuf or grpcio runtime older than the
generator that wrote them, with a traceback. :func:`runtime_problems` names that mismatch
first, without importing them, so that ``corral serve`` can say it in one line.
"""

from __future__ import annotations

import re
from importlib.metadata import PackageNotFoundError, version

#: The oldest runtimes the generated code accepts: the protobuf its gencode names
#: (``ValidateProtobufRuntimeVersion`` in ``grpc_service_pb2.py`` and ``model_config_pb2.py``)
#: and the grpcio of ``GRPC_GENERATED_VERSION`` in ``grpc_service_pb2_grpc.py``. A test
#: reads both from the files; pyproject.toml's floors of the ``grpc`` extra are these.
NEEDED = {"protobuf": (6, 30, 0), "grpcio": (1, 72, 2)}


def release(text: str) -> tuple[int, ...]:
    """The leading release numbers of a version string: ``"6.33.6"`` -> ``(6, 33, 6)``."""
    found = re.match(r"\d+(?:\.\d+)*", text)
    return tuple(int(part) for part in found[0].split(".")) if found else ()


def runtime_problems() -> list[str]:
    """What is wrong with the installed protobuf and grpcio for the generated code; [] if fine.

    Each problem names the package, the version installed, the version needed and the fix.
    A package that is missing is not a problem here: importing it fails with its own name.
    """
    problems = []
    for package, needed in NEEDED.items():
        try:
            installed = version(package)
        except PackageNotFoundError:
            continue
        if release(installed) < needed:
            floor = ".".join(map(str, needed))
            problems.append(
                f"{package} {installed} is installed, but corral's generated gRPC code needs "
                f"{package} >= {floor}: pip install '{package}>={floor}'"
            )
    return problems
