"""Long JSON arrays of numbers, cut out of a request's text and read piece by piece.

Parsed whole, a JSON array of numbers costs about 40 bytes a number as Python objects (a
float and its list slots), up to 15 times its text. So a long ``data`` array that holds only
numbers (flat, or nested with every number at one depth) is found by scanning its brackets,
cut out of the document before the document is parsed, and read a piece at a time straight
into its numpy array (:class:`NumberArrays`). Anything the scan doubts is left in the
document, whose parse decides. Used only by :mod:`corral.protocol.json.codec`, which holds
the two ways equal (``tests/protocol/json/test_protocol_number_arrays.py``); it needs orjson as that
does.
"""

from __future__ import annotations

import re
import secrets
from collections.abc import Iterator
from typing import Any

import numpy as np
import numpy.typing as npt
import orjson

from corral._base import InvalidInput
from corral.protocol.datatypes import numpy_dtype
from corral.protocol.json.values import (
    FLOAT_OVERFLOW,
    INTEGER_DATATYPES,
    json_tensor,
    load_json,
    number_array,
)

__all__ = ["NumberArrays", "may_hold_long_array"]

# A "data" array is read straight into numpy (not as Python numbers) when its text is at least
# this long and holds only numbers, commas, spaces and brackets, every number at one depth and
# no array empty; anything else (NaN, strings, booleans, ragged nesting) is parsed with the
# document. Shorter arrays are parsed whole, which is faster (a 0.5 MB body of 27,648 floats,
# nested: 5.3 against 8.5 ms cut; flat 4.6 against 6.0; medians, 2026-12-02) and costs at most
# ~15 x 1 MiB while one decodes, on one of the few threads that decode bodies past
# DECODE_INLINE_BYTES.
_DATA_ARRAY = re.compile(rb'"data"\s*:\s*\[')
_LONG_ARRAY_BYTES = 1024 * 1024
_NO_BRACKETS = bytes.maketrans(b"[]", b"  ")
# The bytes such an array is made of.
_NUMBER_TEXT = b"0123456789+-.eE"
_WHITESPACE_TEXT = b" \t\n\r"
_SEPARATOR_TEXT = b"," + _WHITESPACE_TEXT
# Its text as the scan reads it: whitespace deleted, a number's bytes "n", commas and brackets
# as they are, any other byte "x".
_SCAN_TABLE = bytes(
    ord("n") if byte in _NUMBER_TEXT else byte if byte in b",[]" else ord("x")
    for byte in range(256)
)
_N, _COMMA, _OPEN, _CLOSE = b"n"[0], b","[0], b"["[0], b"]"[0]
# The Python types orjson gives such text.
_NUMBER_KINDS = frozenset({int, float})
# Such an array is parsed this many bytes at a time: the Python numbers of one piece are all
# that exist at once, and a worker thread decoding it gives up the GIL between pieces.
_PIECE_BYTES = 64 * 1024


def may_hold_long_array(json_length: int) -> bool:
    """True if ``json_length`` bytes of JSON are enough to hold an array worth cutting out.

    Below that, the whole document is parsed at once: no array of it is cut.
    """
    return json_length >= _LONG_ARRAY_BYTES


