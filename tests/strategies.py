"""Hypothesis strategies shared by the fuzz tests: JSON values, v2 request bodies, paths.

``tests/protocol/test_protocol_fuzz.py`` fuzzes the codec with them,
``tests/server/http/test_server_http_fuzz.py`` the HTTP endpoints, and
``tests/reliability/test_bad_input.py`` both transports at volume.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import orjson
from hypothesis import strategies as st

from corral.protocol import DATATYPES
from corral.protocol.datatypes import numpy_dtype

# Integers as orjson writes them (at most 64 bits) and floats JSON can carry.
json_scalars = (
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**63), max_value=2**64 - 1)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=8)
)
json_values = st.recursive(
    json_scalars,
    lambda children: (
        st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=8), children, max_size=4)
    ),
    max_leaves=16,
)

# Values near every datatype's limits, so that range checks meet their edges.
_EDGE_INTEGERS = [0, 1, -1, 127, 128, 255, 256, -129, 65535, 65536, 2**31, 2**32, -(2**63)]
_EDGE_FLOATS = [0.5, -0.0, 1e-45, 65504.0, 65520.0, 3.4e38, 3.5e38, 1e308]
edge_numbers = st.sampled_from([*_EDGE_INTEGERS, 2**63 - 1, 2**63, 2**64 - 1, *_EDGE_FLOATS])
tensor_data = st.recursive(
    edge_numbers | json_scalars,
    lambda children: st.lists(children, max_size=4),
    max_leaves=12,
)
input_objects = st.fixed_dictionaries(
    {},
    optional={
        "name": st.sampled_from(["a", "b"]) | json_values,
        "datatype": st.sampled_from([*sorted(DATATYPES), "BF16"]) | json_values,
        "shape": st.lists(st.integers(-1, 4), max_size=3) | json_values,
        "data": tensor_data | json_values,
        "parameters": st.fixed_dictionaries(
            {}, optional={"binary_data_size": st.integers(-1, 40) | json_values}
        )
        | json_values,
    },
)
output_objects = st.fixed_dictionaries(
    {},
    optional={
        "name": st.sampled_from(["y", "z"]) | json_values,
        "parameters": st.dictionaries(st.sampled_from(["binary_data", "p"]), json_values)
        | json_values,
    },
)
request_objects = st.fixed_dictionaries(
    {"inputs": st.lists(input_objects, max_size=3) | json_values},
    optional={
        "id": st.text(max_size=4) | json_values,
        "parameters": st.dictionaries(
            st.sampled_from(["binary_data_output", "timeout", "p"]), json_values
        )
        | json_values,
        "outputs": st.lists(output_objects, max_size=3) | json_values,
    },
)

#: Dimensions far past what memory holds: a declared shape must never be allocated.
HUGE_DIMS = (10**6, 10**12, 2**31, 2**62, 2**63 - 1)


@st.composite
def plausible_requests(
    draw: st.DrawFn,
    *,
    names: Sequence[str] = ("a", "b", "c"),
    outputs: Sequence[str] = ("y", "z"),
    datatypes: Sequence[str] = tuple(sorted(DATATYPES)),
    huge: bool = False,
) -> tuple[bytes, int | None]:
    """Requests that are nearly right: counts that fit the shape, sizes near the true ones.

    Arbitrary JSON seldom gets past the first checks; these reach the value, range and
    binary-size checks, and sometimes decode. ``names``, ``outputs`` and ``datatypes`` aim
    them at a model's own tensors; with ``huge`` a shape sometimes declares far more
    elements than the body carries (:data:`HUGE_DIMS`).
    """
    inputs: list[dict[str, Any]] = []
    tail = b""
    for _ in range(draw(st.integers(1, 3))):
        datatype = draw(st.sampled_from(sorted(datatypes)))
        shape = draw(st.lists(st.integers(0, 3), max_size=3))
        entry: dict[str, Any] = {
            "name": draw(st.sampled_from(sorted(names))),
            "datatype": datatype,
            "shape": shape,
        }
        if huge and draw(st.integers(0, 3)) == 0:
            # Declared, not carried: the data below is sized for the shape before this.
            entry["shape"] = [*shape, draw(st.sampled_from(HUGE_DIMS))]
        count = math.prod(shape)
        if draw(st.booleans()):
            itemsize = numpy_dtype(datatype).itemsize if datatype != "BYTES" else 5
            size = max(0, count * itemsize + draw(st.sampled_from([0, 0, 0, -1, 1])))
            if datatype == "BYTES" and draw(st.booleans()):
                chunk = b"".join(len(x).to_bytes(4, "little") + x for x in [b"x"] * count)
            else:
                chunk = draw(st.binary(min_size=size, max_size=size))
            entry["parameters"] = {"binary_data_size": len(chunk)}
            tail += chunk
        else:
            element = draw(
                st.sampled_from([edge_numbers, st.booleans(), st.text(max_size=3), json_scalars])
            )
            data: list[Any] = draw(st.lists(element, min_size=count, max_size=count))
            for dim in reversed(shape[1:] if draw(st.booleans()) else []):
                if dim:
                    data = [data[i : i + dim] for i in range(0, len(data), dim)]
            entry["data"] = data
        inputs.append(entry)
    document: dict[str, Any] = {"inputs": inputs}
    if draw(st.booleans()):
        document["outputs"] = [
            {"name": name} for name in draw(st.lists(st.sampled_from(sorted(outputs))))
        ]
    header = orjson.dumps(document)
    if not tail and draw(st.booleans()):
        return header, None
    return header + tail, len(header) + draw(st.sampled_from([0, 0, 0, -1, 1]))


# -- the HTTP endpoints --------------------------------------------------------------------

# Any JSON, floats included (orjson writes NaN and infinities as null).
any_json = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-(2**63), 2**63 - 1)
    | st.floats()
    | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner),
    max_leaves=12,
)
# Bodies that look like inference requests, wrong in some detail or other.
tensor_objects = st.fixed_dictionaries(
    {
        "name": st.sampled_from(["X", "Y", ""]) | st.integers(-5, 5),
        "datatype": st.sampled_from(["FP32", "INT64", "BYTES", "BOOL", "FP17"]) | st.none(),
        "shape": st.lists(st.integers(-2, 5), max_size=3) | any_json,
    },
    optional={
        "data": any_json,
        "parameters": st.dictionaries(st.just("binary_data_size"), any_json),
    },
)
request_bodies = st.fixed_dictionaries(
    {"inputs": st.lists(tensor_objects, max_size=3) | any_json},
    optional={"outputs": any_json, "parameters": any_json, "id": any_json},
)
http_bodies = (
    st.binary(max_size=300) | any_json.map(orjson.dumps) | request_bodies.map(orjson.dumps)
)
http_paths = st.sampled_from(
    [
        "/v2/models/mlp/infer",
        "/v2/models/mlp/versions/1/infer",
        "/v2/models/nope/infer",
        "/v2/repository/index",
        "/v2/repository/models/nope/load",
    ]
) | st.text(alphabet="abcv2/.%_-", max_size=30).map(lambda tail: f"/v2/{tail}")
header_lengths = st.none() | st.integers(-3, 400).map(str) | st.text(max_size=4)
