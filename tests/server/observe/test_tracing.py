"""Tracing (issue 17): W3C traceparent honoured over HTTP and gRPC, spans, batch links, loads.

In-process: one Host, the ASGI app through httpx's transport and grpc.aio on a loopback port,
spans kept by OpenTelemetry's in-memory exporter. The batch test holds every compute worker
(``tests.gates``) until both requests are queued, so that they share one run by
construction. Subprocesses check the wiring of ``corral serve``: tracing off imports nothing
from OpenTelemetry; on, spans reach the exporter; asked for without the extra, it exits 2.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import subprocess
import sys
import textwrap
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
import tritonclient.grpc.aio as triton
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind, StatusCode
from tritonclient.grpc import InferInput

from corral import Host
from corral._base.trace_hooks import LoadRecord, RunRecord
from corral.protocol import DataPlane
from corral.server.grpc.service import start_grpc_server
from corral.server.http.app import HttpApp
from corral.server.observe.tracing import Tracing, start_tracing
from corral.testing import build_linear, build_mlp
from tests.gates import hold_compute_workers
from tests.helpers import ROOT, add_model, run_freeing_frames, wait_until

TRACE_ID = "4bf92f3577b34da6a3ce929d0e0e4736"
PARENT_ID = "00f067aa0ba902b7"


def traceparent(trace_id: str = TRACE_ID, parent_id: str = PARENT_ID) -> str:
    return f"00-{trace_id}-{parent_id}-01"


@pytest.fixture
def root(tmp_path: Path) -> Path:
    add_model(tmp_path, "linear", build_linear(seed=2))
    # One run per request, so that each blocker holds one worker (tests.gates).
    add_model(tmp_path, "slow", build_mlp(seed=5), toml="max_batch_size = 0\n")
    add_model(tmp_path, "broken", b"not an onnx model")
    return tmp_path


@dataclass
class Traced:
    host: Host
    http: httpx.AsyncClient
    grpc: triton.InferenceServerClient
    exporter: InMemorySpanExporter

    def spans(self, name: str, trace_id: int | None = None) -> list[ReadableSpan]:
        found = self.exporter.get_finished_spans()
        return [
            s
            for s in found
            if s.name == name and (trace_id is None or s.context.trace_id == trace_id)
        ]

    def one(self, name: str, trace_id: int | None = None) -> ReadableSpan:
        (span,) = self.spans(name, trace_id)
        return span


@contextlib.asynccontextmanager
async def traced(root: Path, *, preload: tuple[str, ...] = ()) -> AsyncIterator[Traced]:
    exporter = InMemorySpanExporter()
    provider = TracerProvider(shutdown_on_exit=False)
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    tracing = Tracing(provider)
    async with contextlib.AsyncExitStack() as stack:
        stack.callback(tracing.shutdown)
        host = Host(root)
        host.observe_loads(tracing.load_done)
        stack.push_async_callback(asyncio.to_thread, host.close)
        if preload:
            assert await asyncio.to_thread(host.preload, list(preload)) == {}
        plane = DataPlane(host)
        transport = httpx.ASGITransport(app=HttpApp(plane, tracing=tracing))
        http = httpx.AsyncClient(transport=transport, base_url="http://corral")
        stack.push_async_callback(http.aclose)
        server, port = await start_grpc_server(plane, "127.0.0.1", 0, tracing=tracing)
        stack.push_async_callback(server.stop, None)
        client = triton.InferenceServerClient(f"127.0.0.1:{port}")
        stack.push_async_callback(client.close)
        yield Traced(host, http, client, exporter)


def infer_body(x: np.ndarray) -> dict[str, Any]:
    tensor = {"name": "X", "datatype": "FP32", "shape": list(x.shape), "data": x.ravel().tolist()}
    return {"inputs": [tensor]}


def run_async(main: Callable[[], Any]) -> None:
    run_freeing_frames(main)


def assert_request_tree(t: Traced, request: ReadableSpan, *, batch_size: int = 1) -> None:
    """The request's decode, queue and encode spans are its children; its run links to it."""
    trace_id = request.context.trace_id
    for name in ("corral.decode", "corral.queue", "corral.encode"):
        child = t.one(name, trace_id)
        assert child.parent is not None, name
        assert child.parent.span_id == request.context.span_id, name
        assert request.start_time <= child.start_time <= child.end_time <= request.end_time, name
    queued = t.one("corral.queue", trace_id)
    span_id = request.context.span_id
    (run,) = [s for s in t.spans("corral.run") if span_id in [x.context.span_id for x in s.links]]
    assert queued.end_time == run.start_time  # queued until its batch was taken
    assert run.start_time <= run.end_time
    assert run.attributes is not None
    assert run.attributes["corral.model"] == "linear"
    assert run.attributes["corral.version"] == 1
    assert run.attributes["corral.batch_size"] == batch_size
    assert run.attributes["corral.rows"] == batch_size
    assert run.attributes["corral.status"] == "OK"


