"""Triton's system shared memory extension: tensors read from and written to client memory.

A client creates a POSIX shared-memory object (``shm_open``; on Linux a file in ``/dev/shm``),
registers a span of it under a name, and then names that region in an input's or a requested
output's parameters instead of sending the bytes:

- ``shared_memory_region`` (string): the registered name;
- ``shared_memory_byte_size`` (integer): the tensor's bytes, required with the region;
- ``shared_memory_offset`` (integer, default 0): where they start in the region.

An input is copied out of the region while the request is decoded (its byte size checked
against its shape and datatype), so the client may overwrite the region once it has its
answer, and the model never sees bytes changing under it. An output is written into its region
after the run, once every output of the request is known to fit; the response then carries the
parameters (``shared_memory_byte_size``: the bytes written) and no data.

:class:`SharedMemoryRegistry` owns the objects' descriptors. Every use of a region counts as a
user for as long as it reads or writes; unregistering a region in use takes it out of service
at once for new requests and closes its descriptor when its last user is done, so that no read
or write ever meets a descriptor closed (or reused) under it. :meth:`SharedMemoryRegistry.close`
does the same for every region, at server shutdown.

Regions are read and written with ``pread`` and ``pwrite`` on the object's descriptor, never
through a mapping: a client that truncates its object under the server makes a read come back
short (refused, naming the region) instead of faulting the process with SIGBUS, as touching a
mapping past the object's end would. A client can still read and write any object the server's
user may open, which is why the extension is off unless ``--system-shared-memory`` turns it on
(Triton's ``--allow-client-shm``).

Errors, each mapped by the transports to Triton's codes (HTTP; gRPC)::

    CorralError
    ├── InvalidInput              a bad span, key or parameter; too small an output (400)
    │   ├── SharedMemoryNotFound  no region of that name (404; NOT_FOUND)
    │   └── SharedMemoryUnsupported  CUDA shared memory, or the extension off (501;
    │                             UNIMPLEMENTED)
    ├── SharedMemoryExists        the name is registered already (400; ALREADY_EXISTS)
    └── TooManyRegions            the registry is full (400; RESOURCE_EXHAUSTED)

Example::

    registry = SharedMemoryRegistry(max_regions=64)
    registry.register("input_data", "/input_simple", offset=0, byte_size=128)
    registry.status()            # [RegionStatus(name='input_data', key='/input_simple', ...)]
    registry.unregister()        # every region
"""

from __future__ import annotations

import enum
import os
import stat
import threading
from collections.abc import Iterator, Sequence
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, replace
from pathlib import Path
from types import TracebackType
from typing import Any

import numpy.typing as npt

from corral._base import CorralError, InvalidInput, InvalidOption
from corral.protocol.binary import decode_tensor, element_count, encode_tensor
from corral.protocol.costs import DecodeAllowance
from corral.protocol.datatypes import numpy_dtype
from corral.protocol.types import InferOutput, Parameters, RequestedOutput

__all__ = [
    "DEFAULT_MAX_REGIONS",
    "EXTENSION",
    "SHM_BYTE_SIZE",
    "SHM_OFFSET",
    "SHM_REGION",
    "OutputRegions",
    "RegionStatus",
    "RegistryState",
    "SharedMemoryExists",
    "SharedMemoryNotFound",
    "SharedMemoryReference",
    "SharedMemoryRegistry",
    "SharedMemoryUnsupported",
    "TooManyRegions",
    "cuda_shared_memory_refused",
    "cuda_status",
    "in_shared_memory",
    "pop_reference",
    "read_input",
]

#: The extension's name in the server metadata's ``extensions``.
EXTENSION = "system_shared_memory"
#: The parameters that put a tensor in shared memory.
SHM_REGION = "shared_memory_region"
SHM_BYTE_SIZE = "shared_memory_byte_size"
SHM_OFFSET = "shared_memory_offset"
#: Regions registered at once unless the server is told otherwise.
DEFAULT_MAX_REGIONS = 1024

# Where Linux keeps POSIX shared-memory objects: shm_open("/name") opens /dev/shm/name.
_SHM_DIRECTORY = Path("/dev/shm")
# The settings that turn the extension on, as the refusals name them.
_TURN_ON = "start corral serve with --system-shared-memory (CORRAL_SYSTEM_SHARED_MEMORY=true)"


