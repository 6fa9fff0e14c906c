r"""The usual way, for many models: FastAPI, pydantic, one default onnxruntime session per model.

The same handler as :mod:`fastapi_app` (a ``def`` endpoint, pydantic in and out), serving every
model of a Triton-layout repository: each ``<name>/1/model.onnx`` is loaded at startup into a
dict as ``InferenceSession(path)`` with onnxruntime's defaults, which is what a service written
by hand tends to do (and why it holds a thread pool per model).

Run it with uvicorn's factory mode, the repository named by an environment variable::

    REFERENCE_REPOSITORY=models/ uvicorn fastapi_many:create_app --factory \
        --app-dir benchmarks/reference --loop uvloop --http httptools
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import onnxruntime as ort
from fastapi import FastAPI, HTTPException
from fastapi_app import InferenceRequest, InferenceResponse, run_request

__all__ = ["build_app", "create_app"]


def build_app(sessions: dict[str, Any]) -> FastAPI:
    """A FastAPI app serving each session in ``sessions`` under its name."""
    app = FastAPI(title="reference: FastAPI + one onnxruntime session per model")

    @app.get("/v2/health/ready")
    def ready() -> dict[str, bool]:
        return {"ready": True}

    @app.post("/v2/models/{name}/infer")
    def infer(name: str, request: InferenceRequest) -> InferenceResponse:
        session = sessions.get(name)
        if session is None:
            raise HTTPException(status_code=404, detail=f"model {name} not found")
        return run_request(session, name, request)

    return app


def create_app() -> FastAPI:
    """The factory for uvicorn: every model of ``$REFERENCE_REPOSITORY``, loaded at startup."""
    root = Path(os.environ["REFERENCE_REPOSITORY"])
    sessions = {
        path.parent.parent.name: ort.InferenceSession(str(path))
        for path in sorted(root.glob("*/1/model.onnx"))
    }
    return build_app(sessions)
