"""A request's JSON values as the protocol reads them: the document, its tensors, their names.

The document is parsed by orjson, or, when it writes a non-finite number as Triton does
(``NaN``, ``Infinity``, ``-Infinity``), by the standard library held to orjson's rules
(:func:`load_json`). An input's ``data``, flat or nested, becomes its tensor checked value by
value for its datatype (:func:`json_tensor`, :func:`number_array`); a value that does not fit
is refused by an :class:`~corral.InvalidInput` that names it (:func:`describe`). Used by the
HTTP codec (:mod:`corral.protocol.json.codec`) and its number-array reader, so it needs
orjson, the server's extra, as they do.
"""

from __future__ import annotations

import array
import itertools
import json
import math
import re
from collections.abc import Sequence
from collections.abc import Set as AbstractSet
from typing import Any

import numpy as np
import numpy.typing as npt
import orjson

from corral._base import InvalidInput
from corral.protocol.costs import DecodeAllowance
from corral.protocol.datatypes import numpy_dtype

__all__ = [
    "FLOAT_OVERFLOW",
    "INTEGER_DATATYPES",
    "describe",
    "float_array",
    "json_kind",
    "json_tensor",
    "load_json",
    "non_finite_token",
    "number_array",
    "number_floats",
]

#: The integer datatypes, whose JSON values must be integers in range.
INTEGER_DATATYPES = frozenset(
    {"UINT8", "UINT16", "UINT32", "UINT64", "INT8", "INT16", "INT32", "INT64"}
)
#: The smallest magnitude each float datatype rounds to infinity (half an ulp past its maximum).
FLOAT_OVERFLOW = {"FP16": 65520.0, "FP32": float(2**128 - 2**103), "FP64": math.inf}
# The integers orjson reads as integers (int64 and uint64); it reads larger ones as floats.
_INT_RANGE = (-(2**63), 2**64 - 1)
# A \uD800-\uDFFF escape: only such an escape can put a lone surrogate in a parsed string.
_SURROGATE_ESCAPE = re.compile(rb"\\u[dD][89a-fA-F]")
# Up to this many values, overflow is checked in Python; beyond, by numpy after the cast.
_FEW_VALUES = 64
# The Python types of JSON numbers as orjson parses them (a boolean's type is bool, not int).
_NUMBER_KINDS = frozenset((int, float))
# How messages name the Python types orjson decodes JSON values to.
_JSON_KINDS: dict[type, str] = {
    dict: "an object",
    list: "an array",
    str: "a string",
    int: "an integer",
    float: "a number with a fraction",
    bool: "a boolean",
    type(None): "null",
}


def load_json(text: memoryview) -> Any:
    """The JSON document in ``text``, which may write non-finite numbers as Triton does.

    orjson parses every body that has none; only a body it refuses is read again by the
    standard library's parser, which also takes ``NaN``, ``Infinity`` and ``-Infinity``, and
    is held to orjson's rules otherwise: numbers that overflow a double and lone UTF-16
    surrogates are refused, integers beyond 64 bits become floats. So the three tokens are
    the only difference, and a body that is still refused gets orjson's message.
    """
    try:
        return orjson.loads(text)
    except orjson.JSONDecodeError as exc:
        refusal = exc
    try:
        document = json.loads(
            bytes(text).decode("utf-8"),
            parse_float=_json_float,
            parse_int=_json_int,
            parse_constant=float,  # called for NaN, Infinity and -Infinity only
        )
    except (ValueError, RecursionError):  # JSONDecodeError and UnicodeError are ValueErrors
        raise InvalidInput(f"the request body is not valid JSON: {refusal}") from refusal
    if _SURROGATE_ESCAPE.search(text) and _has_surrogate(document):
        raise InvalidInput(f"the request body is not valid JSON: {refusal}") from refusal
    return document


def _json_float(text: str) -> float:
    value = float(text)
    if math.isinf(value):
        raise ValueError(f"{text} is infinite as a double")  # orjson refuses it
    return value


def _json_int(text: str) -> int | float:
    value = int(text)
    if _INT_RANGE[0] <= value <= _INT_RANGE[1]:
        return value
    return _json_float(text)  # orjson reads integers beyond 64 bits as floats