class SharedMemoryNotFound(InvalidInput):
    """No system shared-memory region is registered under that name (or it is unregistering).

    An :class:`~corral.InvalidInput` when a tensor names it, so that the codecs' contract
    holds: a request they cannot decode raises InvalidInput, whatever its bytes.
    """


class SharedMemoryExists(CorralError):
    """A region is already registered under that name: unregister it first."""


class TooManyRegions(CorralError):
    """The registry holds its maximum number of regions: unregister some first."""


class SharedMemoryUnsupported(InvalidInput):
    """The request needs shared memory this server does not serve (CUDA, or the extension off).

    An :class:`~corral.InvalidInput` for the same reason as :class:`SharedMemoryNotFound`.
    """


class RegistryState(enum.Enum):
    """Where a :class:`SharedMemoryRegistry` is in its life."""

    #: Registers, serves and unregisters regions.
    OPEN = "open"
    #: Closed: every region unregistered (closed once its last user is done); refuses new ones.
    CLOSED = "closed"


@dataclass(frozen=True, slots=True)
class RegionStatus:
    """One registered region, as the status endpoints describe it."""

    name: str
    #: The shared-memory object's name, as the client registered it (``/input_simple``).
    key: str
    #: Where the region starts in the object, and its size, in bytes.
    offset: int
    byte_size: int


@dataclass(frozen=True, slots=True)
class SharedMemoryReference:
    """A tensor's place in shared memory, from its parameters."""

    region: str
    offset: int
    byte_size: int


class _Region:
    """One registered region: the object's descriptor and its users."""

    __slots__ = ("fd", "status", "unregistering", "users")

    def __init__(self, status: RegionStatus, fd: int) -> None:
        self.status = status
        # Read and written with pread/pwrite (see the module): open until its last user is done.
        self.fd = fd
        # Under the registry's lock: requests reading or writing it now; and whether it was
        # unregistered, to be closed when the last of them is done.
        self.users = 0
        self.unregistering = False

    def read(self, offset: int, byte_size: int) -> bytes:
        """The ``byte_size`` bytes at ``offset`` in the region; refused if the object is short."""
        at = self.status.offset + offset
        chunks: list[bytes] = []
        got = 0
        while got < byte_size:
            chunk = os.pread(self.fd, byte_size - got, at + got)
            if not chunk:
                raise self._shrunk(at + byte_size)
            chunks.append(chunk)
            got += len(chunk)
        return chunks[0] if len(chunks) == 1 else b"".join(chunks)

    def write(self, offset: int, data: bytes) -> None:
        """Write ``data`` at ``offset`` in the region; refused if the object no longer covers it."""
        at = self.status.offset + offset
        size = os.fstat(self.fd).st_size
        if size < at + len(data):
            # Writing would grow the client's object back: refuse, as a read would be.
            raise self._shrunk(at + len(data))
        view = memoryview(data)
        while view:
            written = os.pwrite(self.fd, view, at)
            view, at = view[written:], at + written

    def _shrunk(self, needed: int) -> InvalidInput:
        size = os.fstat(self.fd).st_size
        return InvalidInput(
            f"shared memory region {self.status.name!r}: its object {self.status.key!r} "
            f"has shrunk to {size} bytes, short of the {needed} this request uses"
        )

    def leave(self) -> bool:
        """Under the registry's lock: one user fewer; True if the last left an unregistered one."""
        self.users -= 1
        return self.users == 0 and self.unregistering

    def close(self) -> None:
        """Close the object's descriptor: under no user (the registry waits for the last)."""
        os.close(self.fd)


