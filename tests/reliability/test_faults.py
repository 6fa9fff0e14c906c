"""Faults in the model repository: one bad model never takes the others down.

Each test serves a repository of good models next to a faulty one through the real server
stack in-process: the HTTP app over an ASGI transport and the gRPC server on a loopback port,
on one Host. Requests to the faulty model must get a typed corral error (and its HTTP status
and gRPC code) while every request to the other models is answered correctly and the server
stays ready. Everything runs in one ``asyncio.run`` per test, so that grpc's and asyncio's
threads end with the test.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import shutil
from collections import Counter
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
import httpx
import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import corral
from corral import Host, ModelState
from corral.protocol import DataPlane
from corral.protocol.proto import grpc_service_pb2 as pb
from corral.protocol.proto import grpc_service_pb2_grpc as pb_grpc
from corral.server.grpc.service import start_grpc_server
from corral.server.http.app import HttpApp
from corral.server.observe.metrics import Metrics
from corral.testing import build_linear, build_mlp, build_tree
from tests.helpers import Figure, add_model, build_reshape, reference_run, run_freeing_frames

pytestmark = pytest.mark.timeout(60)

X = np.random.default_rng(5).standard_normal((2, 4)).astype(np.float32)
GOOD = {"mlp": build_mlp(seed=1), "tree": build_tree(seed=2), "linear": build_linear(seed=3)}
# What each good model answers to X, from a plain onnxruntime session.
_EXPECTED: dict[str, np.ndarray] = {}

_DATATYPES = {np.dtype(np.float32): "FP32", np.dtype(np.int64): "INT64"}
_CONTENTS = {"FP32": "fp32_contents", "INT64": "int64_contents"}
# A wait for the Host to notice a change on disk (polling every 50 ms) gives up after this.
CHANGE_SEEN_S = 20.0


def expected(name: str) -> np.ndarray:
    if name not in _EXPECTED:
        _EXPECTED[name] = reference_run(GOOD[name], {"X": X})[0]
    return _EXPECTED[name]


def build_gather() -> bytes:
    """Y[N, 3] = T[I[N]] for a 10-row table T: an index outside 0..9 fails inside onnxruntime.

    Every tensor has a dynamic first dimension, so requests to it are batched together.
    """
    table = numpy_helper.from_array(np.arange(30, dtype=np.float32).reshape(10, 3), "T")
    graph = helper.make_graph(
        [helper.make_node("Gather", ["T", "I"], ["Y"], axis=0)],
        "gather",
        [helper.make_tensor_value_info("I", TensorProto.INT64, ["N"])],
        [helper.make_tensor_value_info("Y", TensorProto.FLOAT, ["N", 3])],
        [table],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.checker.check_model(model)
    return model.SerializeToString()


def build_wide_linear(features: int = 4, outputs: int = 120_000) -> bytes:
    """Y = X @ W with W of 4 x 120,000 float32: about 2 MB of weights, 4 MB once loaded."""
    weights = numpy_helper.from_array(np.ones((features, outputs), np.float32), "W")
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["X", "W"], ["Y"])],
        "wide",
        [helper.make_tensor_value_info("X", TensorProto.FLOAT, ["N", features])],
        [helper.make_tensor_value_info("Y", TensorProto.FLOAT, ["N", outputs])],
        [weights],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model.SerializeToString()


# -- the server stack, in-process ------------------------------------------------------------


@dataclass
class Answer:
    """One request's answer: "200" or an HTTP status, "OK" or a gRPC code name."""

    transport: str
    model: str
    status: str
    output: np.ndarray | None
    message: str