@pytest.mark.timeout(60)
def test_an_http_request_is_a_child_of_its_traceparent_with_its_spans_and_a_load(root: Path):
    async def main() -> None:
        async with traced(root) as t:
            x = np.ones((1, 4), np.float32)
            answer = await t.http.post(
                "/v2/models/linear/infer",
                json=infer_body(x),
                headers={"traceparent": traceparent(), "tracestate": "vendor=1"},
            )
            assert answer.status_code == 200, answer.text
            request = t.one("POST /v2/models/{model}/infer", int(TRACE_ID, 16))
            assert request.kind is SpanKind.SERVER
            assert request.parent is not None
            assert request.parent.is_remote
            assert request.parent.span_id == int(PARENT_ID, 16)
            assert request.context.trace_state.get("vendor") == "1"
            assert request.attributes == {
                "http.request.method": "POST",
                "http.route": "/v2/models/{model}/infer",
                "corral.model": "linear",
                "corral.version": 1,
                "http.response.status_code": 200,
                "corral.status": "OK",
            }
            assert_request_tree(t, request)
            (run,) = t.spans("corral.run")
            assert run.parent is not None
            assert run.parent.span_id == request.context.span_id
            # The first request loaded the model: a load span of its own trace.
            load = t.one("corral.load")
            assert load.parent is None
            assert load.context.trace_id != int(TRACE_ID, 16)
            assert load.attributes is not None
            assert load.attributes["corral.model"] == "linear"
            assert load.attributes["corral.version"] == 1
            assert load.attributes["corral.status"] == "OK"
            assert load.attributes["corral.size_bytes"] > 0
            assert load.start_time is not None
            assert load.end_time is not None
            assert load.start_time < load.end_time

    run_async(main)


@pytest.mark.timeout(60)
def test_failures_are_error_spans_with_their_status(root: Path):
    async def main() -> None:
        async with traced(root) as t:
            x = np.ones((1, 4), np.float32)
            answer = await t.http.post("/v2/models/broken/infer", json=infer_body(x))
            assert answer.status_code == 400  # not ONNX: fails alike until it changes
            request = t.one("POST /v2/models/{model}/infer")
            assert request.parent is None  # no traceparent: a trace of its own
            assert request.status.status_code is StatusCode.ERROR
            assert request.attributes is not None
            assert request.attributes["http.response.status_code"] == 400
            assert request.attributes["corral.status"] == "ModelInvalid"
            load = t.one("corral.load")
            assert load.status.status_code is StatusCode.ERROR
            assert load.attributes is not None
            assert load.attributes["corral.model"] == "broken"
            assert load.attributes["corral.status"] == "ModelInvalid"
            # A traceparent that does not parse starts a new trace, and says so.
            t.exporter.clear()
            bad = "00-not-a-trace-01"
            answer = await t.http.post(
                "/v2/models/linear/versions/1/infer",
                json=infer_body(x),
                headers={"traceparent": bad},
            )
            assert answer.status_code == 200
            request = t.one("POST /v2/models/{model}/versions/{version}/infer")
            assert request.parent is None
            assert request.attributes is not None
            assert request.attributes["corral.traceparent.refused"] == bad
            # A caller that did not sample its trace (flags 00): nothing of it is recorded.
            t.exporter.clear()
            unsampled = traceparent()[:-2] + "00"
            answer = await t.http.post(
                "/v2/models/linear/infer", json=infer_body(x), headers={"traceparent": unsampled}
            )
            assert answer.status_code == 200
            assert t.exporter.get_finished_spans() == ()

    run_async(main)


