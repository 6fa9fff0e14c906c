"""NVIDIA Triton with its C++ onnxruntime backend: a peer of bench-http and bench-real.

The server is the ``tritonserver`` 2.51 that PyPI's nvidia-pytriton 0.7.0 ships; the backend
is Triton's ``onnxruntime_backend`` (branch r24.10, the server's) compiled here for CPU against
the ``libonnxruntime.so`` of PyPI's onnxruntime wheel. Neither is committed, and building the
backend needs its sources fetched by hand: ``make triton-peer MIRROR=...``
(``scripts/build_triton_peer.sh``) puts both under :func:`triton_home` and leaves a stamp,
``corral-triton.json``, which :func:`find_build` reads. When there is none, the benchmarks
print :func:`not_built_line` and measure without Triton.

Triton serves corral's Triton-layout repository as it is, once every model folder holds a
complete ``config.pbtxt`` (it runs with ``--disable-auto-complete-config``, as a user serving
many models would): :func:`write_configs` writes one from each ONNX file's own signature
(``platform: "onnxruntime_onnx"``, ``max_batch_size: 0``: each request runs as sent, on both
servers). The three ``--backend-config`` flags of :func:`triton_argv` give Triton one
onnxruntime thread pool for all its sessions, one intra-op and one inter-op thread, as corral
has; without them each model instance gets a pool as wide as the machine.

CPU per request: :func:`process_cpu_seconds` reads a server's user + system time (every
thread) from ``/proc/<pid>/stat``, before and after a run, for every server alike.
"""

from __future__ import annotations

import json
import os
import subprocess
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from benchmarks.peers import CACHE, PeerUnavailable
from benchmarks.server_processes import start_process

__all__ = [
    "HOME_ENV",
    "STAMP",
    "TensorSpec",
    "TritonBuild",
    "config_pbtxt",
    "find_build",
    "model_specs",
    "not_built_line",
    "parse_proc_stat",
    "process_cpu_seconds",
    "start_triton",
    "triton_argv",
    "triton_home",
    "write_configs",
]

#: The environment variable naming the folder ``scripts/build_triton_peer.sh`` built into.
HOME_ENV = "CORRAL_TRITON_HOME"
#: The build's stamp in that folder: where the server and the backend are, built from what.
STAMP = "corral-triton.json"

_VERSION = "1"


def triton_home() -> Path:
    """``$CORRAL_TRITON_HOME``, else ``triton-ort`` in the bench cache (~/.cache/corral-bench)."""
    configured = os.environ.get(HOME_ENV)
    return Path(configured) if configured else CACHE / "triton-ort"


@dataclass(frozen=True)
class TritonBuild:
    """A built peer: the server binary, the backend folder, and the stamp's other facts."""

    server: Path
    backends: Path
    info: dict[str, Any]

    def describe(self) -> str:
        """One line for the report: versions and the sources' branch."""
        return (
            f"tritonserver 2.51 ({self.info.get('pins', '?')}), onnxruntime_backend "
            f"{self.info.get('branch', '?')} "
            f"{str(self.info.get('commits', {}).get('onnxruntime_backend', '?'))[:9]} on "
            f"onnxruntime {self.info.get('onnxruntime', '?')}"
        )


def find_build(home: Path | None = None) -> TritonBuild:
    """The peer built under ``home`` (default :func:`triton_home`).

    Raises :class:`PeerUnavailable` saying what is missing when it is not built there.
    """
    home = triton_home() if home is None else home
    stamp = home / STAMP
    try:
        info: dict[str, Any] = json.loads(stamp.read_text())
    except FileNotFoundError:
        raise PeerUnavailable(f"no {STAMP} in {home}") from None
    except (OSError, ValueError) as exc:
        raise PeerUnavailable(f"{stamp} is unreadable: {exc}") from exc
    server = Path(str(info.get("server", "")))
    backends = Path(str(info.get("backends", "")))
    if not (server.is_file() and os.access(server, os.X_OK)):
        raise PeerUnavailable(f"{stamp} names no runnable server ({server})")
    if not (backends / "onnxruntime" / "libtriton_onnxruntime.so").is_file():
        raise PeerUnavailable(f"no onnxruntime/libtriton_onnxruntime.so in {backends}")
    return TritonBuild(server, backends, info)


