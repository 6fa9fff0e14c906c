"""benchmarks/http_bench.py and its two reference apps, without wrk and without servers.

The reference apps answer in-process through httpx's ASGI transport, next to corral's own
HttpApp, on one tiny model: all three must give onnxruntime's outputs for the payload the
benchmark sends. The benchmark's payload builders and result parsing are checked on canned
wrk output.
"""

from __future__ import annotations

import asyncio
import importlib.util
import json
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import orjson
import pytest

import corral
from corral._onnx import ort as _ort
from corral.protocol.dataplane import DataPlane
from corral.server.http.app import HttpApp
from tests.helpers import add_model, load_benchmark, run_benchmark

MODEL = "tree"

http_bench = load_benchmark("http_bench.py")
raw_asgi = load_benchmark("reference/raw_asgi.py")
fastapi_app = load_benchmark("reference/fastapi_app.py")


@pytest.fixture
def session(tree_model: bytes) -> Any:
    # Sessions in this process must use corral's global pools (see conftest.py): the
    # reference apps take the session they serve, so they get one made that way.
    corral.runtime().start()
    return _ort.create_session(
        tree_model, _ort.session_options(arena="off"), ["CPUExecutionProvider"]
    )


@pytest.fixture
def features() -> np.ndarray:
    return http_bench.make_features(3, 4, seed=5)


@pytest.fixture
def expected(session: Any, features: np.ndarray) -> np.ndarray:
    return session.run(None, {"X": features})[0]


def _post(app: Any, path: str, content: bytes, headers: dict[str, str]) -> httpx.Response:
    async def post() -> httpx.Response:
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://bench") as client:
            return await client.post(path, content=content, headers=headers)

    return asyncio.run(post())


def _infer(app: Any, payload: Any, model: str = MODEL) -> httpx.Response:
    return _post(app, f"/v2/models/{model}/infer", payload.body, payload.headers())


@pytest.fixture(params=["raw-asgi", "fastapi-sync", "fastapi-async"])
def reference_app(request: pytest.FixtureRequest, session: Any) -> Any:
    if request.param == "raw-asgi":
        return raw_asgi.RawInferApp(session, MODEL)
    return fastapi_app.build_app(session, MODEL, request.param.removeprefix("fastapi-"))


def test_reference_apps_answer_like_onnxruntime(
    reference_app: Any, features: np.ndarray, expected: np.ndarray
) -> None:
    response = _infer(reference_app, http_bench.json_payload(features))
    assert response.status_code == 200, response.text
    document = response.json()
    assert document["model_name"] == MODEL
    (output,) = document["outputs"]
    assert output["name"] == "Y"
    assert output["datatype"] == "FP32"
    assert output["shape"] == list(expected.shape)
    np.testing.assert_allclose(output["data"], expected.ravel(), rtol=1e-6)
    decoded = http_bench.decode_outputs(response.content)
    np.testing.assert_allclose(decoded["Y"], expected.ravel(), rtol=1e-6)


def test_reference_apps_take_nested_data(
    reference_app: Any, features: np.ndarray, expected: np.ndarray
) -> None:
    body = {"inputs": [{"name": "X", "datatype": "FP32", "shape": [3, 4]}]}
    body["inputs"][0]["data"] = features.tolist()
    response = _post(
        reference_app,
        f"/v2/models/{MODEL}/infer",
        json.dumps(body).encode(),
        {"Content-Type": "application/json"},
    )
    assert response.status_code == 200, response.text
    np.testing.assert_allclose(response.json()["outputs"][0]["data"], expected.ravel(), rtol=1e-6)


def test_reference_apps_refuse_other_models_and_bad_bodies(
    reference_app: Any, features: np.ndarray
) -> None:
    assert (
        _infer(reference_app, http_bench.json_payload(features), model="other").status_code == 404
    )
    bad = _post(
        reference_app,
        f"/v2/models/{MODEL}/infer",
        b'{"inputs": "nope"}',
        {"Content-Type": "application/json"},
    )
    assert bad.status_code in (400, 422)  # FastAPI answers validation errors with 422


