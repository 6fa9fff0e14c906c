r"""The usual way: a FastAPI endpoint with pydantic models around ``session.run``.

What most tutorials and most services look like: a pydantic model per v2 JSON object, an
endpoint that builds the input array and calls ``session.run`` directly, and a pydantic
response model that FastAPI validates and serializes with its defaults. The session is
onnxruntime's default, ``InferenceSession(path)``. It serves the same model, on the same
route and payload as corral and the raw handler (one FP32 input, flat or nested ``data``).

Tutorials write the endpoint both ways, so both are here: ``create_app`` declares it with
``def``, as FastAPI's documentation advises for blocking calls (FastAPI then runs each
request in its thread pool); ``create_async_app`` declares it ``async def`` and so runs the
model on the event loop.

Run it with uvicorn's factory mode, the model named by two environment variables::

    REFERENCE_MODEL_PATH=model.onnx REFERENCE_MODEL_NAME=tree \
        uvicorn fastapi_app:create_app --factory --app-dir benchmarks/reference \
        --loop uvloop --http httptools
"""

from __future__ import annotations

import os
from typing import Any, Literal

import numpy as np
import onnxruntime as ort
from fastapi import FastAPI, HTTPException
from pydantic import BaseModel

__all__ = [
    "Endpoint",
    "InferenceRequest",
    "InferenceResponse",
    "build_app",
    "create_app",
    "create_async_app",
    "run_request",
]


class RequestInput(BaseModel):
    """One ``$request_input``: a tensor's name, datatype, shape and row-major data."""

    name: str
    datatype: str
    shape: list[int]
    data: list[float] | list[list[float]]


class InferenceRequest(BaseModel):
    """An ``$inference_request`` with its inputs."""

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


#: ``sync``: a ``def`` endpoint, which FastAPI runs in its thread pool (its advice for
#: blocking calls); ``async``: an ``async def`` endpoint, run on the event loop.
Endpoint = Literal["sync", "async"]


def run_request(session: Any, name: str, request: InferenceRequest) -> InferenceResponse:
    """Run ``request`` on ``session`` the tutorial way: numpy in, lists out, pydantic around."""
    tensor = request.inputs[0]
    features = np.array(tensor.data, dtype=np.float32).reshape(tensor.shape)
    results = session.run(None, {tensor.name: features})
    outputs = [
        ResponseOutput(
            name=meta.name,
            datatype="FP32",
            shape=list(result.shape),
            data=result.flatten().tolist(),
        )
        for meta, result in zip(session.get_outputs(), results, strict=True)
    ]
    return InferenceResponse(model_name=name, outputs=outputs)


def build_app(session: Any, model_name: str, endpoint: Endpoint = "sync") -> FastAPI:
    """A FastAPI app serving ``session`` as ``model_name`` from a ``def`` or ``async def``."""
    app = FastAPI(title="reference: FastAPI + onnxruntime")

    def answer(name: str, request: InferenceRequest) -> InferenceResponse:
        if name != model_name:
            raise HTTPException(status_code=404, detail=f"model {name} not found")
        return run_request(session, name, request)

    if endpoint == "sync":

        @app.post("/v2/models/{name}/infer")
        def infer(name: str, request: InferenceRequest) -> InferenceResponse:
            return answer(name, request)

    else:

        @app.post("/v2/models/{name}/infer")
        async def infer_async(name: str, request: InferenceRequest) -> InferenceResponse:
            return answer(name, request)

    return app


def create_app() -> FastAPI:
    """The factory for uvicorn: serve ``$REFERENCE_MODEL_PATH`` from a ``def`` endpoint."""
    return _from_environment("sync")


def create_async_app() -> FastAPI:
    """The factory for uvicorn: the same from an ``async def`` endpoint."""
    return _from_environment("async")


def _from_environment(endpoint: Endpoint) -> FastAPI:
    session = ort.InferenceSession(os.environ["REFERENCE_MODEL_PATH"])
    return build_app(session, os.environ.get("REFERENCE_MODEL_NAME", "model"), endpoint)