def not_built_line(reason: str) -> str:
    """What a benchmark prints when Triton is not built: a note, not a failure."""
    return (
        f"Triton: not built ({reason}), so not measured. `make triton-peer MIRROR=<mirrors>` "
        f"builds it into ${HOME_ENV} (default {CACHE / 'triton-ort'}): see benchmarks/README.md."
    )


# -- config.pbtxt -----------------------------------------------------------------------------


@dataclass(frozen=True)
class TensorSpec:
    """One input or output as config.pbtxt declares it."""

    name: str
    #: Triton's type name, e.g. ``TYPE_FP32``.
    data_type: str
    #: The model's shape, -1 where it is not fixed; () for a scalar.
    dims: tuple[int, ...]


#: ONNX's element types (``onnx.TensorProto``'s numbers) by Triton's names for them.
_ONNX_TYPES = {
    1: "TYPE_FP32",
    2: "TYPE_UINT8",
    3: "TYPE_INT8",
    4: "TYPE_UINT16",
    5: "TYPE_INT16",
    6: "TYPE_INT32",
    7: "TYPE_INT64",
    8: "TYPE_STRING",
    9: "TYPE_BOOL",
    10: "TYPE_FP16",
    11: "TYPE_FP64",
    12: "TYPE_UINT32",
    13: "TYPE_UINT64",
    16: "TYPE_BF16",
}


def _spec(value: Any) -> TensorSpec:
    # An onnx ValueInfoProto: a dimension without a fixed value (a name, or nothing) is -1.
    tensor = value.type.tensor_type
    if tensor.elem_type not in _ONNX_TYPES:
        raise PeerUnavailable(
            f"{value.name}: ONNX element type {tensor.elem_type} has no Triton type"
        )
    dims = tuple(dim.dim_value if dim.HasField("dim_value") else -1 for dim in tensor.shape.dim)
    return TensorSpec(value.name, _ONNX_TYPES[tensor.elem_type], dims)


def model_specs(model: Path) -> tuple[list[TensorSpec], list[TensorSpec]]:
    """The inputs (initializers left out) and outputs of the ONNX file ``model``.

    Read with the ``onnx`` package, not a session: no thread pool is made or needed.
    """
    import onnx

    graph = onnx.load(str(model), load_external_data=False).graph
    initializers = {tensor.name for tensor in graph.initializer}
    return (
        [_spec(value) for value in graph.input if value.name not in initializers],
        [_spec(value) for value in graph.output],
    )


def _tensor(spec: TensorSpec) -> str:
    dims = ", ".join(str(dim) for dim in spec.dims)
    return f'  {{ name: "{spec.name}", data_type: {spec.data_type}, dims: [ {dims} ] }}'


def config_pbtxt(
    name: str,
    inputs: Sequence[TensorSpec],
    outputs: Sequence[TensorSpec],
    *,
    instance_count: int | None = None,
) -> str:
    """A complete config.pbtxt that Triton and corral both read the same way.

    Raises :class:`PeerUnavailable` for a scalar input or output: Triton 2.51 refuses one in
    a model that is not batched ("scalar tensors are not supported"; silero-vad's ``sr``).

    ``max_batch_size: 0`` with the model's full shapes: every request runs as sent (Triton
    does not combine requests without ``dynamic_batching``, nor does corral then).
    ``instance_count`` adds ``instance_group [ { kind: KIND_CPU, count: N } ]`` (Triton: N
    instances; corral: a pool of N sessions); None leaves each server's default.
    """
    scalars = [spec.name for spec in [*inputs, *outputs] if not spec.dims]
    if scalars:
        raise PeerUnavailable(
            f"Triton serves no scalar tensor in a model without batching ({', '.join(scalars)})"
        )
    lines = [
        f'name: "{name}"',
        'platform: "onnxruntime_onnx"',
        "max_batch_size: 0",
        "input [",
        ",\n".join(_tensor(spec) for spec in inputs),
        "]",
        "output [",
        ",\n".join(_tensor(spec) for spec in outputs),
        "]",
    ]
    if instance_count is not None:
        lines.append(f"instance_group [ {{ kind: KIND_CPU, count: {instance_count} }} ]")
    return "\n".join(lines) + "\n"