class SharedMemoryRegistry:
    """The system shared-memory regions registered with the server; safe from any thread.

    At most ``max_regions`` at once. ``directory`` is where shared-memory objects live
    (``/dev/shm``; tests may point it elsewhere). Use it as a context manager, or call
    :meth:`close`, to close every region.
    """

    def __init__(
        self, max_regions: int = DEFAULT_MAX_REGIONS, *, directory: Path = _SHM_DIRECTORY
    ) -> None:
        if type(max_regions) is not int or max_regions < 1:
            raise InvalidOption(
                f"max_regions must be a positive integer; got {max_regions!r}",
                option="max_regions",
            )
        self._max_regions = max_regions
        self._directory = directory
        # Guards the state, the regions by name, and each region's users and unregistering
        # flag. Held for bookkeeping only: never across opening, reading or writing.
        self._regions_lock = threading.Lock()
        self._regions: dict[str, _Region] = {}
        self._state = RegistryState.OPEN

    @property
    def state(self) -> RegistryState:
        """OPEN until :meth:`close`."""
        return self._state

    @property
    def max_regions(self) -> int:
        """The most regions registered at once."""
        return self._max_regions

    def register(self, name: str, key: str, offset: int, byte_size: int) -> None:
        """Map ``byte_size`` bytes at ``offset`` of the shared-memory object ``key`` as ``name``.

        ``key`` is the object's name as ``shm_open`` takes it (``/input_simple``). Raises
        :class:`SharedMemoryExists` for a name in use, :class:`TooManyRegions` past the
        maximum, and :class:`~corral.InvalidInput` for an empty name, a key that names no
        object or not a shared-memory object, or a span outside the object.
        """
        self._check_span_arguments(name, offset, byte_size)
        with self._regions_lock:
            self._check_room(name)
        fd = self._open(name, key, offset, byte_size)
        region = _Region(RegionStatus(name, key, offset, byte_size), fd)
        try:
            with self._regions_lock:
                self._check_room(name)  # again: another thread may have registered meanwhile
                self._regions[name] = region
        except BaseException:
            region.close()
            raise

    def unregister(self, name: str | None = None) -> None:
        """Unregister the region ``name``, or every region if ``name`` is None or empty.

        A region in use by a request is taken out of service now and closed when its last
        user is done; it is still listed by :meth:`status` until then. As in Triton,
        unregistering a name that is not registered is not an error: the name is free after.
        """
        with self._regions_lock:
            self._check_open("unregister a region")
            done = self._take_out(name)
        for region in done:
            region.close()

    def status(self, name: str | None = None) -> list[RegionStatus]:
        """Every registered region, or only ``name`` (:class:`SharedMemoryNotFound` if absent)."""
        with self._regions_lock:
            if not name:
                return [region.status for region in self._regions.values()]
            region = self._regions.get(name)
            if region is None:
                raise SharedMemoryNotFound(f"Unable to find system shared memory region: {name!r}")
            return [region.status]

    def read(self, reference: SharedMemoryReference, *, tensor: str) -> bytes:
        """A copy of the bytes ``reference`` names, read while the region is held."""
        with self._use(reference, tensor) as region:
            return region.read(reference.offset, reference.byte_size)

    @contextmanager
    def hold(self, reference: SharedMemoryReference, *, tensor: str) -> Iterator[_Destination]:
        """Hold the region ``reference`` names (checked) for writing ``tensor`` into it."""
        with self._use(reference, tensor) as region:
            yield _Destination(region, reference, tensor)

    def close(self) -> None:
        """Unregister every region (each closed once its users are done); idempotent."""
        with self._regions_lock:
            if self._state is RegistryState.CLOSED:
                return
            self._state = RegistryState.CLOSED
            done = self._take_out(None)
        for region in done:
            region.close()

    def __enter__(self) -> SharedMemoryRegistry:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.close()

    def __len__(self) -> int:
        """Regions registered now, those unregistering included."""
        return len(self._regions)

    # -- internals ------------------------------------------------------------------------

    def _check_open(self, doing: str) -> None:
        if self._state is RegistryState.CLOSED:
            raise SharedMemoryUnsupported(
                f"cannot {doing}: the server is shutting down and has released shared memory"
            )

    def _check_room(self, name: str) -> None:
        self._check_open(f"register shared memory region {name!r}")
        if name in self._regions:
            raise SharedMemoryExists(
                f"shared memory region {name!r} already in manager; unregister it first"
            )
        if len(self._regions) >= self._max_regions:
            raise TooManyRegions(
                f"cannot register shared memory region {name!r}: {len(self._regions)} regions "
                f"are registered, the most this server holds (--max-shared-memory-regions); "
                "unregister some first"
            )

    @staticmethod
    def _check_span_arguments(name: str, offset: int, byte_size: int) -> None:
        if not name:
            raise InvalidInput("a shared memory region needs a name")
        for label, value in (("offset", offset), ("byte_size", byte_size)):
            if type(value) is not int or value < 0:
                raise InvalidInput(
                    f"shared memory region {name!r}: {label} must be a non-negative integer; "
                    f"got {value!r}"
                )
        if byte_size == 0:
            raise InvalidInput(f"shared memory region {name!r}: byte_size must be at least 1")

    def _object_path(self, name: str, key: str) -> Path:
        # shm_open's rule: leading slashes are dropped and no other slash is allowed, so a key
        # can never reach outside the shared-memory directory.
        object_name = key.lstrip("/")
        if (
            not object_name
            or "/" in object_name
            or "\0" in object_name
            or object_name
            in {
                ".",
                "..",
            }
        ):
            raise InvalidInput(
                f"cannot register shared memory region {name!r} - invalid shm key {key!r}: a "
                "POSIX shared-memory name is a slash and a name without slashes, like "
                "'/input_data'"
            )
        return self._directory / object_name

    def _open(self, name: str, key: str, offset: int, byte_size: int) -> int:
        path = self._object_path(name, key)
        flags = os.O_RDWR | getattr(os, "O_CLOEXEC", 0) | getattr(os, "O_NOFOLLOW", 0)
        try:
            fd = os.open(path, flags)
        except OSError as exc:
            raise InvalidInput(
                f"failed to register shared memory region {name!r}: unable to open shared "
                f"memory object {key!r}: {exc.strerror}"
            ) from exc
        try:
            info = os.fstat(fd)
            if not stat.S_ISREG(info.st_mode):
                raise InvalidInput(
                    f"failed to register shared memory region {name!r}: {key!r} is not a "
                    "shared memory object"
                )
            if offset + byte_size > info.st_size:
                raise InvalidInput(
                    f"failed to register shared memory region {name!r}: offset {offset} + "
                    f"byte_size {byte_size} runs past the end of {key!r}, which has "
                    f"{info.st_size} bytes"
                )
        except BaseException:
            os.close(fd)
            raise
        return fd

    def _take_out(self, name: str | None) -> list[_Region]:
        """Under the lock: unregister ``name`` (None or empty: all); those to close now."""
        names = list(self._regions) if not name else [name] if name in self._regions else []
        done = []
        for each in names:
            region = self._regions[each]
            region.unregistering = True
            if region.users == 0:
                del self._regions[each]
                done.append(region)
        return done

    @contextmanager
    def _use(self, reference: SharedMemoryReference, tensor: str) -> Iterator[_Region]:
        with self._regions_lock:
            region = self._regions.get(reference.region)
            if region is None or region.unregistering:
                why = "is being unregistered" if region is not None else "is not registered"
                raise SharedMemoryNotFound(
                    f"Unable to find shared memory region: {reference.region!r} (named by "
                    f"{tensor}) {why}"
                )
            _check_span(region.status, reference, tensor)
            region.users += 1
        try:
            yield region
        finally:
            with self._regions_lock:
                last = region.leave()
                if last:
                    del self._regions[region.status.name]
            if last:
                region.close()