def test_corral_answers_the_same_payloads(
    tmp_path: Path, tree_model: bytes, features: np.ndarray, expected: np.ndarray
) -> None:
    add_model(tmp_path, MODEL, tree_model)
    with corral.Host(tmp_path) as host:
        app = HttpApp(DataPlane(host))
        for payload in (http_bench.json_payload(features), http_bench.binary_payload(features)):
            response = _infer(app, payload)
            assert response.status_code == 200, response.text
            length = response.headers.get("inference-header-content-length")
            outputs = http_bench.decode_outputs(
                response.content, None if length is None else int(length)
            )
            np.testing.assert_allclose(outputs["Y"], expected.ravel(), rtol=1e-6)


def test_json_payload_is_the_v2_body(features: np.ndarray) -> None:
    payload = http_bench.json_payload(features)
    assert payload.header_length is None
    assert payload.headers() == {"Content-Type": "application/json"}
    (tensor,) = orjson.loads(payload.body)["inputs"]
    assert tensor["name"] == "X"
    assert tensor["datatype"] == "FP32"
    assert tensor["shape"] == [3, 4]
    # orjson writes float32 in its shortest form, which reads back to the same float32.
    np.testing.assert_array_equal(np.asarray(tensor["data"], np.float32), features.ravel())


def test_binary_payload_is_json_then_raw_bytes(features: np.ndarray) -> None:
    payload = http_bench.binary_payload(features)
    length = payload.header_length
    assert length is not None
    assert payload.headers()["Inference-Header-Content-Length"] == str(length)
    header = orjson.loads(payload.body[:length])
    (tensor,) = header["inputs"]
    assert "data" not in tensor
    assert tensor["parameters"] == {"binary_data_size": features.nbytes}
    assert header["parameters"] == {"binary_data_output": True}
    assert payload.body[length:] == features.astype("<f4").tobytes()


def test_decode_outputs_reads_binary_outputs() -> None:
    values = np.array([1.5, -2.0], np.float32)
    header = orjson.dumps(
        {
            "model_name": "m",
            "outputs": [
                {"name": "A", "datatype": "FP32", "shape": [1], "data": [3.0]},
                {
                    "name": "B",
                    "datatype": "FP32",
                    "shape": [2],
                    "parameters": {"binary_data_size": 8},
                },
            ],
        }
    )
    outputs = http_bench.decode_outputs(header + values.tobytes(), len(header))
    np.testing.assert_array_equal(outputs["A"], [3.0])
    np.testing.assert_array_equal(outputs["B"], values)


def test_grpc_request_and_response_round_trip(features: np.ndarray) -> None:
    messages = http_bench._triton_messages()
    request = messages.ModelInferRequest.FromString(http_bench.grpc_request(MODEL, features))
    assert request.model_name == MODEL
    assert [(t.name, t.datatype, list(t.shape)) for t in request.inputs] == [("X", "FP32", [3, 4])]
    assert request.raw_input_contents[0] == features.astype("<f4").tobytes()
    response = messages.ModelInferResponse(model_name=MODEL)
    response.outputs.add(name="Y", datatype="FP32", shape=[3, 1])
    response.raw_output_contents.append(np.arange(3, dtype="<f4").tobytes())
    outputs = http_bench.grpc_outputs(response.SerializeToString())
    np.testing.assert_array_equal(outputs["Y"], [0.0, 1.0, 2.0])


WRK_OUTPUT = """\
Running 5s test @ http://127.0.0.1:8000/v2/models/tree/infer
  2 threads and 16 connections
Requests/sec:  10000.00
CORRAL_WRK_RESULT {"duration_us":5000000,"requests":50000,"bytes":1,"errors":{"connect":0,\
"read":1,"write":0,"status":0,"timeout":2},"latency_us":{"mean":1500.5,"p50":1200,\
"p90":2500,"p99":9000,"max":20000}}
"""