def write_configs(repository: Path, *, instance_count: int | None = None) -> list[str]:
    """A config.pbtxt in every model folder of ``repository`` that has none; their names.

    A folder with a ``model.toml`` is refused (:class:`PeerUnavailable`): Triton does not
    read it, so the two servers would not serve the same settings.
    """
    written = []
    for model in sorted(repository.glob(f"*/{_VERSION}/model.onnx")):
        folder = model.parent.parent
        if (folder / "config.pbtxt").exists():
            continue
        if (folder / "model.toml").exists():
            raise PeerUnavailable(f"{folder.name} has a model.toml, which Triton does not read")
        inputs, outputs = model_specs(model)
        text = config_pbtxt(folder.name, inputs, outputs, instance_count=instance_count)
        (folder / "config.pbtxt").write_text(text)
        written.append(folder.name)
    return written


# -- the server -------------------------------------------------------------------------------


def triton_argv(
    build: TritonBuild, repository: Path, http_port: int, grpc_port: int, metrics_port: int
) -> list[str]:
    """The server's command line: 127.0.0.1 only, complete configs, one onnxruntime pool."""
    return [
        str(build.server),
        f"--model-repository={repository}",
        f"--backend-directory={build.backends}",
        "--http-address=127.0.0.1",
        f"--http-port={http_port}",
        "--grpc-address=127.0.0.1",
        f"--grpc-port={grpc_port}",
        "--metrics-address=127.0.0.1",
        f"--metrics-port={metrics_port}",
        "--allow-gpu-metrics=false",
        "--disable-auto-complete-config",
        "--backend-config=onnxruntime,enable-global-threadpool=1",
        "--backend-config=onnxruntime,intra_op_thread_count=1",
        "--backend-config=onnxruntime,inter_op_thread_count=1",
        "--log-verbose=0",
    ]


def start_triton(
    build: TritonBuild,
    repository: Path,
    log: Path,
    ports: tuple[int, int, int],
) -> subprocess.Popen[bytes]:
    """Start Triton on ``repository`` (HTTP, gRPC, metrics ports); return at once.

    The caller waits until it answers and stops it by its pid (``server_processes.stop_process``).
    It runs in a session of its own and gets SIGTERM if this process dies first.
    """
    http_port, grpc_port, metrics_port = ports
    argv = triton_argv(build, repository, http_port, grpc_port, metrics_port)
    return start_process(argv, log, dict(os.environ))


# -- CPU time ---------------------------------------------------------------------------------

_CLOCK_TICKS = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


def parse_proc_stat(text: str) -> tuple[int, int]:
    """The user and system CPU time (clock ticks) in the text of ``/proc/<pid>/stat``.

    The command name (field 2) is in parentheses and may hold spaces and parentheses: the
    fields are counted from the last ``)``. utime and stime are fields 14 and 15.
    """
    end = text.rfind(")")
    if end < 0:
        raise ValueError(f"not a /proc/<pid>/stat line: {text[:80]!r}")
    fields = text[end + 1 :].split()
    # fields[0] is field 3 (the state): field n is fields[n - 3].
    if len(fields) < 13:
        raise ValueError(f"a /proc/<pid>/stat line too short: {text[:80]!r}")
    return int(fields[11]), int(fields[12])


def process_cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of process ``pid`` (all its threads) so far."""
    user, system = process_cpu_split(pid)
    return user + system


def process_cpu_split(pid: int) -> tuple[float, float]:
    """User and system CPU seconds of process ``pid`` and its live descendants so far, apart.

    The system share is the kernel's work for the process (socket reads and writes, waking
    threads), which a server in C++ pays as much as one in Python; the user share is its own.
    Descendants count: ``corral serve --processes N`` serves from its children.
    """
    user = system = 0.0
    for each in _process_tree(pid):
        try:
            utime, stime = parse_proc_stat(Path(f"/proc/{each}/stat").read_text())
        except FileNotFoundError:  # ended meanwhile
            continue
        user += utime / _CLOCK_TICKS
        system += stime / _CLOCK_TICKS
    return user, system


def _process_tree(pid: int) -> list[int]:
    """``pid`` and its descendants now (psutil's walk, as ``bench_peers.tree_usage`` takes)."""
    import psutil

    try:
        children = psutil.Process(pid).children(recursive=True)
    except psutil.NoSuchProcess:
        children = []  # ended: its own /proc entry is gone too, and is skipped
    return [pid, *(child.pid for child in children)]