def _check_span(status: RegionStatus, reference: SharedMemoryReference, tensor: str) -> None:
    if reference.offset >= status.byte_size:
        raise InvalidInput(
            f"Invalid offset for shared memory region: {status.name!r}: {tensor} gives "
            f"{SHM_OFFSET} {reference.offset}, but the region has {status.byte_size} bytes"
        )
    if reference.offset + reference.byte_size > status.byte_size:
        raise InvalidInput(
            f"Invalid offset + byte size for shared memory region: {status.name!r}: {tensor} "
            f"gives {SHM_OFFSET} {reference.offset} and {SHM_BYTE_SIZE} "
            f"{reference.byte_size}, past the region's {status.byte_size} bytes"
        )


class _Destination:
    """A held span of a region, for one output."""

    __slots__ = ("_reference", "_region", "tensor")

    def __init__(self, region: _Region, reference: SharedMemoryReference, tensor: str) -> None:
        self._region = region
        self._reference = reference
        self.tensor = tensor

    @property
    def reference(self) -> SharedMemoryReference:
        """Where the output goes."""
        return self._reference

    def write(self, data: bytes) -> None:
        """Write ``data`` (no longer than the span: the caller checked) at the span's start."""
        self._region.write(self._reference.offset, data)


def pop_reference(
    parameters: dict[str, Any], owner: str, *, tensor: str
) -> SharedMemoryReference | None:
    """Take the shared-memory parameters out of ``parameters``; None if it names no region.

    ``shared_memory_byte_size`` is required with ``shared_memory_region``;
    ``shared_memory_offset`` defaults to 0; either without the region is refused, as are values
    of the wrong type. ``owner`` names the tensor in messages (``"input 'x'"``).
    """
    region = parameters.pop(SHM_REGION, None)
    byte_size = parameters.pop(SHM_BYTE_SIZE, None)
    offset = parameters.pop(SHM_OFFSET, None)
    if region is None:
        if byte_size is not None or offset is not None:
            given = [SHM_BYTE_SIZE] if byte_size is not None else []
            given += [SHM_OFFSET] if offset is not None else []
            raise InvalidInput(
                f"{owner} has {' and '.join(given)} but no {SHM_REGION} parameter", tensor=tensor
            )
        return None
    if type(region) is not str or not region:
        raise InvalidInput(
            f"{owner}: {SHM_REGION} must be a region's name (a non-empty string); got {region!r}",
            tensor=tensor,
        )
    if byte_size is None:
        raise InvalidInput(
            f"{owner} names {SHM_REGION} {region!r} without {SHM_BYTE_SIZE}", tensor=tensor
        )
    for key, value in ((SHM_BYTE_SIZE, byte_size), (SHM_OFFSET, offset)):
        if value is not None and (type(value) is not int or value < 0):
            raise InvalidInput(
                f"{owner}: {key} must be a non-negative integer; got {value!r}", tensor=tensor
            )
    return SharedMemoryReference(region, offset or 0, byte_size)


