"""The calls tritonclient and the KServe SDK make of a server, as scripts, and their check.

Each script takes the server's HTTP and gRPC addresses, makes its calls against one model,
``mlp`` (:data:`MODEL` with :data:`CONFIG`), and prints one JSON object: {call: Y as a list,
or a classification's strings, or an error's text}. :func:`check_answers` holds the answers
to onnxruntime's and the refusals to the parameter each must name. Run against
``corral serve`` (tests/test_current_clients.py) and through Ray's ingress
(tests/ray/test_ray_serve.py): the same calls, the same answers.
"""

from __future__ import annotations

import numpy as np

from corral.testing import build_mlp

#: The model: input X FP32 [-1, 4], output Y FP32 [-1, 3].
MODEL = build_mlp(n_outputs=3, seed=7)
X = np.array([[1, 2, 3, 4]], np.float32)
#: Its Triton configuration, parsed with the protobuf the client's pin leaves.
CONFIG = """
platform: "onnxruntime_onnx"
max_batch_size: 8
input [{ name: "X", data_type: TYPE_FP32, dims: [4] }]
output [{ name: "Y", data_type: TYPE_FP32, dims: [3] }]
"""

# Each client script takes the HTTP and gRPC addresses, makes its calls and prints one JSON
# object: {call: Y as a list, or a classification's strings, or an error's text}.
TRITON = """
import json, sys
import numpy as np
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

x = np.array([[1, 2, 3, 4]], np.float32)
calls = {}

def record(name, call):
    try:
        answer = call().as_numpy("Y")
    except InferenceServerException as exc:
        calls[name] = "refused: " + str(exc)
        return
    calls[name] = [v.decode() if isinstance(v, bytes) else float(v) for v in answer.ravel()]

h = httpclient.InferenceServerClient(sys.argv[1])
binary = httpclient.InferInput("X", [1, 4], "FP32")
binary.set_data_from_numpy(x)  # binary_data=True: the input's binary_data_size
as_json = httpclient.InferInput("X", [1, 4], "FP32")
as_json.set_data_from_numpy(x, binary_data=False)
record("http: binary input, no output named (binary_data_output)", lambda: h.infer("mlp", [binary]))
record("http: JSON input, JSON output (binary_data false)", lambda: h.infer(
    "mlp", [as_json], outputs=[httpclient.InferRequestedOutput("Y", binary_data=False)]))
record("http: output binary_data true, request id, timeout, headers, gzip both ways",
    lambda: h.infer("mlp", [binary], outputs=[httpclient.InferRequestedOutput("Y")],
        request_id="call-1", timeout=30_000_000, headers={"x-caller": "test"},
        request_compression_algorithm="gzip", response_compression_algorithm="gzip"))
record("http: deflate both ways", lambda: h.infer("mlp", [binary],
    request_compression_algorithm="deflate", response_compression_algorithm="deflate"))
record("http: classification", lambda: h.infer(
    "mlp", [binary], outputs=[httpclient.InferRequestedOutput("Y", class_count=2)]))
record("http: sequence_id and priority at their defaults",
    lambda: h.infer("mlp", [binary], sequence_id=0, priority=0))
record("http: sequence_id 7", lambda: h.infer("mlp", [binary], sequence_id=7, sequence_start=True))
record("http: priority 2", lambda: h.infer("mlp", [binary], priority=2))
record("http: custom parameter", lambda: h.infer("mlp", [binary], parameters={"mine": 1}))

g = grpcclient.InferenceServerClient(sys.argv[2])
# The model's config.pbtxt, read with this venv's protobuf and sent back over both protocols.
assert h.get_model_config("mlp")["max_batch_size"] == 8
assert g.get_model_config("mlp").config.max_batch_size == 8
raw = grpcclient.InferInput("X", [1, 4], "FP32")
raw.set_data_from_numpy(x)
record("grpc: raw input, no output named", lambda: g.infer("mlp", [raw]))
record("grpc: output named, request id, timeout, client_timeout, headers, gzip",
    lambda: g.infer("mlp", [raw], outputs=[grpcclient.InferRequestedOutput("Y")],
        request_id="call-2", timeout=30_000_000, client_timeout=30, headers={"x-caller": "test"},
        compression_algorithm="gzip"))
record("grpc: deflate", lambda: g.infer("mlp", [raw], compression_algorithm="deflate"))
record("grpc: classification", lambda: g.infer(
    "mlp", [raw], outputs=[grpcclient.InferRequestedOutput("Y", class_count=2)]))
record("grpc: sequence_id and priority at their defaults",
    lambda: g.infer("mlp", [raw], sequence_id=0, priority=0))
record("grpc: sequence_id 7", lambda: g.infer("mlp", [raw], sequence_id=7, sequence_start=True))
record("grpc: priority 2", lambda: g.infer("mlp", [raw], priority=2))
record("grpc: custom parameter", lambda: g.infer("mlp", [raw], parameters={"mine": 1}))
print(json.dumps(calls))
"""