def test_parse_result_reads_the_lua_scripts_line() -> None:
    result = http_bench.run_result("raw-asgi", 2, http_bench.parse_result(WRK_OUTPUT))
    assert result["target"] == "raw-asgi"
    assert result["round"] == 2
    assert result["requests"] == 50000
    assert result["requests_per_s"] == pytest.approx(10000.0)
    assert result["latency_p50_ms"] == pytest.approx(1.2)
    assert result["latency_p99_ms"] == pytest.approx(9.0)
    assert result["socket_errors"] == 3
    assert result["status_errors"] == 0
    # The script prints the marker the parser looks for.
    assert http_bench.RESULT_MARKER.strip() in http_bench.LUA_SCRIPT.read_text()


def test_parse_result_without_the_line_says_so() -> None:
    with pytest.raises(http_bench.BenchmarkError, match="CORRAL_WRK_RESULT"):
        http_bench.parse_result("unable to connect to 127.0.0.1:1 Connection refused\n")


def _run(target: str, round_index: int, rate: float, p50: float = 1.0) -> Any:
    figures = {
        "duration_us": 1_000_000,
        "requests": int(rate),
        "bytes": 0,
        "errors": {"connect": 0, "read": 0, "write": 0, "status": 0, "timeout": 0},
        "latency_us": {"mean": 1000 * p50, "p50": 1000 * p50, "p90": 0, "p99": 3000, "max": 0},
    }
    return http_bench.run_result(target, round_index, figures)


def test_summarize_takes_medians_and_paired_ratios() -> None:
    runs = [
        _run("corral-json", 1, 800),
        _run("raw-asgi", 1, 1000),
        _run("fastapi-sync", 1, 200),
        _run("fastapi-async", 1, 400),
        _run("corral-json", 2, 400, p50=3.0),  # a noisy round hits every target alike
        _run("raw-asgi", 2, 500),
        _run("fastapi-sync", 2, 100),
        _run("fastapi-async", 2, 200),
        _run("corral-json", 3, 900, p50=2.0),
        _run("raw-asgi", 3, 1000),
        _run("fastapi-sync", 3, 300),
        _run("fastapi-async", 3, 300),
    ]
    rows = {row["target"]: row for row in http_bench.summarize(runs)}
    assert list(rows) == ["corral-json", "raw-asgi", "fastapi-sync", "fastapi-async"]
    corral_row = rows["corral-json"]
    assert corral_row["requests_per_s"] == 800
    assert (corral_row["requests_per_s_min"], corral_row["requests_per_s_max"]) == (400, 900)
    assert corral_row["latency_p50_ms"] == 2.0
    assert corral_row["ratios"]["raw-asgi"] == pytest.approx(0.8)  # median of 0.8, 0.8, 0.9
    assert corral_row["ratios"]["fastapi-sync"] == pytest.approx(4.0)  # median of 4, 4, 3
    assert corral_row["ratios"]["fastapi-async"] == pytest.approx(2.0)  # median of 2, 2, 3
    assert rows["raw-asgi"]["ratios"]["raw-asgi"] == pytest.approx(1.0)

    checks = {c["baseline"]: c for c in http_bench.check_targets(list(rows.values()))}
    assert checks["raw-asgi"]["met"]
    assert checks["fastapi-sync"]["met"]
    assert "fastapi-async" not in checks  # reported beside, without a goal
    verdict = http_bench.format_verdict(list(checks.values())).splitlines()
    assert verdict[0] == "corral-json / raw-asgi = 0.80x (goal >= 0.75x: met)"
    assert verdict[1] == "corral-json / fastapi-sync = 4.00x (goal >= 4x: met)"
    table = http_bench.format_table(list(rows.values()))
    assert "| corral-json | 800 | 400 - 900 | 2.00 | 3.00 | 0.80x | 4.00x | 2.00x |" in table