def read_input(
    registry: SharedMemoryRegistry | None,
    reference: SharedMemoryReference,
    datatype: str,
    shape: tuple[int, ...],
    *,
    name: str,
    allowance: DecodeAllowance | None = None,
) -> npt.NDArray[Any]:
    """Input ``name``'s tensor, copied out of the region ``reference`` names and decoded.

    Its ``shared_memory_byte_size`` must be exactly what ``shape`` of ``datatype`` takes (for
    BYTES: the serialized elements, each a 4-byte length and its bytes). With ``allowance``,
    the copy is charged before it is made, and a BYTES tensor's elements before they are
    built (:class:`~corral.protocol.costs.RequestTooLarge` past the request's limit): what
    a request reads from shared memory costs the server as much as what it sends.
    """
    owner = f"input {name!r}"
    if registry is None:
        raise SharedMemoryUnsupported(
            f"{owner} is in shared memory region {reference.region!r}, but this server does not "
            f"serve system shared memory; {_TURN_ON}"
        )
    count = element_count(shape, datatype, name=name)
    if datatype != "BYTES":
        expected = count * numpy_dtype(datatype, tensor=name).itemsize
        if reference.byte_size != expected:
            raise InvalidInput(
                f"input byte size mismatch for {owner}: {datatype} of shape {list(shape)} takes "
                f"{expected} bytes; {SHM_BYTE_SIZE} is {reference.byte_size}",
                tensor=name,
            )
    if allowance is not None:
        allowance.charge(
            reference.byte_size,
            tensor=name,
            what=f"its {reference.byte_size} bytes copied out of shared memory",
        )
    raw = registry.read(reference, tensor=owner)
    return decode_tensor(raw, datatype, shape, name=name, allowance=allowance)


