r"""The upper bound: a hand-written ASGI handler for one model's v2 infer endpoint.

What a careful engineer writes to serve one tiny model as fast as Python allows: no
framework, the body parsed by orjson, the model run inline on the event loop (a tiny model
runs in microseconds, less than a handoff to a thread costs), the answer written by orjson
straight from the numpy array. One ``onnxruntime.InferenceSession`` with one intra-op
thread, so that no pool thread spins between runs. It answers only
``POST /v2/models/{name}/infer`` with a v2 JSON body holding one FP32 input, and returns the
model's outputs as v2 JSON: the request corral's benchmark sends. No binary extension, no
batching, no limits, no metrics, one model: all that corral does on top is what the
benchmark prices.

Run it with uvicorn's factory mode, the model named by two environment variables::

    REFERENCE_MODEL_PATH=model.onnx REFERENCE_MODEL_NAME=tree \
        uvicorn raw_asgi:create_app --factory --app-dir benchmarks/reference \
        --loop uvloop --http httptools
"""

from __future__ import annotations

import os
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

import numpy as np
import onnxruntime as ort
import orjson

__all__ = ["RawInferApp", "create_app", "load_session"]

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]

_JSON_HEADERS = [(b"content-type", b"application/json")]
# The protocol's names for the dtypes a tiny model returns.
_DATATYPES = {
    np.dtype(np.float32): "FP32",
    np.dtype(np.float64): "FP64",
    np.dtype(np.int64): "INT64",
    np.dtype(np.int32): "INT32",
    np.dtype(np.bool_): "BOOL",
}


def load_session(path: str | os.PathLike[str]) -> Any:
    """One CPU session with one intra-op thread: a tiny model gains nothing from more."""
    options = ort.SessionOptions()
    options.intra_op_num_threads = 1
    options.inter_op_num_threads = 1
    return ort.InferenceSession(os.fspath(path), options, providers=["CPUExecutionProvider"])


class RawInferApp:
    """ASGI app answering ``POST /v2/models/{model_name}/infer`` by running ``session``."""

    def __init__(self, session: Any, model_name: str) -> None:
        self._session = session
        self._model_name = model_name
        self._path = f"/v2/models/{model_name}/infer"
        self._input_name: str = session.get_inputs()[0].name
        self._output_names: list[str] = [output.name for output in session.get_outputs()]

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        """Serve one HTTP request; other scopes (lifespan) are not supported."""
        if scope["type"] != "http":
            return
        if scope["path"] != self._path:
            await _respond(send, 404, {"error": f"no such endpoint: {scope['path']}"})
            return
        if scope["method"] != "POST":
            await _respond(send, 405, {"error": "use POST"})
            return
        body = await _read_body(receive)
        try:
            features = self._decode(body)
        except (orjson.JSONDecodeError, KeyError, IndexError, TypeError, ValueError) as exc:
            await _respond(send, 400, {"error": f"bad request: {exc}"})
            return
        results = self._session.run(self._output_names, {self._input_name: features})
        outputs = [
            {
                "name": name,
                "datatype": _DATATYPES[result.dtype],
                "shape": list(result.shape),
                "data": result.ravel(),
            }
            for name, result in zip(self._output_names, results, strict=True)
        ]
        await _respond(send, 200, {"model_name": self._model_name, "outputs": outputs})

    def _decode(self, body: bytes) -> np.ndarray[Any, Any]:
        (tensor,) = orjson.loads(body)["inputs"]
        if tensor["name"] != self._input_name or tensor["datatype"] != "FP32":
            raise ValueError(f"expected one FP32 input named {self._input_name!r}")
        return np.asarray(tensor["data"], dtype=np.float32).reshape(tensor["shape"])


def create_app() -> RawInferApp:
    """The factory for uvicorn: serve ``$REFERENCE_MODEL_PATH`` as ``$REFERENCE_MODEL_NAME``."""
    path = os.environ["REFERENCE_MODEL_PATH"]
    return RawInferApp(load_session(path), os.environ.get("REFERENCE_MODEL_NAME", "model"))


async def _read_body(receive: Receive) -> bytes:
    message = await receive()
    body: bytes = message.get("body", b"")
    if not message.get("more_body", False):
        return body
    chunks = [body]
    while message.get("more_body", False):
        message = await receive()
        chunks.append(message.get("body", b""))
    return b"".join(chunks)


async def _respond(send: Send, status: int, document: object) -> None:
    body = orjson.dumps(document, option=orjson.OPT_SERIALIZE_NUMPY)
    headers = [*_JSON_HEADERS, (b"content-length", str(len(body)).encode())]
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})
