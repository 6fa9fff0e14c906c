"""The protocol's tensor datatypes and the numpy dtypes they map to, both ways.

``BYTES`` maps to numpy's ``object`` dtype holding ``bytes`` (strings are encoded as UTF-8 on
the way in). ``BF16`` has no numpy dtype and is refused with a clear error.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from corral._base import InvalidInput

__all__ = ["DATATYPES", "datatype_of", "itemsize", "numpy_dtype"]

_TO_NUMPY: dict[str, np.dtype[Any]] = {
    "BOOL": np.dtype(np.bool_),
    "UINT8": np.dtype(np.uint8),
    "UINT16": np.dtype(np.uint16),
    "UINT32": np.dtype(np.uint32),
    "UINT64": np.dtype(np.uint64),
    "INT8": np.dtype(np.int8),
    "INT16": np.dtype(np.int16),
    "INT32": np.dtype(np.int32),
    "INT64": np.dtype(np.int64),
    "FP16": np.dtype(np.float16),
    "FP32": np.dtype(np.float32),
    "FP64": np.dtype(np.float64),
    "BYTES": np.dtype(object),
}
_FROM_NUMPY: dict[np.dtype[Any], str] = {dtype: name for name, dtype in _TO_NUMPY.items()}

#: Every datatype corral accepts, in the protocol's spelling.
DATATYPES: frozenset[str] = frozenset(_TO_NUMPY)


def numpy_dtype(datatype: str, *, tensor: str | None = None) -> np.dtype[Any]:
    """The numpy dtype of a protocol datatype; :class:`InvalidInput` naming ``tensor`` if unknown.

    Example::

        numpy_dtype("FP32")  # dtype('float32')
    """
    dtype = _TO_NUMPY.get(datatype) if type(datatype) is str else None
    if dtype is None:
        where = f"tensor {tensor!r}: " if tensor is not None else ""
        raise InvalidInput(
            f"{where}unsupported datatype {datatype!r}; expected one of "
            f"{', '.join(sorted(DATATYPES))}",
            tensor=tensor,
        )
    return dtype


def datatype_of(dtype: np.dtype[Any]) -> str:
    """The protocol datatype of a numpy dtype; numpy's string kinds are ``BYTES``.

    Raises ``ValueError`` for a dtype the protocol cannot carry (complex numbers, say).
    """
    name = _FROM_NUMPY.get(dtype.newbyteorder("=") if dtype.byteorder == ">" else dtype)
    if name is not None:
        return name
    if dtype.kind in "SUO":
        return "BYTES"
    raise ValueError(f"numpy dtype {dtype} has no Open Inference Protocol datatype")


def itemsize(datatype: str) -> int | None:
    """Bytes per element in the binary encoding; None for BYTES, whose elements vary."""
    dtype = _TO_NUMPY[datatype]
    return None if dtype.kind == "O" else dtype.itemsize