KSERVE = """
import asyncio, json, sys
import httpx
import grpc
import numpy as np
from kserve import InferenceGRPCClient, InferenceRESTClient, InferInput, InferRequest, RESTConfig
from kserve.protocol.infer_type import RequestedOutput

x = np.array([[1, 2, 3, 4]], np.float32)
calls = {}

def request(binary, **more):
    tensor = InferInput("X", [1, 4], "FP32")
    tensor.set_data_from_numpy(x, binary_data=binary)
    return InferRequest(model_name="mlp", infer_inputs=[tensor], **more)

async def record(name, call):
    try:
        answer = (await call).outputs[0].as_numpy()
    except (httpx.HTTPStatusError, grpc.RpcError) as exc:
        calls[name] = "refused: " + str(exc)
        return
    calls[name] = [float(v) for v in answer.ravel()]

async def main():
    base = "http://" + sys.argv[1]
    rest = InferenceRESTClient(RESTConfig(protocol="v2", retries=0))
    assert await rest.is_server_ready(base) and await rest.is_model_ready(base, "mlp")
    await record("rest: binary input (binary_data_size, octet-stream)",
        rest.infer(base, request(True), model_name="mlp"))
    await record("rest: JSON input", rest.infer(base, request(False), model_name="mlp"))
    await record("rest: output binary_data true, request id",
        rest.infer(base, request(True, request_id="call-3", request_outputs=[
            RequestedOutput("Y", parameters={"binary_data": True})]), model_name="mlp"))
    await record("rest: binary_data_output",
        rest.infer(base, request(False, parameters={"binary_data_output": True}),
            model_name="mlp"))
    await record("rest: custom parameter",
        rest.infer(base, request(False, parameters={"mine": 1}), model_name="mlp"))
    await record("rest: content_type pd",
        rest.infer(base, request(False, parameters={"content_type": "pd"}), model_name="mlp"))
    await rest.close()
    g = InferenceGRPCClient(sys.argv[2], retries=0)
    assert await g.is_server_ready() and await g.is_model_ready("mlp")
    await record("grpc: raw input (binary_data_size)", g.infer(request(True)))
    await record("grpc: typed contents", g.infer(request(False)))
    await record("grpc: output named, request id, headers",
        g.infer(request(True, request_id="call-4", request_outputs=[RequestedOutput("Y")]),
            headers=(("x-caller", "test"),)))
    await record("grpc: output binary_data true (as over REST)", g.infer(request(
        True, request_outputs=[RequestedOutput("Y", parameters={"binary_data": True})])))
    await record("grpc: binary_data_output true", g.infer(
        request(True, parameters={"binary_data_output": True})))
    await record("grpc: binary_data_output false",
        g.infer(request(True, parameters={"binary_data_output": False})))
    await record("grpc: output binary_data false", g.infer(request(
        True, request_outputs=[RequestedOutput("Y", parameters={"binary_data": False})])))
    await record("grpc: content_type np", g.infer(request(True, parameters={"content_type": "np"})))
    await record("grpc: custom parameter", g.infer(request(True, parameters={"mine": 1})))
    await g.close()

asyncio.run(main())
print(json.dumps(calls))
"""

CLIENTS = {"tritonclient[all]": TRITON, "kserve": KSERVE}
#: The calls refused, by the end of their name, and the parameter each refusal must name.
REFUSED = {
    "custom parameter": "mine",
    "content_type pd": "content_type",
    "content_type np": "content_type",
    "binary_data_output false": "binary_data_output",
    "output binary_data false": "binary_data",
}


def check_answers(calls: dict[str, object], y: np.ndarray) -> None:
    """Each call answered with onnxruntime's outputs, or refused naming its parameter."""
    top = np.argsort(-y.ravel())[:2]
    for name, answer in calls.items():
        refused = next((key for call, key in REFUSED.items() if name.endswith(call)), None)
        if refused is not None:
            assert isinstance(answer, str), (name, answer)
            assert answer.startswith("refused: "), (name, answer)
            assert f"'{refused}'" in answer, (name, answer)
        elif name.endswith("classification"):
            assert isinstance(answer, list), (name, answer)
            assert [int(item.split(":")[1]) for item in answer] == top.tolist(), name
            values = [float(item.split(":")[0]) for item in answer]
            np.testing.assert_allclose(values, y.ravel()[top], 1e-5, err_msg=name)
        else:
            assert not isinstance(answer, str), (name, answer)
            np.testing.assert_allclose(answer, y.ravel(), 1e-5, err_msg=name)