def test_check_targets_without_a_baseline_is_a_miss() -> None:
    rows = http_bench.summarize([_run("corral-json", 1, 500), _run("raw-asgi", 1, 1000)])
    checks = {c["baseline"]: c for c in http_bench.check_targets(rows)}
    assert checks["raw-asgi"]["ratio"] == pytest.approx(0.5)
    assert not checks["raw-asgi"]["met"]
    assert checks["fastapi-sync"]["ratio"] is None
    assert not checks["fastapi-sync"]["met"]
    assert "= - (goal >= 4x: MISSED)" in http_bench.format_verdict(list(checks.values()))


def test_wrk_command_posts_the_body_file(tmp_path: Path, features: np.ndarray) -> None:
    payload = http_bench.binary_payload(features)
    command = http_bench.wrk_command(
        "wrk",
        "http://127.0.0.1:1/v2/models/tree/infer",
        tmp_path / "body",
        payload,
        connections=16,
        threads=2,
        duration_s=4.5,
    )
    assert command[:4] == ["wrk", "-t2", "-c16", "-d5s"]
    script = command.index("-s") + 1
    assert command[script] == str(http_bench.LUA_SCRIPT)
    assert command[script + 1 :] == [
        "http://127.0.0.1:1/v2/models/tree/infer",
        "--",
        str(tmp_path / "body"),
        "application/octet-stream",
        str(payload.header_length),
    ]


