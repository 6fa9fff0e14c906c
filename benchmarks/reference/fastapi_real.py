r"""A FastAPI + onnxruntime service for one real model, written the way users write one.

``fastapi_app.py`` serves one FP32 input; the real models of ``benchmarks/real_models.py``
take several inputs of several types (silero-vad: ``input`` FP32, ``state`` FP32 and ``sr``
an INT64 scalar; magika: INT32 bytes). So this one reads every input by name, maps the v2
datatype to numpy, runs the default ``InferenceSession(path)`` from a ``def`` endpoint
(FastAPI runs it in its thread pool, as its documentation advises for blocking calls) and
answers every output as a flat JSON list through a pydantic response model.

Run it with uvicorn's factory mode::

    REFERENCE_MODEL_PATH=model.onnx REFERENCE_MODEL_NAME=magika \
        uvicorn fastapi_real:create_app --factory --app-dir benchmarks/reference
"""

from __future__ import annotations

import os
from typing import Any

import numpy as np
import onnxruntime as ort
from fastapi import FastAPI, HTTPException
from pydantic import BaseModel

__all__ = ["InferenceRequest", "InferenceResponse", "build_app", "create_app"]

_DTYPES: dict[str, Any] = {"FP32": np.float32, "INT32": np.int32, "INT64": np.int64}
_DATATYPES = {np.dtype(dtype): name for name, dtype in _DTYPES.items()}


class RequestInput(BaseModel):
    """One ``$request_input``, its data flat."""

    name: str
    datatype: str
    shape: list[int]
    data: list[float]


class InferenceRequest(BaseModel):
    """An ``$inference_request``."""

    inputs: list[RequestInput]


class ResponseOutput(BaseModel):
    """One ``$response_output``, its data flat."""

    name: str
    datatype: str
    shape: list[int]
    data: list[float]


class InferenceResponse(BaseModel):
    """An ``$inference_response``."""

    model_name: str
    outputs: list[ResponseOutput]


def build_app(session: Any, model_name: str) -> FastAPI:
    """A FastAPI app serving ``session`` as ``model_name`` on the v2 infer route."""
    app = FastAPI(title="reference: FastAPI + onnxruntime, real models")
    output_names = [output.name for output in session.get_outputs()]

    @app.post("/v2/models/{name}/infer")
    def infer(name: str, request: InferenceRequest) -> InferenceResponse:
        if name != model_name:
            raise HTTPException(status_code=404, detail=f"model {name} not found")
        feeds = {}
        for tensor in request.inputs:
            if tensor.datatype not in _DTYPES:
                raise HTTPException(status_code=400, detail=f"unsupported {tensor.datatype}")
            feeds[tensor.name] = np.array(tensor.data, dtype=_DTYPES[tensor.datatype]).reshape(
                tensor.shape
            )
        results = session.run(output_names, feeds)
        return InferenceResponse(
            model_name=name,
            outputs=[
                ResponseOutput(
                    name=output,
                    datatype=_DATATYPES[result.dtype],
                    shape=list(result.shape),
                    data=result.ravel().tolist(),
                )
                for output, result in zip(output_names, results, strict=True)
            ],
        )

    return app


def create_app() -> FastAPI:
    """The factory for uvicorn: serve ``$REFERENCE_MODEL_PATH`` as ``$REFERENCE_MODEL_NAME``."""
    session = ort.InferenceSession(os.environ["REFERENCE_MODEL_PATH"])
    return build_app(session, os.environ.get("REFERENCE_MODEL_NAME", "model"))