@pytest.mark.timeout(60)
def test_a_grpc_request_is_a_child_of_its_traceparent_metadata(root: Path):
    async def main() -> None:
        async with traced(root, preload=("linear",)) as t:
            tensor = InferInput("X", [1, 4], "FP32")
            tensor.set_data_from_numpy(np.ones((1, 4), np.float32))
            await t.grpc.infer("linear", [tensor], headers={"traceparent": traceparent()})
            name = "inference.GRPCInferenceService/ModelInfer"
            request = t.one(name, int(TRACE_ID, 16))
            assert request.kind is SpanKind.SERVER
            assert request.parent is not None
            assert request.parent.span_id == int(PARENT_ID, 16)
            assert request.attributes is not None
            assert request.attributes["rpc.system"] == "grpc"
            assert request.attributes["rpc.method"] == "ModelInfer"
            assert request.attributes["rpc.grpc.status_code"] == 0
            assert request.attributes["corral.model"] == "linear"
            assert_request_tree(t, request)
            # An unknown model: NOT_FOUND (5), an error span.
            t.exporter.clear()
            with pytest.raises(Exception, match="unknown model"):
                await t.grpc.infer("nothing", [tensor], headers={"traceparent": traceparent()})
            request = t.one(name, int(TRACE_ID, 16))
            assert request.status.status_code is StatusCode.ERROR
            assert request.attributes is not None
            assert request.attributes["rpc.grpc.status_code"] == 5

    run_async(main)


@pytest.mark.timeout(60)
def test_two_requests_batched_into_one_run_give_one_run_span_linked_to_both(root: Path):
    other_trace = "0af7651916cd43dd8448eb211c80319c"

    async def main() -> None:
        async with traced(root, preload=("linear", "slow")) as t:
            gate, blockers = await asyncio.to_thread(hold_compute_workers, t.host)
            try:
                sent = [
                    asyncio.ensure_future(
                        t.http.post(
                            "/v2/models/linear/infer",
                            json=infer_body(np.full((1, 4), i, np.float32)),
                            headers={"traceparent": traceparent(trace_id)},
                        )
                    )
                    for i, trace_id in enumerate((TRACE_ID, other_trace))
                ]

                def both_queued() -> bool:
                    stats = t.host.queue_stats().get(("linear", 1))
                    return stats is not None and stats.pending == 2

                await asyncio.to_thread(wait_until, both_queued, 20)
            finally:
                gate.open.set()
            for answer in await asyncio.wait_for(asyncio.gather(*sent), 30):
                assert answer.status_code == 200, answer.text
            for blocker in blockers:
                await asyncio.to_thread(blocker.result, 30)
            (run,) = [s for s in t.spans("corral.run") if s.attributes["corral.model"] == "linear"]
            requests = [
                t.one("POST /v2/models/{model}/infer", int(trace_id, 16))
                for trace_id in (TRACE_ID, other_trace)
            ]
            linked = {link.context.span_id for link in run.links}
            assert linked == {r.context.span_id for r in requests}
            # The run is a child of one of them (the oldest); each has its own queue span.
            assert run.parent is not None
            assert run.parent.span_id in {r.context.span_id for r in requests}
            for request in requests:
                assert_request_tree(t, request, batch_size=2)

    run_async(main)


# -- corral serve, in a subprocess -------------------------------------------------------

SERVE = """
import asyncio, json, sys
import httpx
import numpy as np
import tritonclient.grpc.aio as triton
from tritonclient.grpc import InferInput
from corral.server.app import serve
from corral.server.settings import ServerSettings

async def main(repository, exporter, traceparent):
    settings = ServerSettings(
        repository=repository, http_port=0, grpc_port=0, trace_exporter=exporter
    )
    stop = asyncio.Event()
    ports = asyncio.get_running_loop().create_future()
    serving = asyncio.ensure_future(serve(settings, stop, started=ports.set_result))
    addresses = await ports
    headers = {"traceparent": traceparent}
    tensor = {"name": "X", "datatype": "FP32", "shape": [1, 4], "data": [1, 2, 3, 4]}
    url = f"http://127.0.0.1:{addresses.http_port}/v2/models/linear/infer"
    async with httpx.AsyncClient() as http:
        for _ in range(3):
            answer = await http.post(url, json={"inputs": [tensor]}, headers=headers)
            assert answer.status_code == 200, answer.text
    client = triton.InferenceServerClient(f"127.0.0.1:{addresses.grpc_port}")
    tensor = InferInput("X", [1, 4], "FP32")
    tensor.set_data_from_numpy(np.ones((1, 4), np.float32))
    for _ in range(3):
        await client.infer("linear", [tensor], headers=headers)
    await client.close()
    stop.set()
    assert await serving == 0
    loaded = sorted(name for name in sys.modules if name.startswith("opentelemetry"))
    print("MODULES " + json.dumps(loaded), file=sys.stderr)

asyncio.run(main(*sys.argv[1:]))
"""