@dataclass
class Stack:
    host: Host
    http: httpx.AsyncClient
    stub: pb_grpc.GRPCInferenceServiceStub

    async def ask(self, transport: str, model: str, inputs: dict[str, np.ndarray]) -> Answer:
        if transport == "http":
            return await self._ask_http(model, inputs)
        return await self._ask_grpc(model, inputs)

    async def _ask_http(self, model: str, inputs: dict[str, np.ndarray]) -> Answer:
        body = {
            "inputs": [
                {
                    "name": name,
                    "datatype": _DATATYPES[value.dtype],
                    "shape": list(value.shape),
                    "data": value.ravel().tolist(),
                }
                for name, value in inputs.items()
            ]
        }
        response = await self.http.post(f"/v2/models/{model}/infer", json=body)
        doc = response.json()
        if response.status_code != 200:
            return Answer("http", model, str(response.status_code), None, doc["error"])
        (out,) = doc["outputs"]
        output = np.array(out["data"], dtype=np.float32).reshape(out["shape"])
        return Answer("http", model, "200", output, "")

    async def _ask_grpc(self, model: str, inputs: dict[str, np.ndarray]) -> Answer:
        tensors = []
        for name, value in inputs.items():
            datatype = _DATATYPES[value.dtype]
            contents = pb.InferTensorContents(**{_CONTENTS[datatype]: value.ravel().tolist()})
            tensors.append(
                pb.ModelInferRequest.InferInputTensor(
                    name=name, datatype=datatype, shape=list(value.shape), contents=contents
                )
            )
        request = pb.ModelInferRequest(model_name=model, inputs=tensors)
        try:
            response = await self.stub.ModelInfer(request, timeout=30)
        except grpc.aio.AioRpcError as exc:
            return Answer("grpc", model, exc.code().name, None, exc.details() or "")
        (out,) = response.outputs
        raw = response.raw_output_contents[0]
        output = np.frombuffer(raw, dtype=np.float32).reshape(tuple(out.shape))
        return Answer("grpc", model, "OK", output, "")

    async def ready(self) -> tuple[bool, bool]:
        """(HTTP ready, gRPC ready)."""
        http = await self.http.get("/v2/health/ready")
        rpc = await self.stub.ServerReady(pb.ServerReadyRequest(), timeout=30)
        return http.status_code == 200, rpc.ready


@contextlib.asynccontextmanager
async def serving(root: Path, **host_options: Any) -> AsyncIterator[Stack]:
    async with contextlib.AsyncExitStack() as stack:
        host = Host(root, **host_options)
        stack.push_async_callback(asyncio.to_thread, host.close)
        plane = DataPlane(host)
        app = HttpApp(plane, metrics=Metrics(plane).render)
        http = await stack.enter_async_context(
            httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://corral")
        )
        server, port = await start_grpc_server(plane, "127.0.0.1", 0)
        stack.push_async_callback(server.stop, None)
        channel = grpc.aio.insecure_channel(f"127.0.0.1:{port}")
        stack.push_async_callback(channel.close)
        yield Stack(host, http, pb_grpc.GRPCInferenceServiceStub(channel))


def run(root: Path, scenario: Callable[[Stack], Awaitable[None]], **host_options: Any) -> None:
    async def main() -> None:
        async with serving(root, **host_options) as stack:
            await scenario(stack)

    run_freeing_frames(main)


def good_repository(root: Path) -> Path:
    for name, model in GOOD.items():
        add_model(root, name, model)
    return root


async def ask_good_models(stack: Stack) -> list[Answer]:
    asks = [stack.ask(t, name, {"X": X}) for name in GOOD for t in ("http", "grpc")]
    return list(await asyncio.gather(*asks))


def wrong_good_answers(answers: list[Answer]) -> list[str]:
    """Each answer from a good model that is not its exact output, described."""
    wrong = []
    for answer in answers:
        if answer.output is None:
            wrong.append(f"{answer.transport} {answer.model}: {answer.status} {answer.message}")
        elif not np.allclose(answer.output, expected(answer.model), rtol=1e-5, atol=1e-6):
            wrong.append(f"{answer.transport} {answer.model}: wrong output {answer.output}")
    return wrong


def statuses(answers: list[Answer]) -> str:
    counts = Counter(f"{a.transport} {a.status}" for a in answers)
    return ", ".join(f"{key} x{count}" for key, count in sorted(counts.items()))


# -- a model that cannot load ------------------------------------------------------------------


@dataclass(frozen=True)
class Broken:
    """A model that cannot be served, and what the Host and the servers must answer."""

    model: Callable[[], bytes]
    error: type[corral.CorralError]
    message: str
    host_options: dict[str, Any]