def _has_surrogate(document: object) -> bool:
    """True if a string of ``document`` holds a lone surrogate, which UTF-8 cannot encode."""
    pending = [document]
    while pending:
        value = pending.pop()
        if type(value) is str:
            try:
                value.encode("utf-8")
            except UnicodeEncodeError:
                return True
        elif type(value) is list:
            pending.extend(value)
        elif type(value) is dict:
            pending.extend(value)
            pending.extend(value.values())
    return False


def json_kind(value: object) -> str:
    """How a message names the kind of a parsed JSON value: ``"an object"``, ``"null"`` ..."""
    return _JSON_KINDS.get(type(value), type(value).__name__)


def describe(value: object) -> str:
    """A parsed JSON value named in a message: its kind, and its text when it is short."""
    if type(value) is float and not math.isfinite(value):
        return f"{json_kind(value)} ({non_finite_token(value).decode()})"
    if type(value) in (int, float, bool, str):
        text = orjson.dumps(value).decode()
        return f"{json_kind(value)} ({text[:40]}{'...' if len(text) > 40 else ''})"
    return json_kind(value)


def non_finite_token(value: float) -> bytes:
    """How Triton writes a non-finite float in JSON: ``NaN``, ``Infinity`` or ``-Infinity``."""
    return b"NaN" if math.isnan(value) else b"-Infinity" if value < 0 else b"Infinity"


def json_tensor(
    data: object,
    datatype: str,
    shape: tuple[int, ...],
    count: int,
    *,
    name: str,
    allowance: DecodeAllowance | None = None,
) -> npt.NDArray[Any]:
    """A tensor from JSON ``data``, flat or nested, checked value by value for ``datatype``.

    With ``allowance``, a BYTES tensor's elements are charged once its strings are checked,
    before they are made (:class:`~corral.protocol.costs.RequestTooLarge` past the limit).
    """
    if type(data) is not list:
        raise InvalidInput(
            f'input {name!r}: "data" must be an array; got {json_kind(data)}', tensor=name
        )
    values: list[Any] = data
    if len(values) > _FEW_VALUES and len(values) == count and datatype in FLOAT_OVERFLOW:
        # The common long case first: a flat array of numbers that fit.
        floats = number_floats(values, numpy_dtype(datatype), FLOAT_OVERFLOW[datatype])
        if floats is not None:
            return floats.reshape(shape)
    kinds = set(map(type, values))
    # Flatten one nesting level at a time in C (itertools), never by recursion: orjson
    # allows 1024 levels, more than Python's default recursion limit.
    while list in kinds:
        if len(kinds) > 1:
            raise InvalidInput(
                f"input {name!r}: data mixes arrays with single values at one nesting level",
                tensor=name,
            )
        values = list(itertools.chain.from_iterable(values))
        kinds = set(map(type, values))
    if len(values) != count:
        raise InvalidInput(
            f"input {name!r}: shape {list(shape)} holds {count} elements, but data has "
            f"{len(values)}",
            tensor=name,
        )

    if datatype == "BYTES":
        _check_kinds(values, kinds, {str}, "strings", datatype, name)
        if allowance is not None:
            # The strings are parsed already (charged before the parse); their bytes are new.
            allowance.charge_bytes(name, count, 0)
        array = np.empty(count, dtype=object)
        array[:] = [value.encode("utf-8") for value in values]
        return array.reshape(shape)
    if datatype == "BOOL":
        _check_kinds(values, kinds, {bool}, "booleans (true/false)", datatype, name)
        return np.array(values, dtype=np.bool_).reshape(shape)
    return number_array(values, kinds, datatype, numpy_dtype(datatype), name).reshape(shape)