def test_missing_wrk_names_the_package(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(http_bench.shutil, "which", lambda name: None)
    assert http_bench.main(["--rounds", "1"]) == 2
    message = capsys.readouterr().err
    assert "wrk" in message
    assert "apt-get install -y wrk" in message


def test_loop_cost_prices_each_target_per_request_in_process():
    # benchmarks/loop_cost.py: a quick run in its own process (it makes its own Host and
    # the raw app's own session); every target must answer every request 200 on keep-alive
    # connections, else it fails.
    done = run_benchmark(
        "loop_cost.py", ["--requests", "200", "--rounds", "1", "--concurrency", "4"]
    )
    assert done.returncode == 0, done.stderr
    rows = {line.split()[0]: line.split()[1:] for line in done.stdout.splitlines()[1:4]}
    assert set(rows) == {"raw", "corral", "corral-asgi"}, done.stdout
    for cpu_us, per_second in rows.values():
        assert float(cpu_us) > 0
        assert int(per_second.replace(",", "")) > 0
    assert "raw's loop CPU per request / corral's:" in done.stdout
    assert "raw's loop CPU per request / corral-asgi's:" in done.stdout


# -- the Triton peer (benchmarks/peers/triton_ort.py): its pure parts, no Triton needed ------

triton_ort = load_benchmark("peers/triton_ort.py")


def test_proc_stat_is_read_past_a_command_name_with_spaces_and_parentheses() -> None:
    # Fields 14 and 15 (utime, stime) count from the last ")": a name like "a) (b" must not
    # shift them.
    fields = " ".join(str(n) for n in range(3, 53))  # field n holds n
    assert triton_ort.parse_proc_stat(f"1234 (a) (b c) {fields}") == (14, 15)
    with pytest.raises(ValueError, match="stat"):
        triton_ort.parse_proc_stat("1234 no parentheses")
    with pytest.raises(ValueError, match="short"):
        triton_ort.parse_proc_stat("1234 (x) S 1 2")


def test_process_cpu_seconds_reads_this_process_like_process_time() -> None:
    import os
    import time

    seconds = triton_ort.process_cpu_seconds(os.getpid())
    # Both count every thread's user + system time; /proc's in clock ticks (10 ms).
    assert seconds == pytest.approx(time.process_time(), abs=0.1)
    user, system = triton_ort.process_cpu_split(os.getpid())
    times = os.times()
    assert user == pytest.approx(times.user, abs=0.1)
    assert system == pytest.approx(times.system, abs=0.1)


def test_config_pbtxt_declares_the_models_signature(tmp_path: Path, tree_model: bytes) -> None:
    folder = tmp_path / MODEL
    (folder / "1").mkdir(parents=True)
    (folder / "1" / "model.onnx").write_bytes(tree_model)
    assert triton_ort.write_configs(tmp_path) == [MODEL]
    text = (folder / "config.pbtxt").read_text()
    assert text == (
        f'name: "{MODEL}"\n'
        'platform: "onnxruntime_onnx"\n'
        "max_batch_size: 0\n"
        "input [\n"
        '  { name: "X", data_type: TYPE_FP32, dims: [ -1, 4 ] }\n'
        "]\n"
        "output [\n"
        '  { name: "Y", data_type: TYPE_FP32, dims: [ -1, 1 ] }\n'
        "]\n"
    )
    # corral reads it as Triton does: never batched, its default concurrency.
    from corral._models.pbtxt.parse import parse_pbtxt

    config = parse_pbtxt(
        text, source="config.pbtxt", model_name=MODEL, read_labels=lambda path, field: ()
    )
    assert config.max_batch_size == 0
    # A folder that has one keeps it.
    assert triton_ort.write_configs(tmp_path) == []


def test_config_pbtxt_sets_the_instance_count_and_refuses_a_scalar() -> None:
    spec = triton_ort.TensorSpec
    inputs = [spec("input", "TYPE_FP32", (-1, 576)), spec("state", "TYPE_FP32", (2, -1, 128))]
    outputs = [spec("output", "TYPE_FP32", (-1, 1))]
    text = triton_ort.config_pbtxt("vad", inputs, outputs, instance_count=1)
    assert '  { name: "state", data_type: TYPE_FP32, dims: [ 2, -1, 128 ] }' in text
    assert text.endswith("instance_group [ { kind: KIND_CPU, count: 1 } ]\n")
    from corral._models.pbtxt.parse import parse_pbtxt

    config = parse_pbtxt(
        text, source="config.pbtxt", model_name="vad", read_labels=lambda path, field: ()
    )
    assert config.max_batch_size == 0
    # Triton 2.51 loads no scalar tensor in a model that is not batched (silero-vad's sr).
    with pytest.raises(triton_ort.PeerUnavailable, match=r"scalar tensor .*\(sr\)"):
        triton_ort.config_pbtxt("vad", [*inputs, spec("sr", "TYPE_INT64", ())], outputs)


def test_write_configs_refuses_a_model_toml(tmp_path: Path, tree_model: bytes) -> None:
    folder = tmp_path / MODEL
    (folder / "1").mkdir(parents=True)
    (folder / "1" / "model.onnx").write_bytes(tree_model)
    (folder / "model.toml").write_text("max_batch_size = 0\n")
    with pytest.raises(triton_ort.PeerUnavailable, match=r"model\.toml"):
        triton_ort.write_configs(tmp_path)
    assert not (folder / "config.pbtxt").exists()


def _fake_build(home: Path) -> None:
    server = home / "venv" / "bin" / "tritonserver"
    server.parent.mkdir(parents=True)
    server.write_text("#!/bin/sh\n")
    server.chmod(0o755)
    backend = home / "backends" / "onnxruntime" / "libtriton_onnxruntime.so"
    backend.parent.mkdir(parents=True)
    backend.write_bytes(b"")
    stamp = {"server": str(server), "backends": str(home / "backends"), "branch": "r24.10"}
    (home / triton_ort.STAMP).write_text(json.dumps(stamp))


def test_find_build_says_what_is_missing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(triton_ort.HOME_ENV, str(tmp_path))
    assert triton_ort.triton_home() == tmp_path
    with pytest.raises(triton_ort.PeerUnavailable, match=r"no corral-triton\.json in"):
        triton_ort.find_build()
    _fake_build(tmp_path)
    build = triton_ort.find_build()
    assert build.server == tmp_path / "venv" / "bin" / "tritonserver"
    assert "r24.10" in build.describe()
    (tmp_path / "backends" / "onnxruntime" / "libtriton_onnxruntime.so").unlink()
    with pytest.raises(triton_ort.PeerUnavailable, match=r"libtriton_onnxruntime\.so"):
        triton_ort.find_build()


def test_triton_runs_on_loopback_with_complete_configs_and_one_pool(tmp_path: Path) -> None:
    _fake_build(tmp_path)
    argv = triton_ort.triton_argv(triton_ort.find_build(tmp_path), tmp_path / "repo", 1, 2, 3)
    assert argv[0] == str(tmp_path / "venv" / "bin" / "tritonserver")
    for flag in (
        f"--model-repository={tmp_path / 'repo'}",
        "--http-address=127.0.0.1",
        "--grpc-address=127.0.0.1",
        "--metrics-address=127.0.0.1",
        "--http-port=1",
        "--grpc-port=2",
        "--metrics-port=3",
        "--disable-auto-complete-config",
        "--backend-config=onnxruntime,enable-global-threadpool=1",
        "--backend-config=onnxruntime,intra_op_thread_count=1",
        "--backend-config=onnxruntime,inter_op_thread_count=1",
    ):
        assert flag in argv


def test_without_triton_a_line_says_so_and_a_triton_only_run_stops(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv(triton_ort.HOME_ENV, str(tmp_path / "nothing"))
    home, note = http_bench.triton_home_or_note(())
    assert home is None
    assert note is not None
    assert note.startswith("Triton: not built (no corral-triton.json in")
    assert "make triton-peer" in note
    # Targets without Triton's: nothing to say.
    assert http_bench.triton_home_or_note(["corral-json"]) == (None, None)
    monkeypatch.setattr(http_bench.shutil, "which", lambda name: "/usr/bin/wrk")
    assert http_bench.main(["--targets", "triton-json"]) == 2
    assert "Triton: not built" in capsys.readouterr().err
    _fake_build(tmp_path / "built")
    monkeypatch.setenv(triton_ort.HOME_ENV, str(tmp_path / "built"))
    assert http_bench.triton_home_or_note(["triton-json"]) == (str(tmp_path / "built"), None)


def test_targets_start_only_their_servers() -> None:
    settings = http_bench.Settings(targets=("corral-json", "triton-binary"), triton_home="/t")
    assert http_bench.wanted_servers(settings) == ["corral", "triton"]
    every = list(http_bench.SERVERS)
    if importlib.util.find_spec("corral_edge") is None:
        every.remove("corral-native")  # measured only where the native edge is built
    assert http_bench.wanted_servers(http_bench.Settings()) == every
    unbuilt = http_bench.Settings(targets=("corral-json", "triton-json", "corral-pbtxt"))
    assert http_bench.wanted_servers(unbuilt) == ["corral"]
    # corral on Triton's copy of the repository (its config.pbtxt) runs only beside Triton.
    built = http_bench.Settings(targets=("triton-json", "corral-pbtxt"), triton_home="/t")
    assert http_bench.wanted_servers(built) == ["triton", "corral-pbtxt"]


def test_the_triton_table_pairs_each_load_round_by_round() -> None:
    def run(target: str, round_index: int, rate: float, cpu_s: float | None) -> Any:
        figures = {
            "duration_us": 1_000_000,
            "requests": int(rate),
            "bytes": 0,
            "errors": {"connect": 0, "read": 0, "write": 0, "status": 0, "timeout": 0},
            "latency_us": {"mean": 1000, "p50": 1000, "p90": 0, "p99": 2000, "max": 0},
        }
        user_s = None if cpu_s is None else cpu_s / 2  # half the CPU in user space
        return http_bench.run_result(target, round_index, figures, cpu_s, user_s)

    runs = [
        run("corral-json", 1, 600, 0.06),  # 100 µs per request
        run("triton-json", 1, 1000, 0.04),  # 40 µs
        run("corral-json", 2, 300, 0.03),  # a noisy round, both slow
        run("triton-json", 2, 400, 0.016),
        run("corral-binary", 1, 500, None),
    ]
    assert runs[0]["server_cpu_us_per_request"] == pytest.approx(100.0)
    assert runs[4]["server_cpu_us_per_request"] is None
    table = http_bench.format_triton_table(runs).splitlines()
    assert len(table) == 3  # header, rule, JSON only: binary has no Triton side
    assert table[2].startswith(
        "| wrk JSON | 700 (400 - 1,000), p99 2.00 ms, CPU 40 µs/req (20 user) | "
    )
    assert "450 (300 - 600), p99 2.00 ms, CPU 100 µs/req (50 user)" in table[2]
    assert table[2].endswith("| **0.68x** |")  # the median of 0.6 and 0.75
    assert http_bench.format_triton_table(runs[:1]) == ""
    rows = {row["target"]: row for row in http_bench.summarize(runs)}
    assert rows["corral-binary"]["server_cpu_us_per_request"] is None
    assert http_bench.format_table(list(rows.values())).splitlines()[2].endswith(" | 100 |")


def test_perf_analyzer_figures_take_the_servers_count_and_its_latencies() -> None:
    csv_text = (
        "Concurrency,Inferences/Second,Client Send,Network+Server Send/Recv,Server Queue,"
        "Server Compute Input,Server Compute Infer,Server Compute Output,Client Recv,"
        "p50 latency,p90 latency,p95 latency,p99 latency\n"
        "16,3078.15,2,4871,241,1,74,1,0,4855,6785,7792,9604\n"
    )
    figures = http_bench.perf_analyzer_figures(csv_text, 6000)
    result = http_bench.run_result("corral-grpc", 1, figures, 2.4)
    assert result["requests"] == 6000
    assert result["requests_per_s"] == pytest.approx(3078.15, rel=1e-3)
    assert result["server_cpu_us_per_request"] == pytest.approx(400.0)
    assert (result["latency_p50_ms"], result["latency_p99_ms"]) == (4.855, 9.604)
    assert result["status_errors"] == 0
    with pytest.raises(http_bench.BenchmarkError, match="measured nothing"):
        http_bench.perf_analyzer_figures(csv_text, 0)


def test_the_triton_table_names_the_grpc_client() -> None:
    def run(target: str) -> Any:
        figures = http_bench.perf_analyzer_figures(
            "Inferences/Second,p50 latency,p90 latency,p99 latency\n1000,1,2,3\n", 1000
        )
        return http_bench.run_result(target, 1, figures, 0.1)

    runs = [run("corral-grpc"), run("triton-grpc")]
    assert "| gRPC (Python client) |" in http_bench.format_triton_table(runs)
    assert "| gRPC (perf_analyzer) |" in http_bench.format_triton_table(runs, "perf_analyzer")


def test_the_inference_count_in_metrics_sums_the_models_versions_only() -> None:
    text = "\n".join(
        [
            "# TYPE nv_inference_count counter",
            'nv_inference_count{model="mlp",version="1"} 120',
            'nv_inference_count{model="mlp",version="2"} 3',
            'nv_inference_count{model="mlp2",version="1"} 999',
            'nv_inference_exec_count{model="mlp",version="1"} 40',
        ]
    )
    assert http_bench.inference_count_in_metrics(text, "mlp", 9000) == 123
    with pytest.raises(http_bench.BenchmarkError, match="port 9001 has no nv_inference_count"):
        http_bench.inference_count_in_metrics(text, "other", 9001)
