"""The native plain decoder against corral's own: what it accepts decodes to the same request.

Thousands of generated bodies (plain ones, near misses, mutations) go through
``corral_edge._decode_http`` and ``corral.protocol.http_codec.decode_request``. Where the native
decoder accepts a body, the Python decoder must accept it too and give the same inputs (names,
datatypes, shapes, every bit of every element), id, requested outputs and
``binary_data_output``; where it refuses, the request takes the bridge, which is always right.
"""

from __future__ import annotations

import json
import math
import random
import struct

import numpy as np
import pytest

import corral_edge
from corral_api import InvalidInput, decode_request

SEED = 20261206
CASES = 10000

_NUMERIC = {
    "UINT8": np.uint8, "UINT16": np.uint16, "UINT32": np.uint32, "UINT64": np.uint64,
    "INT8": np.int8, "INT16": np.int16, "INT32": np.int32, "INT64": np.int64,
    "FP16": np.float16, "FP32": np.float32, "FP64": np.float64,
}

_HARD_NUMBERS = [
    "0", "-0", "-0.0", "0.0", "1", "-1", "1e-400", "-1e-400", "1E400", "1e308", "1.7976931348623157e308",
    "1.7976931348623159e308", "3.4028234663852886e38", "3.4028235677973366e38",
    "3.4028235677973362e38", "3.402823567797337e38", "-3.4028235677973366e38", "3.5e38",
    "1.401298464324817e-45", "7e-46", "7.006492321624085e-46", "7.006492321624087e-46",
    "2.2250738585072014e-308", "4.9e-324", "2e-324", "9007199254740993", "9007199254740992",
    "18446744073709551615", "18446744073709551616", "-9223372036854775808",
    "-9223372036854775809", "123456789012345678901234567890", "0.1", "0.30000000000000004",
    "16777217", "16777216.5", "1.00000005960464477539", "1.0000000596046448", "1e23",
    "8.98846567431158e307", "0.000001", "1E5", "1e+5", "1e-5", "1.5E-7", "01", "1.", ".5", "+1",
    "-", "1e", "NaN", "Infinity", "-Infinity", "true", "false", "null", '"1"', "[1]", "{}",
]


def _random_number(rng: random.Random) -> str:
    kind = rng.random()
    if kind < 0.15:
        # Rare per value: a body holds several, and one bad value sends it to the bridge.
        return rng.choice(_HARD_NUMBERS) if rng.random() < 0.2 else repr(rng.random())
    if kind < 0.35:
        return repr(rng.uniform(-10, 10))
    if kind < 0.5:
        return str(rng.randint(-(2**70), 2**70)) if rng.random() < 0.3 else str(rng.randint(-1000, 1000))
    if kind < 0.7:
        mantissa = rng.uniform(1, 10) * rng.choice([1, -1])
        return f"{mantissa:.{rng.randint(1, 20)}g}e{rng.randint(-330, 330)}"
    if kind < 0.85:
        return repr(float(np.float32(rng.uniform(-1e6, 1e6))))
    bits = rng.getrandbits(64)
    value = struct.unpack("<d", struct.pack("<Q", bits))[0]
    return repr(value) if math.isfinite(value) else "1.5"


def _name(rng: random.Random) -> str:
    return rng.choice(["X", "input", "x y", "é", "\u2028", "a\"b", "\\", "\x01", "😀", "INPUT__0", ""])


def _json_string(rng: random.Random, text: str) -> str:
    encoded = json.dumps(text, ensure_ascii=rng.random() < 0.5)
    if rng.random() < 0.05:
        encoded = encoded[:-1] + "\\ud800\""  # a lone surrogate
    return encoded