class OutputRegions:
    """The regions a request's outputs are to be written to, held from before the run.

    Made by :meth:`hold` (which checks every output's parameters and region first), written
    by :meth:`write` once the outputs are known, and let go by :meth:`release` (idempotent).
    A request with no output in shared memory holds nothing.
    """

    def __init__(self) -> None:
        self._destinations: dict[str, _Destination] = {}
        # The regions' holds, let go in one place; None while nothing is held, which is every
        # request that names no region: those pay for no ExitStack.
        self._holds: ExitStack | None = None

    @classmethod
    def hold(
        cls, registry: SharedMemoryRegistry | None, outputs: Sequence[RequestedOutput]
    ) -> OutputRegions:
        """Check and hold the regions ``outputs`` name; raises before holding any if one is bad."""
        held = cls()
        references = []
        for output in outputs:
            if not output.parameters:
                continue  # no region named: the common case, checked without a copy
            owner = f"output {output.name!r}"
            reference = pop_reference(dict(output.parameters), owner, tensor=output.name)
            if reference is None:
                continue
            if output.binary_data:
                raise InvalidInput(
                    f"{owner} can't set both {SHM_REGION!r} and 'binary_data'",
                    tensor=output.name,
                )
            if registry is None:
                raise SharedMemoryUnsupported(
                    f"{owner} is to go to shared memory region {reference.region!r}, but this "
                    f"server does not serve system shared memory; {_TURN_ON}"
                )
            references.append((output.name, reference))
        if not references:
            return held
        assert registry is not None  # refused above otherwise
        with ExitStack() as holds:
            for name, reference in references:
                destination = holds.enter_context(
                    registry.hold(reference, tensor=f"output {name!r}")
                )
                held._destinations[name] = destination
            held._holds = holds.pop_all()
        return held

    def __bool__(self) -> bool:
        return bool(self._destinations)

    def write(self, outputs: tuple[InferOutput, ...]) -> tuple[InferOutput, ...]:
        """Write the outputs that go to shared memory; ``outputs`` with those marked so.

        Every such output is encoded and checked against its span before any is written: one
        that does not fit raises :class:`~corral.InvalidInput` naming it and its region, and
        nothing is written.
        """
        if not self._destinations:
            return outputs
        encoded: dict[str, bytes] = {}
        for output in outputs:
            destination = self._destinations.get(output.name)
            if destination is None:
                continue
            data = encode_tensor(output.data, output.datatype)
            span = destination.reference.byte_size
            if len(data) > span:
                raise InvalidInput(
                    f"shared memory size specified with the request for output "
                    f"{output.name!r} ({span} bytes) should be at least {len(data)} bytes to "
                    f"hold the results (region {destination.reference.region!r}); nothing was "
                    "written",
                    tensor=output.name,
                )
            encoded[output.name] = data
        marked = []
        for output in outputs:
            data_written = encoded.get(output.name)
            if data_written is None:
                marked.append(output)
                continue
            destination = self._destinations[output.name]
            destination.write(data_written)
            reference = destination.reference
            parameters: Parameters = {
                **output.parameters,
                SHM_REGION: reference.region,
                SHM_OFFSET: reference.offset,
                SHM_BYTE_SIZE: len(data_written),
            }
            marked.append(replace(output, parameters=parameters))
        return tuple(marked)

    def release(self) -> None:
        """Let every held region go (closed now if it was unregistered meanwhile)."""
        self._destinations = {}
        holds, self._holds = self._holds, None
        if holds is not None:
            holds.close()


def in_shared_memory(output: InferOutput) -> bool:
    """True if ``output`` was written to shared memory: the response carries no data for it."""
    return SHM_REGION in output.parameters


def cuda_status(name: str | None) -> list[RegionStatus]:
    """CUDA shared-memory status: none can be registered, so none is listed."""
    if name:
        raise SharedMemoryNotFound(
            f"Unable to find cuda shared memory region: {name!r}; corral does not support "
            "CUDA shared memory"
        )
    return []


def cuda_shared_memory_refused() -> SharedMemoryUnsupported:
    """The refusal of a CUDA shared-memory registration."""
    return SharedMemoryUnsupported(
        "CUDA shared memory is not supported: corral runs models with onnxruntime in its own "
        "process and maps no CUDA IPC handles; use system shared memory "
        "(/v2/systemsharedmemory, SystemSharedMemoryRegister) instead"
    )
