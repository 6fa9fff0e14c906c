"""numpy dtypes and the protocol's datatypes, and what an output must be to be carried."""

from __future__ import annotations

import numpy as np
import pytest

from corral._base import InferenceError
from corral.protocol.datatypes import datatype_of, itemsize
from corral.protocol.outputs import tensor_output


@pytest.mark.parametrize(
    ("dtype", "datatype"),
    [
        (np.dtype("<f4"), "FP32"),
        (np.dtype(">f4"), "FP32"),  # big-endian: the same datatype, in its own order
        (np.dtype(">i8"), "INT64"),
        (np.dtype("?"), "BOOL"),
        (np.dtype("S3"), "BYTES"),
        (np.dtype("U5"), "BYTES"),
        (np.dtype(object), "BYTES"),
    ],
)
def test_each_numpy_dtype_has_its_datatype(dtype: np.dtype, datatype: str):
    assert datatype_of(dtype) == datatype


def test_a_dtype_no_datatype_carries_is_refused_by_name():
    with pytest.raises(ValueError, match="numpy dtype complex64 has no Open Inference"):
        datatype_of(np.dtype(np.complex64))


def test_itemsize_is_the_binary_encodings_and_none_for_bytes():
    assert itemsize("FP16") == 2
    assert itemsize("INT64") == 8
    assert itemsize("BYTES") is None


def test_an_output_must_be_a_tensor_of_a_datatype():
    output = tensor_output("Y", np.zeros((2, 3), np.float32))
    assert (output.name, output.datatype, output.shape) == ("Y", "FP32", (2, 3))
    with pytest.raises(InferenceError, match=r"output 'Y' is a list, not a tensor"):
        tensor_output("Y", [[1.0]])
    with pytest.raises(InferenceError, match=r"output 'Y': numpy dtype complex128"):
        tensor_output("Y", np.zeros(2, np.complex128))