def _json_body(rng: random.Random) -> tuple[bytes, list[tuple[bytes, bytes]]]:
    inputs = []
    for index in range(rng.choice([1, 1, 1, 2, 3])):
        shape = [rng.choice([1, 1, 2, 3, 4]) for _ in range(rng.choice([1, 2, 2, 3]))]
        if rng.random() < 0.03:
            shape = rng.choice([[0], [-1], [2.0], [], [1] * 40, [2**63]])
        count = math.prod(shape) if all(isinstance(d, int) and d >= 0 for d in shape) else 1
        count = count if count < 100 else 3
        if rng.random() < 0.05:
            count += rng.choice([-1, 1])
        data = [_random_number(rng) for _ in range(max(count, 0))]
        datatype = rng.choice(["FP32", "FP32", "FP64", "FP16", "INT32", "BOOL", "FP3\\u0032"])
        name = _name(rng) if index == 0 or rng.random() < 0.2 else f"in{index}"
        members = [
            f'"name":{_json_string(rng, name)}',
            f'"datatype":"{datatype}"',
            f'"shape":{json.dumps(shape)}',
            f'"data":[{",".join(data)}]',
        ]
        if rng.random() < 0.03:
            members.append('"parameters":{}')
        if rng.random() < 0.02:
            members.append(rng.choice(members))
        rng.shuffle(members) if rng.random() < 0.3 else None
        inputs.append("{" + ",".join(members) + "}")
    top = [f'"inputs":[{",".join(inputs)}]']
    if rng.random() < 0.4:
        top.append(f'"id":{_json_string(rng, rng.choice(["1", "req-7", "", "é", "x" * 50]))}')
    if rng.random() < 0.05:
        top.append('"id":null')
    if rng.random() < 0.2:
        top.append(_outputs(rng))
    if rng.random() < 0.15:
        top.append(rng.choice([
            '"parameters":{"binary_data_output":true}', '"parameters":{"binary_data_output":false}',
            '"parameters":{}', '"parameters":{"timeout":5}', '"parameters":{"binary_data_output":1}',
        ]))
    if rng.random() < 0.3:
        rng.shuffle(top)
    space = rng.choice(["", " ", "\n", "\t", "\r\n  "])
    text = "{" + space + ("," + space).join(top) + space + "}" + rng.choice(["", "", " ", "\n", "x", ",{}"][: 4 if rng.random() < 0.95 else 6])
    return text.encode(), []


def _outputs(rng: random.Random) -> str:
    entries = []
    for index in range(rng.choice([0, 1, 2])):
        members = [f'"name":"{rng.choice(["y", "z", "out"]) if index == 0 else f"o{index}"}"']
        roll = rng.random()
        if roll < 0.3:
            members.append(f'"parameters":{{"binary_data":{rng.choice(["true", "false"])}}}')
        elif roll < 0.35:
            members.append(rng.choice(['"parameters":{}', '"parameters":{"binary_data":1}',
                                       '"parameters":{"classification":2}']))
        entries.append("{" + ",".join(members) + "}")
    if rng.random() < 0.05 and entries:
        entries.append(entries[0])
    return f'"outputs":[{",".join(entries)}]'


def _binary_body(rng: random.Random) -> tuple[bytes, list[tuple[bytes, bytes]]]:
    inputs = []
    blobs = []
    for index in range(rng.choice([1, 1, 2, 3])):
        datatype = rng.choice(list(_NUMERIC) + ["BOOL", "BYTES"])
        itemsize = np.dtype(_NUMERIC[datatype]).itemsize if datatype in _NUMERIC else 1
        shape = [rng.choice([0, 1, 2, 3, 5]) if rng.random() < 0.1 else rng.choice([1, 2, 3, 5])
                 for _ in range(rng.choice([1, 2, 3]))]
        size = math.prod(shape) * itemsize
        if rng.random() < 0.05:
            size += rng.choice([-1, 1, itemsize])
        size = max(size, 0)
        parameters = f'{{"binary_data_size":{size}}}'
        if rng.random() < 0.03:
            parameters = rng.choice(['{"binary_data_size":-1}', '{"binary_data_size":1.0}', '{}',
                                     '{"binary_data_size":4,"x":1}'])
        inputs.append(
            f'{{"name":"{"in" + str(index)}","datatype":"{datatype}","shape":{json.dumps(shape)},'
            f'"parameters":{parameters}}}'
        )
        blobs.append(rng.randbytes(size))
    top = [f'"inputs":[{",".join(inputs)}]']
    if rng.random() < 0.3:
        top.append(rng.choice(['"parameters":{"binary_data_output":true}', '"parameters":{}',
                               '"parameters":{"binary_data_output":"yes"}']))
    if rng.random() < 0.3:
        top.append(_outputs(rng))
    if rng.random() < 0.3:
        top.append('"id":"b1"')
    rng.shuffle(top)
    header = ("{" + ",".join(top) + "}").encode()
    header += b" " * rng.choice([0, 0, 1, 3])  # misaligns what follows, sometimes
    body = header + b"".join(blobs)
    if rng.random() < 0.03:
        body += b"\x00"
    length = len(header)
    if rng.random() < 0.03:
        length += rng.choice([-1, 1, 10**6])
    return body, [(b"inference-header-content-length", str(length).encode())]


