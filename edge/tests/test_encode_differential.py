"""The native encoders against corral's: the same answer, byte for byte.

Generated outputs (every numeric datatype and BOOL, random shapes, float specials, ids,
versions, binary and JSON outputs as requested) go through ``corral_edge._encode_http`` and
``corral.protocol...encode_response``, and through ``corral_edge._encode_grpc`` and
``grpc_codec.serialize_response``.
"""

from __future__ import annotations

import math
import random

import numpy as np

import corral_edge
from corral_api import encode_response, serialize_response, types

SEED = 7
CASES = 3000
_DTYPES = {
    "BOOL": np.bool_, "UINT8": np.uint8, "UINT16": np.uint16, "UINT32": np.uint32,
    "UINT64": np.uint64, "INT8": np.int8, "INT16": np.int16, "INT32": np.int32,
    "INT64": np.int64, "FP16": np.float16, "FP32": np.float32, "FP64": np.float64,
}
_SPECIALS = [0.0, -0.0, math.nan, -math.nan, math.inf, -math.inf, 1e-45, 5e-324, 3.4028235e38,
             1.7976931348623157e308, 65504.0, 6e-8, 1e16, 1e15, 1e13, 1e-5, 1e-6, 1e-7, 0.1]


def _array(rng: random.Random, datatype: str, shape: tuple[int, ...]) -> np.ndarray:
    dtype = np.dtype(_DTYPES[datatype])
    count = math.prod(shape)
    if datatype == "BOOL":
        return np.array([rng.random() < 0.5 for _ in range(count)], dtype=dtype).reshape(shape)
    if dtype.kind in "iu":
        info = np.iinfo(dtype)
        values = [rng.choice([info.min, info.max, 0, rng.randint(int(info.min), int(info.max))])
                  for _ in range(count)]
        return np.array(values, dtype=dtype).reshape(shape)
    values = []
    for _ in range(count):
        roll = rng.random()
        if roll < 0.2:
            values.append(rng.choice(_SPECIALS))
        elif roll < 0.5:
            values.append(rng.uniform(-1, 1) * 10 ** rng.randint(-30, 30))
        else:
            bits = rng.getrandbits(dtype.itemsize * 8)
            values.append(np.frombuffer(bits.to_bytes(dtype.itemsize, "little"), dtype=dtype)[0])
    with np.errstate(over="ignore"):
        return np.array(values, dtype=dtype).reshape(shape)


def _case(rng: random.Random):
    outputs = []
    for index in range(rng.choice([1, 1, 2, 3])):
        datatype = rng.choice(list(_DTYPES))
        shape = tuple(rng.choice([0, 1, 2, 3, 4]) if rng.random() < 0.05 else rng.choice([1, 2, 3, 4])
                      for _ in range(rng.choice([0, 1, 2, 3])))
        name = rng.choice(["Y", "out", "é", "a\"b\\c", "\x01\n", f"o{index}"]) + str(index)
        array = _array(rng, datatype, shape)
        if len(shape) > 1 and rng.random() < 0.2:
            array = array.T  # not C-contiguous: written row-major all the same
            shape = array.shape
        outputs.append((name, datatype, shape, array))
    requested = []
    for name, *_ in outputs:
        if rng.random() < 0.3:
            requested.append((name, rng.choice([None, True, False])))
    rng.shuffle(requested)
    binary_default = rng.random() < 0.3
    model = rng.choice(["m", "fraud", "é"])
    version = rng.choice([None, "1", "12"])
    request_id = rng.choice([None, "r1", "", "x\"y"])
    return outputs, requested, binary_default, model, version, request_id


def test_http_answers_are_corrals() -> None:
    rng = random.Random(SEED)
    for _ in range(CASES):
        outputs, requested, binary_default, model, version, request_id = _case(rng)
        native = corral_edge._encode_http(model, version, request_id, outputs, requested, binary_default)
        request = types.InferRequest(
            inputs=(),
            outputs=tuple(types.RequestedOutput(name, binary) for name, binary in requested),
            id=request_id,
            parameters={"binary_data_output": True} if binary_default else {},
        )
        response = types.InferResponse(
            model_name=model,
            model_version=version,
            outputs=tuple(types.InferOutput(n, d, s, a) for n, d, s, a in outputs),
            id=request_id,
        )
        expected = encode_response(response, request)
        assert native == expected, (outputs, requested, binary_default)


def test_grpc_answers_are_corrals() -> None:
    rng = random.Random(SEED + 1)
    for _ in range(CASES):
        outputs, _, _, model, version, request_id = _case(rng)
        native = corral_edge._encode_grpc(model, version, request_id, outputs)
        response = types.InferResponse(
            model_name=model,
            model_version=version,
            outputs=tuple(types.InferOutput(n, d, s, a) for n, d, s, a in outputs),
            id=request_id,
        )
        assert native == serialize_response(response), outputs
