"""The Open Inference Protocol (KServe v2): its types, codecs and one transport-agnostic data plane.

The data plane (:class:`DataPlane`) serves by model control's rules (:class:`ModelControl`:
Triton's repository API and explicit model control).

Imports only numpy and corral's core; the HTTP and gRPC servers in ``corral.server`` build on it.
Their codecs live here too but are imported only by them, since each needs its server's extra:
``json/`` (orjson) and ``grpc_codec`` (protobuf, with the generated ``proto`` package).
"""

from corral.protocol.dataplane import EXTENSIONS, DataPlane
from corral.protocol.datatypes import DATATYPES, datatype_of, numpy_dtype
from corral.protocol.metadata import PLATFORM
from corral.protocol.model_control import ModelControl
from corral.protocol.types import (
    BatchStatistics,
    Duration,
    InferInput,
    InferOutput,
    InferRequest,
    InferResponse,
    ModelConfiguration,
    ModelMetadata,
    ModelStatistics,
    RepositoryModel,
    RequestedOutput,
    ServerMetadata,
    TensorConfiguration,
    TensorMetadata,
)

__all__ = [
    "DATATYPES",
    "EXTENSIONS",
    "PLATFORM",
    "BatchStatistics",
    "DataPlane",
    "Duration",
    "InferInput",
    "InferOutput",
    "InferRequest",
    "InferResponse",
    "ModelConfiguration",
    "ModelControl",
    "ModelMetadata",
    "ModelStatistics",
    "RepositoryModel",
    "RequestedOutput",
    "ServerMetadata",
    "TensorConfiguration",
    "TensorMetadata",
    "datatype_of",
    "numpy_dtype",
]