def serve_in_subprocess(root: Path, exporter: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OTEL_SERVICE_NAME": "traced-corral"}
    return subprocess.run(
        [sys.executable, "-c", SERVE, str(root), exporter, traceparent()],
        capture_output=True,
        text=True,
        timeout=60,
        env=env,
        cwd=ROOT,
        check=False,
    )


def modules_loaded(stderr: str) -> list[str]:
    line = next(line for line in stderr.splitlines() if line.startswith("MODULES "))
    return list(json.loads(line.removeprefix("MODULES ")))


@pytest.mark.timeout(90)
def test_serving_without_tracing_imports_nothing_from_opentelemetry(root: Path):
    done = serve_in_subprocess(root, "none")
    assert done.returncode == 0, done.stderr
    assert modules_loaded(done.stderr) == []
    assert TRACE_ID not in done.stdout


@pytest.mark.timeout(90)
def test_corral_serve_with_tracing_exports_http_grpc_and_load_spans(root: Path):
    done = serve_in_subprocess(root, "console")
    assert done.returncode == 0, done.stderr
    assert "opentelemetry.sdk.trace" in modules_loaded(done.stderr)
    # The console exporter writes one JSON document per span.
    decoder = json.JSONDecoder()
    spans, text = [], done.stdout.strip()
    while text:
        span, end = decoder.raw_decode(text)
        spans.append(span)
        text = text[end:].strip()
    names = [s["name"] for s in spans if s["context"]["trace_id"] == f"0x{TRACE_ID}"]
    assert names.count("POST /v2/models/{model}/infer") == 3
    assert names.count("inference.GRPCInferenceService/ModelInfer") == 3
    assert names.count("corral.run") == 6
    (load,) = [s for s in spans if s["name"] == "corral.load"]
    assert load["attributes"]["corral.model"] == "linear"
    assert load["resource"]["attributes"]["service.name"] == "traced-corral"


BLOCKED = """
import importlib.abc, sys

class NoOpenTelemetry(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name == "opentelemetry" or name.startswith("opentelemetry."):
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
        return None

sys.meta_path.insert(0, NoOpenTelemetry())
from corral.cli import main
sys.exit(main(["serve", sys.argv[1], "--trace-exporter", "otlp", "--http-port", "0"]))
"""


@pytest.mark.timeout(60)
def test_asking_for_tracing_without_the_extra_exits_2_naming_it(root: Path):
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    done = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(BLOCKED), str(root)],
        capture_output=True,
        text=True,
        timeout=50,
        env=env,
        cwd=ROOT,
        check=False,
    )
    assert done.returncode == 2, done.stderr
    assert "--trace-exporter otlp needs OpenTelemetry" in done.stderr
    assert "pip install 'opentelemetry-api>=1.25'" in done.stderr  # on the index, not corral


@pytest.mark.timeout(30)
def test_tracing_off_is_none_and_a_disabled_sdk_is_refused(monkeypatch: pytest.MonkeyPatch):
    assert start_tracing("none") is None
    monkeypatch.setenv("OTEL_SDK_DISABLED", "true")
    from corral.server.observe.tracing import TracingUnavailable

    with pytest.raises(TracingUnavailable, match="OTEL_SDK_DISABLED=true"):
        start_tracing("otlp")


class Faulty:
    """A RunTrace and a load observer that fail: tracing's faults must change no answer."""

    def __init__(self) -> None:
        self.calls = 0

    def ran(self, run: RunRecord) -> None:
        self.calls += 1
        raise RuntimeError("the trace failed")

    def __call__(self, record: LoadRecord) -> None:
        self.calls += 1
        raise RuntimeError("the load observer failed")


@pytest.mark.timeout(60)
def test_a_failing_trace_or_load_observer_is_logged_and_changes_no_answer(
    root: Path, caplog: pytest.LogCaptureFixture
):
    observer, trace = Faulty(), Faulty()
    x = np.ones((1, 4), np.float32)

    async def main() -> None:
        with Host(root) as host:
            host.observe_loads(observer)
            with await host.acquire_async("linear") as lease:
                outputs = await lease.infer_async({"X": x}, trace=trace)
                alone = lease.run({"X": x})
            assert {k: v.tolist() for k, v in outputs.items()} == {
                k: v.tolist() for k, v in alone.items()
            }

    run_async(main)
    assert observer.calls == 1
    assert trace.calls == 1
    assert "the load observer failed on linear:1" in caplog.text
    assert "the trace of a run of linear:1 failed" in caplog.text
