"""The native gRPC plain check against corral's ``grpc_codec.decode_request``."""

from __future__ import annotations

import random

import numpy as np

import corral_edge
from corral_api import InvalidInput, grpc_decode_request, pb

_DTYPES = {"UINT8": 1, "UINT16": 2, "UINT32": 4, "UINT64": 8, "INT8": 1, "INT16": 2,
           "INT32": 4, "INT64": 8, "FP16": 2, "FP32": 4, "FP64": 8, "BOOL": 1, "BYTES": 1}


def _message(rng: random.Random) -> bytes:
    request = pb.ModelInferRequest(model_name=rng.choice(["m", "tiny", ""]),
                                   model_version=rng.choice(["", "1"]), id=rng.choice(["", "r"]))
    for index in range(rng.choice([0, 1, 1, 2])):
        datatype = rng.choice(list(_DTYPES))
        shape = [rng.choice([0, 1, 2, 3]) if rng.random() < 0.1 else rng.choice([1, 2, 3])
                 for _ in range(rng.choice([0, 1, 2]))]
        if rng.random() < 0.05:
            shape = [-1]
        tensor = request.inputs.add(name=rng.choice(["X", "X", f"in{index}"]), datatype=datatype, shape=shape)
        if rng.random() < 0.05:
            tensor.parameters["binary_data_size"].int64_param = 4
        if rng.random() < 0.05:
            tensor.contents.fp32_contents.append(1.0)
        size = int(np.prod(shape)) * _DTYPES[datatype] if all(d >= 0 for d in shape) else 4
        if rng.random() < 0.05:
            size += 1
        request.raw_input_contents.append(rng.randbytes(size))
    if rng.random() < 0.1:
        request.raw_input_contents.append(b"")
    if rng.random() < 0.2:
        output = request.outputs.add(name="Y")
        if rng.random() < 0.3:
            output.parameters["binary_data"].bool_param = True
    if rng.random() < 0.1:
        request.parameters["timeout"].int64_param = 5
    data = request.SerializeToString()
    if rng.random() < 0.1 and data:
        raw = bytearray(data)
        raw[rng.randrange(len(raw))] = rng.randrange(256)
        data = bytes(raw)
    return data


def test_plain_grpc_calls_agree() -> None:
    rng = random.Random(5)
    accepted = 0
    for _ in range(10000):
        data = _message(rng)
        native = corral_edge._decode_grpc(data)
        if native is None:
            continue
        accepted += 1
        message = pb.ModelInferRequest.FromString(data)
        try:
            expected = grpc_decode_request(message)
        except InvalidInput:
            raise AssertionError(f"native accepted what corral refuses: {message}") from None
        assert native["model"] == message.model_name
        assert native["version"] == (message.model_version or None)
        assert native["id"] == expected.id
        assert native["outputs"] == [(o.name, None) for o in expected.outputs]
        assert expected.parameters == {}
        for (name, datatype, shape, raw), tensor in zip(native["inputs"], expected.inputs, strict=True):
            assert (name, datatype, shape) == (tensor.name, tensor.datatype, tensor.shape)
            assert raw == np.ascontiguousarray(tensor.data).tobytes()
    assert accepted > 1000, accepted
