"""corral's native edge (Rust, PyO3): HTTP/1.1 and gRPC sockets, plain inference requests
decoded natively and handed to Python in groups, everything else bridged to the Python edge.

See edge/README.md.
"""

from collections.abc import Buffer

__version__: str

class Budget:
    """A thread-safe byte budget (atomics), shared by everything that holds request bodies."""

    def __init__(self, limit_bytes: int) -> None: ...
    def try_grow(self, n: int) -> bool: ...
    def give_back(self, n: int) -> None: ...
    @property
    def held(self) -> int: ...
    @property
    def limit(self) -> int: ...

class Tensor(Buffer):
    """An input: read-only, C-contiguous little-endian bytes (format "B"), a zero-copy view
    of the request body or of the values decoded from JSON; np.frombuffer(t, dtype) views it."""

    @property
    def name(self) -> str: ...
    @property
    def datatype(self) -> str: ...
    @property
    def shape(self) -> tuple[int, ...]: ...
    @property
    def nbytes(self) -> int: ...
    def __len__(self) -> int: ...
    def __buffer__(self, flags: int, /) -> memoryview: ...

class Call:
    """One request handed to Python: answered exactly once (a second answer raises
    RuntimeError; a Call dropped unanswered answers 500 / INTERNAL)."""

    @property
    def protocol(self) -> str: ...  # "http" or "grpc"
    @property
    def id(self) -> str | None: ...
    @property
    def inputs(self) -> list[Tensor]: ...
    @property
    def outputs(self) -> list[tuple[str, bool | None]]: ...
    @property
    def binary_data_output(self) -> bool: ...
    @property
    def timeout_us(self) -> int | None: ...
    @property
    def received_ns(self) -> int: ...
    @property
    def answered(self) -> bool: ...
    def answer(
        # outputs: (name, datatype, shape, array); array a numpy array of the datatype's
        # native dtype, or a C-contiguous buffer of its element type.
        self,
        model_name: str,
        model_version: str | None,
        outputs: list[tuple[str, str, tuple[int, ...], Buffer]],
    ) -> None: ...
    def answer_http(self, status: int, headers: list[tuple[bytes, bytes]], body: bytes) -> None: ...
    def answer_grpc(self, code: int, message: str, response: bytes | None = None) -> None: ...
    def bridge(self) -> None:
        """Hand the request, as it came, to the Python edge, which answers it."""

class Group:
    """The calls of one model version taken in one round, in arrival order."""

    @property
    def model(self) -> str: ...
    @property
    def version(self) -> str | None: ...
    @property
    def calls(self) -> list[Call]: ...
    @property
    def alone(self) -> bool: ...

class Edge:
    def __init__(
        self,
        *,
        http_fd: int | None,
        grpc_fd: int | None,
        http_bridge: str | None,
        grpc_bridge: str | None,
        budget: Budget,
        threads: int = 1,
        native_infer: bool = True,
        auth: bytes | None = None,
        allowed_hosts: list[str] | None = None,
        max_url_bytes: int,
        max_header_bytes: int,
        header_timeout_s: float,
        idle_timeout_s: float,
        max_connections: int,
        body_timeout_s: float,
        max_request_bytes: int,
        body_min_rate_bytes_s: int = 1024,
        native_body_bytes: int = 1 << 20,
        max_pending: int = 4096,
        grpc_max_connections: int | None,
        grpc_idle_timeout_s: float,
        grpc_handshake_timeout_s: float,
        grpc_keepalive_time_s: float,
        grpc_keepalive_timeout_s: float,
        grpc_min_ping_interval_s: float = 10.0,
        grpc_max_concurrent_streams: int | None,
        grpc_max_message_bytes: int,
    ) -> None: ...
    def start(self) -> None: ...
    def take(self, timeout_s: float) -> list[Group]: ...
    def notices(self) -> list[tuple[int, str]]: ...
    @property
    def in_flight(self) -> int: ...
    def drain(self, timeout_s: float) -> int: ...
    def stop(self) -> None: ...
    def stats(self) -> dict[str, int]: ...

# Private: the differential tests' entries.
def _decode_http(headers: list[tuple[bytes, bytes]], body: bytes) -> dict[str, object] | None: ...
def _decode_grpc(message: bytes) -> dict[str, object] | None: ...
def _encode_http(
    model_name: str,
    model_version: str | None,
    id: str | None,
    outputs: list[tuple[str, str, tuple[int, ...], Buffer]],
    requested: list[tuple[str, bool | None]],
    binary_data_output: bool,
) -> tuple[bytes, int | None]: ...
def _encode_grpc(
    model_name: str,
    model_version: str | None,
    id: str | None,
    outputs: list[tuple[str, str, tuple[int, ...], Buffer]],
) -> bytes: ...
def _host_name(value: str) -> str | None: ...
def _allows(allowed_hosts: list[str] | None, host: bytes) -> bool: ...
def _panic_on_model(model: str | None) -> None: ...

def answer_all(
    answers: list[tuple[Call, str, str | None, list[tuple[str, str, tuple[int, ...], Buffer]]]],
) -> list[int]:
    """Answer many calls as Call.answer does, with one release of the GIL for them all.

    Returns the indexes of the calls left open because an output could not be encoded;
    a call answered already is skipped.
    """