BROKEN = {
    "corrupt": Broken(
        lambda: np.random.default_rng(1).bytes(4096), corral.ModelLoadError, "could not load", {}
    ),
    "truncated": Broken(
        lambda: GOOD["mlp"][: len(GOOD["mlp"]) // 2], corral.ModelLoadError, "could not load", {}
    ),
    "empty_file": Broken(lambda: b"", corral.ModelLoadError, "could not load", {}),
    # 4 x 120,000 float32 weights: about 4 MB once loaded, against a budget of 2 MB that holds
    # every good model at once.
    "too_large_for_the_budget": Broken(
        build_wide_linear, corral.ModelTooLarge, "memory budget", {"memory_budget": "2MB"}
    ),
}


@pytest.mark.parametrize("case", list(BROKEN))
def test_a_model_that_cannot_load_gets_a_typed_error_and_the_others_serve(
    tmp_path: Path, case: str, figure: Figure
):
    broken = BROKEN[case]
    root = good_repository(tmp_path)
    add_model(root, "bad", broken.model())
    rounds = 20
    bad_answers: list[Answer] = []
    good_answers: list[Answer] = []
    not_ready: list[str] = []

    async def scenario(stack: Stack) -> None:
        for round_number in range(rounds):
            asks = [stack.ask(t, "bad", {"X": X}) for t in ("http", "grpc")]
            answers = await asyncio.gather(*asks, ask_good_models(stack))
            bad_answers.extend(answers[:2])
            good_answers.extend(answers[2])
            if await stack.ready() != (True, True):
                not_ready.append(f"round {round_number}")
        # The Host itself raises the typed error, and reports the failure.
        with pytest.raises(broken.error, match=broken.message):
            await asyncio.to_thread(stack.host.infer, "bad", {"X": X})
        status = stack.host.status("bad")
        reasons = [status.failure, *(version.failure for version in status.versions)]
        assert status.state is ModelState.FAILED, (case, status)
        assert any(broken.message in (r or "") for r in reasons), (case, status)
        index = await stack.http.post("/v2/repository/index")
        assert index.status_code == 200, (case, index.text)

    run(root, scenario, **broken.host_options)
    # Each fails alike until its file (or the budget) changes: not 503 (issue 33, item 6).
    wanted = {"http 400", "grpc FAILED_PRECONDITION"}
    got = {f"{a.transport} {a.status}" for a in bad_answers}
    assert got == wanted, f"{case}: requests to the broken model got {statuses(bad_answers)}"
    unnamed = [a.message for a in bad_answers if broken.message not in a.message]
    assert not unnamed, f"{case}: errors that do not say what was wrong: {unnamed[:3]}"
    wrong = wrong_good_answers(good_answers)
    assert not wrong, f"{case}: other models failed while 'bad' was broken: {wrong[:5]}"
    assert not not_ready, f"{case}: the server was not ready in {not_ready}"
    bad, good = len(bad_answers), len(good_answers)
    figure("requests to the broken model answered 400 / FAILED_PRECONDITION", f"{bad} / {bad}")
    figure("requests to the 3 other models answered correctly", f"{good} / {good}")
    figure("server ready after each round", f"{rounds - len(not_ready)} / {rounds}")


# -- a model that fails inside onnxruntime on some inputs ------------------------------------


@dataclass(frozen=True)
class Poisoned:
    """A model that runs on most inputs and fails inside onnxruntime on some."""

    model: Callable[[], bytes]
    toml: str | None
    clean: Callable[[int], dict[str, np.ndarray]]
    poison: Callable[[int], dict[str, np.ndarray]]
    answer: Callable[[int], np.ndarray]
    statuses: set[str]
    error: type[corral.CorralError]


POISONED = {
    # Batched: a batch window makes concurrent requests share runs, so a poisoned request
    # sits in the same batch as clean ones.
    "gather_index_out_of_range": Poisoned(
        build_gather,
        "batch_window_us = 20000\n",
        lambda i: {"I": np.array([i % 10], np.int64)},
        lambda i: {"I": np.array([99 + i], np.int64)},
        lambda i: np.arange(30, dtype=np.float32).reshape(10, 3)[[i % 10]],
        {"http 400", "grpc INVALID_ARGUMENT"},
        corral.InvalidInput,
    ),
    # Not batchable (S has a fixed shape): each request runs alone.
    "reshape_to_an_impossible_shape": Poisoned(
        build_reshape,
        None,
        lambda i: {"X": np.full(4, i, np.float32), "S": np.array([4], np.int64)},
        lambda i: {"X": np.full(4, i, np.float32), "S": np.array([3], np.int64)},
        lambda i: np.full(4, i, np.float32),
        {"http 500", "grpc INTERNAL"},
        corral.InferenceError,
    ),
}


@pytest.mark.parametrize("case", list(POISONED))
def test_a_model_failing_on_some_inputs_fails_only_those(tmp_path: Path, case: str, figure: Figure):
    poisoned = POISONED[case]
    root = good_repository(tmp_path)
    add_model(root, "flaky", poisoned.model(), toml=poisoned.toml)
    rounds, per_round = 10, 16
    wrong_clean: list[str] = []
    poison_answers: list[Answer] = []
    good_answers: list[Answer] = []
    ready_rounds = 0
    batched_runs = 0

    async def scenario(stack: Stack) -> None:
        nonlocal ready_rounds, batched_runs
        for round_number in range(rounds):
            asks = []
            for i in range(per_round):
                transport = ("http", "grpc")[(i // 4) % 2]  # poisoned ones on both
                inputs = poisoned.poison(i) if i % 4 == 3 else poisoned.clean(i)
                asks.append(stack.ask(transport, "flaky", inputs))
            answers = await asyncio.gather(*asks, ask_good_models(stack))
            good_answers.extend(answers[-1])
            for i, answer in enumerate(answers[:-1]):
                if i % 4 == 3:
                    poison_answers.append(answer)
                elif answer.output is None or not np.array_equal(
                    answer.output.ravel(), poisoned.answer(i).ravel()
                ):
                    wrong_clean.append(
                        f"round {round_number} request {i} ({answer.transport}): "
                        f"{answer.status} {answer.message or answer.output}"
                    )
            ready_rounds += await stack.ready() == (True, True)
        with pytest.raises(poisoned.error, match="flaky"):
            await asyncio.to_thread(stack.host.infer, "flaky", poisoned.poison(0))
        # Cumulative counts of runs by rows: all runs minus those of one row.
        buckets = stack.host.queue_stats()[("flaky", 1)].batch_rows_buckets
        batched_runs = buckets[-1][1] - dict(buckets)[1]

    run(root, scenario)
    got = {f"{a.transport} {a.status}" for a in poison_answers}
    assert got == poisoned.statuses, f"{case}: poisoned requests got {statuses(poison_answers)}"
    unnamed = [a.message for a in poison_answers if "flaky" not in a.message]
    assert not unnamed, f"{case}: errors that do not name the model: {unnamed[:3]}"
    assert not wrong_clean, f"{case}: clean requests to the same model failed: {wrong_clean[:5]}"
    wrong = wrong_good_answers(good_answers)
    assert not wrong, f"{case}: other models failed: {wrong[:5]}"
    assert ready_rounds == rounds, f"{case}: not ready after {rounds - ready_rounds} rounds"
    clean = rounds * per_round - len(poison_answers)
    status = "/".join(sorted(s.split()[1] for s in poisoned.statuses))
    figure(f"poisoned requests answered {status}", f"{len(poison_answers)} / {len(poison_answers)}")
    figure("clean requests to the same model answered correctly", f"{clean} / {clean}")
    good = len(good_answers)
    figure("requests to the 3 other models answered correctly", f"{good} / {good}")
    if poisoned.toml is not None:
        assert batched_runs > 0, f"{case}: no batch of several requests was formed"
        figure("runs of several requests batched together", batched_runs)


# -- a model whose file changes while requests run -------------------------------------------


@dataclass(frozen=True)
class Change:
    """A change to the served model's files, and what requests must get during and after."""

    apply: Callable[[Path], None]
    #: What a request may get while the change lands: outputs of "old" or "new", or errors.
    during: set[str]
    #: What requests get once the Host has seen the change.
    after: set[str]
    #: What requests get after an explicit unload (the Host loads from the files again).
    after_unload: set[str]


def _replace(path: Path, data: bytes) -> None:
    spare = path.with_name("model.onnx.new")
    spare.write_bytes(data)
    os.replace(spare, path)


def _truncate(path: Path) -> None:
    with path.open("r+b") as file:
        file.truncate(path.stat().st_size // 2)


CHANGES = {
    "replaced_by_a_new_model": Change(
        lambda p: _replace(p, build_mlp(seed=9)),
        during={"old", "new"},
        after={"new"},
        after_unload={"new"},
    ),
    # A bad edit does not take a serving model down: the copy in use keeps serving, and a
    # fresh load gives the typed error.
    "replaced_by_garbage": Change(
        lambda p: _replace(p, b"\x08garbage" * 100),
        during={"old"},
        after={"old"},
        after_unload={"http 400", "grpc FAILED_PRECONDITION"},
    ),
    "truncated_in_place": Change(
        _truncate,
        during={"old"},
        after={"old"},
        after_unload={"http 400", "grpc FAILED_PRECONDITION"},
    ),
    "model_file_deleted": Change(
        lambda p: p.unlink(),
        during={"old"},
        after={"old"},
        after_unload={"http 400", "grpc FAILED_PRECONDITION"},
    ),
    # The model is gone from the repository: unloaded, then unknown.
    "model_folder_deleted": Change(
        lambda p: shutil.rmtree(p.parent.parent),
        during={"old", "http 404", "grpc NOT_FOUND"},
        after={"http 404", "grpc NOT_FOUND"},
        after_unload={"http 404", "grpc NOT_FOUND"},
    ),
}


def _kind(answer: Answer, old: np.ndarray, new: np.ndarray) -> str:
    if answer.output is None:
        return f"{answer.transport} {answer.status}"
    if np.allclose(answer.output, old, rtol=1e-5, atol=1e-6):
        return "old"
    if np.allclose(answer.output, new, rtol=1e-5, atol=1e-6):
        return "new"
    return f"{answer.transport} wrong output"


def _change_seen(host: Host, case: str) -> bool:
    if case == "model_folder_deleted":
        try:
            host.status("served")
        except corral.ModelNotFound:
            return True
        return False
    if case == "replaced_by_a_new_model":
        return host.stats().reloads >= 1
    return host.status("served").failure is not None


@pytest.mark.parametrize("case", list(CHANGES))
def test_a_model_changed_under_running_requests(tmp_path: Path, case: str, figure: Figure):
    change = CHANGES[case]
    root = good_repository(tmp_path)
    path = add_model(root, "served", build_mlp(seed=1))
    old = expected("mlp")
    new = reference_run(build_mlp(seed=9), {"X": X})[0]
    during: list[str] = []
    after: list[str] = []
    after_unload: list[str] = []
    good_answers: list[Answer] = []
    not_ready = 0

    async def client(stack: Stack, index: int, stop: asyncio.Event, seen: asyncio.Event) -> None:
        transport = ("http", "grpc")[index % 2]
        other = list(GOOD)[index % len(GOOD)]
        while not stop.is_set():
            # Counted as "after" only if sent once the Host had seen the change.
            sent_after = seen.is_set()
            mine, theirs = await asyncio.gather(
                stack.ask(transport, "served", {"X": X}), stack.ask(transport, other, {"X": X})
            )
            (after if sent_after else during).append(_kind(mine, old, new))
            good_answers.append(theirs)
            if len(after) >= 40:
                stop.set()

    async def scenario(stack: Stack) -> None:
        nonlocal not_ready
        await stack.ask("http", "served", {"X": X})  # loaded and served before the change
        stop, seen = asyncio.Event(), asyncio.Event()
        clients = [asyncio.create_task(client(stack, i, stop, seen)) for i in range(4)]
        try:
            change.apply(path)
            loop = asyncio.get_running_loop()
            give_up = loop.time() + CHANGE_SEEN_S
            while not await asyncio.to_thread(_change_seen, stack.host, case):
                assert loop.time() < give_up, f"{case}: the Host did not see the change"
                if await stack.ready() != (True, True):
                    not_ready += 1
                await asyncio.sleep(0.01)
            seen.set()
            await asyncio.wait_for(stop.wait(), timeout=30)
        finally:
            stop.set()
            await asyncio.gather(*clients)
        if await stack.ready() != (True, True):
            not_ready += 1
        unload = await stack.http.post("/v2/repository/models/served/unload")
        assert unload.status_code in (200, 400, 404), (case, unload.text)
        for transport in ("http", "grpc", "http", "grpc"):
            answer = await stack.ask(transport, "served", {"X": X})
            after_unload.append(_kind(answer, old, new))
            assert answer.status in ("200", "OK") or "served" in answer.message, (case, answer)

    run(root, scenario, poll_interval_s=0.05)
    assert set(during) <= change.during, f"{case}: while the change landed: {Counter(during)}"
    assert set(after) == change.after, f"{case}: once the change was seen: {Counter(after)}"
    assert set(after_unload) == change.after_unload, f"{case}: after unload: {after_unload}"
    wrong = wrong_good_answers(good_answers)
    assert not wrong, f"{case}: other models failed while 'served' changed: {wrong[:5]}"
    assert not_ready == 0, f"{case}: the server was not ready {not_ready} times"
    answered = len(during) + len(after)
    figure("requests to the changed model", f"{answered}: {dict(Counter(during + after))}")
    figure("after an unload, requests get", ", ".join(sorted(set(after_unload))))
    figure("requests to other models answered correctly", f"{len(good_answers)} / {answered}")


# -- the repository folder disappears and comes back -----------------------------------------


def test_the_repository_folder_disappears_and_comes_back(
    tmp_path: Path, figure: Figure, caplog: pytest.LogCaptureFixture
):
    root = good_repository(tmp_path / "repository")
    away = tmp_path / "moved-away"
    served = ["mlp", "tree"]  # loaded before the folder goes; "linear" is not
    answers: dict[str, list[Answer]] = {"before": [], "gone": [], "back": []}
    index_status: dict[str, int] = {}
    ready: dict[str, tuple[bool, bool]] = {}

    async def round_of(stack: Stack, phase: str) -> None:
        names = served if phase == "before" else list(GOOD)
        asks = [stack.ask(t, name, {"X": X}) for name in names for t in ("http", "grpc")]
        answers[phase].extend(await asyncio.gather(*asks))
        index_status[phase] = (await stack.http.post("/v2/repository/index")).status_code
        ready[phase] = await stack.ready()

    async def scenario(stack: Stack) -> None:
        await round_of(stack, "before")
        os.rename(root, away)
        # Polling looks at the served models every 50 ms: wait until it has found the
        # repository gone at least twice, so that a poll that would unload them has run.
        loop = asyncio.get_running_loop()
        give_up = loop.time() + CHANGE_SEEN_S
        while sum("is gone" in r.getMessage() for r in caplog.records) < 2:
            assert loop.time() < give_up, "polling never found the repository gone"
            await asyncio.sleep(0.01)
        for _ in range(5):
            await round_of(stack, "gone")
        os.rename(away, root)
        for _ in range(5):
            await round_of(stack, "back")

    with caplog.at_level(logging.WARNING, logger="corral"):
        run(root, scenario, poll_interval_s=0.05)
    assert index_status == {"before": 200, "gone": 503, "back": 200}, index_status
    assert set(ready.values()) == {(True, True)}, f"not ready: {ready}"
    for phase in ("before", "back"):
        wrong = wrong_good_answers(answers[phase])
        assert not wrong, f"{phase}: {wrong[:5]}"
    gone_served = [a for a in answers["gone"] if a.model in served]
    wrong = wrong_good_answers(gone_served)
    assert not wrong, f"loaded models stopped serving while the repository was gone: {wrong[:5]}"
    unloaded = [a for a in answers["gone"] if a.model not in served]
    got = {f"{a.transport} {a.status}" for a in unloaded}
    assert got == {"http 503", "grpc UNAVAILABLE"}, f"while gone: {statuses(unloaded)}"
    assert all("is gone" in a.message for a in unloaded), unloaded[0].message
    figure("loaded models answered while the folder was gone", f"{len(gone_served)} / 20")
    figure("unloaded model while gone: typed 503 / UNAVAILABLE", f"{len(unloaded)} / 10")
    figure("repository index while gone", "503 (RepositoryError)")
    figure("all models answered once it came back", f"{len(answers['back'])} / 30")
