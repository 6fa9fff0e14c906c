"""A long JSON array of numbers becomes its float tensor without a Python check per value.

``_json_values.number_floats`` reads a long array into doubles with ``array.array``, which
refuses every kind of value but numbers and booleans, and looks for booleans only among the
values that read as 0.0 or 1.0. These tests hold it equal, bit for bit, to the checked way it
replaces (the values' kinds checked, then the cast), on long and short arrays with a
value of every other kind slipped in, and check that a request holding such a value is still
refused by name.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import corral
from corral.protocol.datatypes import numpy_dtype
from corral.protocol.json import values as _json_values
from corral.protocol.json.values import FLOAT_OVERFLOW, json_tensor, number_floats

FUZZ = settings(max_examples=300, deadline=None, database=None)
FLOAT_DATATYPES = ["FP16", "FP32", "FP64"]

# What orjson (or the NaN-tolerant fallback parser) gives for a JSON number: a float, maybe
# non-finite, or an integer within int64 / uint64. Values at the datatypes' edges and the
# values a boolean reads as are drawn often.
numbers = st.one_of(
    st.floats(width=64),
    st.integers(min_value=-(2**63), max_value=2**64 - 1),
    st.sampled_from([0.0, -0.0, 1.0, 0, 1, 65504.0, 65520.0, 3.4e38, 3.5e38, -3.5e38, 1e308]),
)
# Every other kind orjson gives, booleans first: they are the ones array.array takes.
others = st.sampled_from([True, False, None, "1", "", [1.0], [], {}, {"a": 1}])


def _checked(values: list[Any], datatype: str) -> np.ndarray | None:
    """The checked way, written out: every value's kind, then each value's size, then the cast.

    Not float_array, which shares its cast with the code under test.
    """
    if not set(map(type, values)) <= {int, float}:
        return None
    limit = FLOAT_OVERFLOW[datatype]
    if any(limit <= abs(value) < math.inf for value in values):
        return None
    with np.errstate(over="ignore"):
        return np.array(values, dtype=numpy_dtype(datatype))


@st.composite
def arrays(draw: st.DrawFn) -> list[Any]:
    """1-64 numbers (the short way) or 65-300 (the long way), in half of them other values too."""
    long = draw(st.booleans())
    values = draw(st.lists(numbers, min_size=65 if long else 1, max_size=300 if long else 64))
    if draw(st.booleans()):
        for _ in range(draw(st.integers(1, 3))):
            values.insert(draw(st.integers(0, len(values))), draw(others))
    return values


@FUZZ
@given(values=arrays(), datatype=st.sampled_from(FLOAT_DATATYPES))
def test_the_array_is_what_the_checked_way_gives(values: list[Any], datatype: str):
    fast = number_floats(values, numpy_dtype(datatype), FLOAT_OVERFLOW[datatype])
    checked = _checked(values, datatype)
    if checked is None:
        assert fast is None
        return
    assert fast is not None
    assert fast.dtype == checked.dtype
    assert fast.shape == checked.shape
    assert fast.tobytes() == checked.tobytes()  # bit for bit: NaNs and signed zeros too


@pytest.mark.parametrize("odd", [True, False])
@pytest.mark.parametrize("filler", [0.0, 1.0, 0.5])
def test_a_boolean_among_zeros_and_ones_is_found(odd: bool, filler: float):
    values: list[Any] = [filler] * 500
    values[377] = odd
    assert number_floats(values, np.dtype(np.float32), FLOAT_OVERFLOW["FP32"]) is None
    assert number_floats([0, 1] * 250, np.dtype(np.float32), FLOAT_OVERFLOW["FP32"]) is not None


def test_a_long_array_does_not_take_the_checked_cast(monkeypatch: pytest.MonkeyPatch):
    # Else the equality above would prove nothing about the long way.
    def refuse(*args: object) -> None:
        raise AssertionError("float_array called for a long array")

    monkeypatch.setattr(_json_values, "float_array", refuse)
    values = [0.25 * index for index in range(1000)]
    floats = number_floats(values, np.dtype(np.float32), FLOAT_OVERFLOW["FP32"])
    assert floats is not None
    assert floats.tolist() == values


@pytest.mark.parametrize(
    ("odd", "message"),
    [
        (True, "FP32 data must hold numbers; found a boolean (true)"),
        (False, "FP32 data must hold numbers; found a boolean (false)"),
        (None, "FP32 data must hold numbers; found null"),
        ("2", 'FP32 data must hold numbers; found a string ("2")'),
        ({}, "FP32 data must hold numbers; found an object"),
        (3.5e38, "value 3.5e+38 is out of range for FP32"),
    ],
)
def test_a_long_array_with_one_wrong_value_is_refused_naming_it(odd: object, message: str):
    values: list[Any] = [0.0, 1.0, 0.5] * 100
    values[211] = odd
    with pytest.raises(corral.InvalidInput) as caught:
        json_tensor(values, "FP32", (3, 100), 300, name="x")
    assert message in str(caught.value)
    assert caught.value.tensor == "x"


def test_non_finite_values_a_client_sent_are_kept():
    values = [float("nan"), float("inf"), float("-inf")] + [2.0] * 100
    tensor = json_tensor(values, "FP16", (103,), 103, name="x")
    assert tensor.dtype == np.float16
    assert np.isnan(tensor[0])
    assert tensor[1:3].tolist() == [float("inf"), float("-inf")]
    assert (tensor[3:] == 2.0).all()