def number_array(
    values: list[Any], kinds: AbstractSet[type], datatype: str, dtype: np.dtype[Any], name: str
) -> npt.NDArray[Any]:
    """Flat ``values`` (of the Python ``kinds``) as a numeric tensor's elements, checked."""
    if datatype in INTEGER_DATATYPES:
        _check_kinds(values, kinds, {int}, "integers", datatype, name)
        if values:
            info = np.iinfo(dtype)
            for extreme in (min(values), max(values)):
                if not info.min <= extreme <= info.max:
                    raise InvalidInput(
                        f"input {name!r}: value {extreme} is out of range for {datatype} "
                        f"({info.min}..{info.max})",
                        tensor=name,
                    )
        return np.array(values, dtype=dtype)
    _check_kinds(values, kinds, {int, float}, "numbers", datatype, name)
    limit = FLOAT_OVERFLOW[datatype]
    floats = float_array(values, dtype, limit)
    if floats is None:
        too_large = next(value for value in values if limit <= abs(value) < math.inf)
        raise InvalidInput(
            f"input {name!r}: value {too_large} is out of range for {datatype}", tensor=name
        )
    return floats


def float_array(values: list[Any], dtype: np.dtype[Any], limit: float) -> npt.NDArray[Any] | None:
    """``values`` as a float array, or None if a finite one overflows ``dtype``.

    Such a value would become an infinity the client never sent; NaN and the infinities a
    client writes as ``NaN``, ``Infinity`` and ``-Infinity`` are kept as they are.
    """
    if len(values) <= _FEW_VALUES:
        # A Python scan before the cast costs less than numpy's fixed costs after it. Not
        # "max >= limit": max() may return a NaN, which fails every comparison.
        if (
            values
            and not max(map(abs, values)) < limit
            and any(limit <= abs(value) < math.inf for value in values)
        ):
            return None
        return np.array(values, dtype=dtype)
    # As doubles first: numpy casts a Python number to any float type through a double, so
    # the values are the same, and the cost too (0.41-0.45 ms for 27,648 values either way).
    return _narrowed(np.array(values, dtype=np.float64), dtype)


def number_floats(values: list[Any], dtype: np.dtype[Any], limit: float) -> npt.NDArray[Any] | None:
    """``values`` as a float array if every one is a number (int or float) that fits ``dtype``.

    None for anything else: a value of another kind (a boolean, a string, null, an array, an
    object) or a finite one that overflows; the checked way (:func:`json_tensor`) then names
    it. Equal to :func:`float_array` after a check of the values' kinds, which a long array
    skips: ``array.array`` reads the values into doubles in C, refusing every kind but
    numbers and booleans, and only the values that read as 0.0 or 1.0 can be booleans: those
    are looked at one by one when they are few, else every value's kind is (an image's white
    or black pixels may be most of its values).
    """
    if len(values) <= _FEW_VALUES:
        if not set(map(type, values)) <= _NUMBER_KINDS:
            return None
        return float_array(values, dtype, limit)
    try:
        given = np.frombuffer(array.array("d", values), dtype=np.float64)
    except (TypeError, OverflowError):
        return None  # a value that is not a number: the checked way names it
    suspects = np.flatnonzero((given == 0.0) | (given == 1.0))
    if len(suspects) * 3 < len(values):
        # Few enough to look at one by one (each costs about three values' scan).
        if len(suspects) and bool in set(map(type, map(values.__getitem__, suspects.tolist()))):
            return None
    elif bool in set(map(type, values)):  # a set: "in map(...)" compares each, slower
        return None
    return _narrowed(given, dtype)


def _narrowed(given: npt.NDArray[np.float64], dtype: np.dtype[Any]) -> npt.NDArray[Any] | None:
    # ``given`` cast to ``dtype``, or None if a finite value becomes an infinity there.
    with np.errstate(over="ignore"):
        floats = given.astype(dtype, copy=False)
    if np.isfinite(floats).all() or not (np.isinf(floats) & np.isfinite(given)).any():
        return floats
    return None


def _check_kinds(
    values: Sequence[object],
    kinds: AbstractSet[type],
    allowed: set[type],
    expected: str,
    datatype: str,
    name: str,
) -> None:
    if kinds <= allowed:
        return
    wrong = next(value for value in values if type(value) not in allowed)
    raise InvalidInput(
        f"input {name!r}: {datatype} data must hold {expected}; found {describe(wrong)}",
        tensor=name,
    )