class NumberArrays:
    """The long ``data`` arrays of numbers cut out of a request's JSON text.

    :attr:`skeleton` is the JSON with each such array replaced by a string naming it (a
    random prefix per request, so a client cannot name one); an input whose ``data`` is such
    a string has its tensor read from the body's text by :meth:`tensor`, a piece at a time.
    An array cut from anywhere but an input's ``data`` stays :attr:`unclaimed`.
    """

    def __init__(
        self, body: bytes, skeleton: bytes, spans: dict[str, tuple[int, int, bool]]
    ) -> None:
        self._body = body
        self.skeleton = skeleton
        self._spans = spans

    @classmethod
    def cut(cls, body: bytes, json_length: int) -> NumberArrays | None:
        """The arrays of ``body[:json_length]`` worth reading this way, or None if none is."""
        if not may_hold_long_array(json_length):
            return None
        prefix = f"corral-data-{secrets.token_hex(8)}-"
        parts: list[bytes] = []
        spans: dict[str, tuple[int, int, bool]] = {}
        copied = 0
        for match in _DATA_ARRAY.finditer(body, 0, json_length):
            start = match.end()
            found = _number_array_end(body, start, json_length) if start >= copied else None
            if found is None or found[0] - start < _LONG_ARRAY_BYTES:
                continue
            end, nested = found
            key = f"{prefix}{len(spans)}"
            spans[key] = (start, end, nested)
            parts += (body[copied : start - 1], b'"', key.encode(), b'"')
            copied = end + 1
        if not spans:
            return None
        parts.append(body[copied:json_length])
        return cls(body, b"".join(parts), spans)

    @property
    def unclaimed(self) -> int:
        """How many arrays no input's ``data`` claimed."""
        return len(self._spans)

    def claims(self, data: object) -> bool:
        """True if ``data`` is the string that stands for a cut array."""
        return type(data) is str and data in self._spans

    def tensor(
        self, key: str, datatype: str, shape: tuple[int, ...], count: int, *, name: str
    ) -> npt.NDArray[Any]:
        """The array named ``key`` as a tensor, checked as :func:`json_tensor` checks data."""
        start, end, nested = self._spans.pop(key)
        if datatype not in FLOAT_OVERFLOW and datatype not in INTEGER_DATATYPES:
            # BOOL or BYTES given numbers: refused by the usual checks, with their message.
            return json_tensor(
                load_json(memoryview(self._body)[start - 1 : end + 1]),
                datatype,
                shape,
                count,
                name=name,
            )
        dtype = numpy_dtype(datatype)
        floats = datatype in FLOAT_OVERFLOW
        tensor = np.empty(count, dtype=dtype)
        given = 0
        for text in _pieces(self._body, start, end):
            # Every number is at one depth and no array is empty: the numbers in order are
            # the tensor's elements, row-major, as the document's flattening would give.
            piece = text.translate(_NO_BRACKETS) if nested else text
            try:
                values = orjson.loads(b"[" + piece + b"]")
            except orjson.JSONDecodeError as exc:
                raise InvalidInput(
                    f'input {name!r}: "data" is not a valid JSON array of numbers: {exc}',
                    tensor=name,
                ) from None
            if not values and (given or end - start > len(piece)):
                # An empty piece between two commas, or after the last: "[1,,2]" or "[1,]".
                raise InvalidInput(
                    f'input {name!r}: "data" is not a valid JSON array: an empty element',
                    tensor=name,
                )
            if given + len(values) <= count:
                # Text of digits, signs, points and exponents parses to ints and floats only,
                # which a float tensor takes: only an integer tensor needs to know which.
                kinds = _NUMBER_KINDS if floats else set(map(type, values))
                piece_array = number_array(values, kinds, datatype, dtype, name)
                tensor[given : given + len(values)] = piece_array
            given += len(values)
        if given != count:
            raise InvalidInput(
                f"input {name!r}: shape {list(shape)} holds {count} elements, but data has {given}",
                tensor=name,
            )
        return tensor.reshape(shape)


