"""Triton's classification extension: an output's top classes as ``"value:index[:label]"``.

A request asks for it per output, with the parameter ``classification`` set to N (HTTP JSON
``{"name": "probs", "parameters": {"classification": 3}}``; tritonclient's
``InferRequestedOutput(name, class_count=3)``). The output is then not the model's tensor but
BYTES: for each row, the N highest values, highest first, each written
``"<value>:<index>"``, followed by ``":<label>"`` when the model's config.pbtxt gives the
output a ``label_filename`` with a line for that index.

As in Triton: when the model batches (its configuration's ``max_batch_size`` is above 0), the
first dimension is the batch's and each row is ranked on its own, giving shape
``[batch, min(N, classes)]``; otherwise the whole tensor is one row, giving
``[min(N, elements)]``. A value is written as C++'s ``std::to_string`` writes it: integers in
decimal, floating point with six decimals (``0.750000``). Equal values are ranked by index
(Triton leaves their order unspecified). Boolean and string outputs have no order to rank by
and are refused; so is an output of more than :data:`MAX_ELEMENTS` elements per row.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import numpy.typing as npt

from corral._base import InvalidInput
from corral.protocol.types import RequestedOutput

__all__ = ["CLASSIFICATION", "MAX_ELEMENTS", "class_count", "top_classes"]

#: The requested output's parameter that asks for classes.
CLASSIFICATION = "classification"

#: The most elements one row may have to be ranked (Triton's bound too).
MAX_ELEMENTS = 1_000_000


def class_count(output: RequestedOutput) -> int | None:
    """How many classes ``output`` asks for; None if it does not ask. Raises InvalidInput."""
    value = output.parameters.get(CLASSIFICATION)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise InvalidInput(
            f"output {output.name!r}: the {CLASSIFICATION!r} parameter must be an integer >= 1 "
            f"(the number of classes), got {value!r}",
            tensor=output.name,
        )
    return value


def top_classes(
    name: str,
    values: npt.NDArray[Any],
    count: int,
    *,
    batched: bool,
    labels: tuple[str, ...] = (),
) -> npt.NDArray[np.object_]:
    """The top ``count`` classes of each row of ``values``, as an object array of bytes."""
    if values.dtype.kind not in "uif":
        shown = "string" if values.dtype.kind in "OSU" else str(values.dtype)
        raise InvalidInput(
            f"output {name!r} is {shown}: classification needs numbers to rank",
            tensor=name,
        )
    if batched and values.ndim >= 1:
        rows = values.reshape(values.shape[0], -1)
    else:
        rows = values.reshape(1, -1)
    if rows.shape[1] > MAX_ELEMENTS:
        raise InvalidInput(
            f"output {name!r} has {rows.shape[1]} elements per row; classification ranks at "
            f"most {MAX_ELEMENTS}",
            tensor=name,
        )
    kept = min(count, rows.shape[1])
    floating = values.dtype.kind == "f"
    answer = np.empty((rows.shape[0], kept), dtype=object)
    # lexsort's last key is the primary one: values ascending, equal ones by index descending;
    # reversed, highest first and equal values by index. Exact for every dtype (uint64 too).
    backwards = -np.arange(rows.shape[1])
    for row_index, row in enumerate(rows):
        order = np.lexsort((backwards, row))[::-1]
        for rank, index in enumerate(order[:kept]):
            value = row[index]
            text = f"{float(value):.6f}" if floating else str(int(value))
            text += f":{int(index)}"
            if index < len(labels):
                text += f":{labels[index]}"
            answer[row_index, rank] = text.encode()
    return answer if batched and values.ndim >= 1 else answer.reshape(kept)