def _mutate(rng: random.Random, body: bytes) -> bytes:
    data = bytearray(body)
    for _ in range(rng.choice([1, 1, 2, 4])):
        if not data:
            break
        at = rng.randrange(len(data))
        roll = rng.random()
        if roll < 0.4:
            data[at] = rng.randrange(256)
        elif roll < 0.7:
            del data[at]
        else:
            data.insert(at, rng.choice(b'{}[],:"\\ -.eE0123456789tfn\xff'))
    return bytes(data)


def _header_length(headers: list[tuple[bytes, bytes]]) -> int | None:
    for key, value in headers:
        if key == b"inference-header-content-length":
            return int(value)
    return None


def _python(body: bytes, headers: list[tuple[bytes, bytes]]):
    try:
        return decode_request(body, _header_length(headers))
    except InvalidInput:
        return None


def _check(body: bytes, headers: list[tuple[bytes, bytes]]) -> bool:
    native = corral_edge._decode_http(headers, body)
    if native is None:
        return False
    python = _python(body, headers)
    assert python is not None, f"native accepted what corral refuses: {body[:300]!r}"
    assert native["id"] == python.id
    assert len(native["inputs"]) == len(python.inputs)
    for (name, datatype, shape, data), expected in zip(native["inputs"], python.inputs, strict=True):
        assert (name, datatype, shape) == (expected.name, expected.datatype, tuple(expected.shape))
        assert expected.parameters == {}
        array = np.frombuffer(data, dtype=np.dtype(_NUMERIC[datatype]).newbyteorder("<"))
        want = np.ascontiguousarray(expected.data).reshape(-1)
        assert array.dtype.itemsize == want.dtype.itemsize and array.size == want.size
        assert array.tobytes() == want.astype(want.dtype.newbyteorder("<")).tobytes(), (body[:300], array, want)
    assert native["outputs"] == [(o.name, o.binary_data) for o in python.outputs]
    assert all(o.parameters == {} for o in python.outputs)
    assert set(python.parameters) <= {"binary_data_output"}
    assert native["binary_data_output"] == (python.parameters.get("binary_data_output") is True)
    return True


@pytest.mark.parametrize("kind", ["json", "binary"])
def test_native_decoder_agrees_with_corral(kind: str) -> None:
    rng = random.Random(f"{SEED}-{kind}")
    accepted = 0
    for case in range(CASES):
        body, headers = _json_body(rng) if kind == "json" else _binary_body(rng)
        if case % 4 == 3:
            body = _mutate(rng, body)
        accepted += _check(body, headers)
    # The generator makes mostly plain bodies: a decoder refusing them all proves nothing.
    assert accepted > CASES // 10, accepted


def test_plain_tritonclient_bodies() -> None:
    import tritonclient.http as httpclient

    for binary in (False, True):
        x = httpclient.InferInput("X", [2, 4], "FP32")
        x.set_data_from_numpy(np.arange(8, dtype=np.float32).reshape(2, 4) / 7, binary_data=binary)
        outputs = [httpclient.InferRequestedOutput("Y", binary_data=binary)]
        body, json_size = httpclient.InferenceServerClient.generate_request_body(
            [x], outputs=outputs, request_id="r1"
        )
        headers = [] if json_size is None else [(b"inference-header-content-length", str(json_size).encode())]
        assert _check(body, headers)