def _number_array_end(body: bytes, start: int, stop: int) -> tuple[int, bool] | None:
    """Where the array opened just before ``start`` closes, and whether it is nested.

    None unless it closes before ``stop`` holding only numbers, commas, spaces and brackets,
    with every number at the same depth and no empty array inside: what the document's
    flattening accepts without a mix of arrays and numbers at one level. Anything else
    doubtful is None too, and parsed with the document, which decides. Read a piece at a
    time, in C (``bytes.translate``, numpy on the brackets only): numbers are all at one
    depth exactly when none stands beside an array (``1,[`` or ``],1``), and they then fill
    the innermost arrays, whose depths the brackets alone give.
    """
    depth = 1  # inside the array's own "[", just before start
    number_depth = 0  # not seen yet
    # The text read so far as _SCAN_TABLE reads it, from the last bytes whose brackets are
    # not checked yet (they need two bytes after them); "  [" before the first piece.
    scanned = b"  ["
    last_bracket = _OPEN
    for at in range(start, stop, _PIECE_BYTES):
        text = body[at : min(at + _PIECE_BYTES, stop)]
        # The brackets, up to the first byte of another kind (there it cannot be cut).
        kinds = text.translate(None, _NUMBER_TEXT + _SEPARATOR_TEXT)
        brackets = kinds[: len(kinds) - len(kinds.lstrip(b"[]"))]
        closed = False
        if brackets:
            marks = np.frombuffer(brackets, dtype=np.uint8)
            depths = np.cumsum(np.where(marks == _OPEN, 1, -1), dtype=np.int64) + depth
            closes = np.flatnonzero(depths == 0)
            if closes.size:
                closed = True
                close = int(closes[0])
                marks, depths = marks[: close + 1], depths[: close + 1]
                octets = np.frombuffer(text, dtype=np.uint8)
                text = text[
                    : int(np.flatnonzero((octets == _OPEN) | (octets == _CLOSE))[close]) + 1
                ]
            # An innermost array: a "[" whose next bracket is "]"; its depth is its numbers'.
            inner = depths[:-1][(marks[:-1] == _OPEN) & (marks[1:] == _CLOSE)]
            if last_bracket == _OPEN and marks[0] == _CLOSE:
                inner = np.append(inner, depth)
            if inner.size:
                number_depth = number_depth or int(inner[0])
                if (inner != number_depth).any():
                    return None
            depth, last_bracket = int(depths[-1]), int(marks[-1])
        elif kinds:
            return None  # a byte of another kind
        scanned += text.translate(_SCAN_TABLE, _WHITESPACE_TEXT)
        if scanned.find(b"x") >= 0:
            return None
        if closed:
            scanned += b"  "  # nothing follows the array's "]" that its checks need
        if (brackets or _OPEN in scanned[:4] or _CLOSE in scanned[:4]) and not _brackets_fit(
            scanned
        ):
            return None
        if closed:
            return at + len(text) - 1, number_depth > 1
        if len(brackets) < len(kinds):
            return None  # a byte of another kind inside the array
        scanned = scanned[-4:]
    return None


def _brackets_fit(scanned: bytes) -> bool:
    """False if a bracket of ``scanned`` (but its first two and last two bytes) is misplaced.

    Misplaced: an empty array or element beside it (``[]``, ``[,``, ``,]``), a number
    beside an array (``1[``, ``1,[``, ``]1``, ``],1``: numbers at two depths), or two
    arrays with no comma between (``][``).
    """
    octets = np.frombuffer(scanned, dtype=np.uint8)
    at = np.flatnonzero((octets[2:-2] == _OPEN) | (octets[2:-2] == _CLOSE)) + 2
    if not at.size:
        return True
    mark, before, after = octets[at], octets[at - 1], octets[at + 1]
    before2, after2 = octets[at - 2], octets[at + 2]
    opens = mark == _OPEN
    misplaced = np.where(
        opens,
        (after == _CLOSE)
        | (after == _COMMA)
        | (before == _N)
        | (before == _CLOSE)
        | ((before == _COMMA) & (before2 == _N)),
        (before == _COMMA)
        | (after == _N)
        | (after == _OPEN)
        | ((after == _COMMA) & (after2 == _N)),
    )
    return not bool(misplaced.any())


def _pieces(body: bytes, start: int, end: int) -> Iterator[bytes]:
    """``body[start:end]`` in pieces of about :data:`_PIECE_BYTES`, split at commas (dropped)."""
    at = start
    while True:
        comma = body.find(b",", min(at + _PIECE_BYTES, end), end)
        if comma < 0:
            yield body[at:end]
            return
        yield body[at:comma]
        at = comma + 1
