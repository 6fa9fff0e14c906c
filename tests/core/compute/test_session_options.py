"""Provider options and session options: from model.toml and Session to onnxruntime, read back.

Every value is read back from the onnxruntime session corral built (its ``session_options``
and ``get_provider_options()``), not from corral's own record of it. The per-session thread
pools need a process whose global pools were never set, so those tests run in a subprocess.
"""

from __future__ import annotations

import logging
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import corral
from corral._base.interpreter import describe_interpreter
from corral._models.config import ModelConfig
from corral._onnx import ort as _ort
from tests.helpers import add_model

SOURCE = "m/model.toml"


def _onnxruntime_session(session: corral.Session) -> Any:
    seen: list[Any] = []  # the binding's sessions: what runs
    session.instrument(lambda replica: seen.append(replica) or replica)
    return seen[0]


def _config_error(text: str) -> str:
    with pytest.raises(corral.ModelConfigError) as info:
        ModelConfig.from_toml(text, source=SOURCE)
    return str(info.value)


def test_providers_take_tables_of_options_as_text_next_to_plain_names():
    config = ModelConfig.from_toml(
        "providers = [\n"
        '  { name = "TensorrtExecutionProvider", trt_fp16_enable = true, '
        'trt_max_workspace_size = 2147483648, trt_engine_cache_path = "/cache" },\n'
        '  { name = "CUDAExecutionProvider", device_id = 1 },\n'
        '  "CPUExecutionProvider",\n]',
        source=SOURCE,
    )
    assert config.providers == (
        (
            "TensorrtExecutionProvider",
            (
                ("trt_engine_cache_path", "/cache"),
                ("trt_fp16_enable", "1"),
                ("trt_max_workspace_size", "2147483648"),
            ),
        ),
        ("CUDAExecutionProvider", (("device_id", "1"),)),
        "CPUExecutionProvider",
    )
    hash(config)  # still a frozen, hashable config
    # A table with no options is the plain name.
    plain = ModelConfig.from_toml('providers = [{ name = "CPUExecutionProvider" }]', source=SOURCE)
    assert plain.providers == ("CPUExecutionProvider",)


@pytest.mark.parametrize(
    ("text", "fragment"),
    [
        ("providers = [{ device_id = 1 }]", "providers[0].name must be a provider name"),
        ('providers = [{ name = "" }]', "providers[0].name must be a provider name"),
        (
            'providers = ["CPUExecutionProvider", { name = "CUDAExecutionProvider", x = [1] }]',
            "providers[1].x must be a string, number or boolean",
        ),
        (
            'providers = [{ name = "CUDAExecutionProvider", x = { y = 1 } }]',
            "providers[0].x must be",
        ),
        (
            'providers = [{ name = "CPUExecutionProvider" }, "CPUExecutionProvider"]',
            "lists a provider twice",
        ),
        ('graph_optimization_level = "max"', "graph_optimization_level must be one of"),
        ("graph_optimization_level = 99", "graph_optimization_level must be one of"),
        ('execution_mode = "async"', "execution_mode must be one of 'sequential', 'parallel'"),
        ("intra_op_threads = 0", "intra_op_threads must be an integer >= 1"),
        ("intra_op_threads = true", "intra_op_threads must be an integer >= 1"),
        ("inter_op_threads = 0", "inter_op_threads must be an integer >= 1"),
        ('cpu_mem_arena = "no"', "cpu_mem_arena must be true or false"),
        (
            '[session_config]\n"session.set_denormal_as_zer" = "1"',
            "session_config key 'session.set_denormal_as_zer' is not one corral passes to "
            "onnxruntime (did you mean 'session.set_denormal_as_zero'?); the known keys are",
        ),
        (
            '[session_config]\n"session.use_env_allocators" = "0"',
            "the Runtime's arena sets it",
        ),
        (
            '[session_config]\n"session.set_denormal_as_zero" = [1]',
            "must be a string, number or boolean",
        ),
        ('arena_shrinkage = "cpu:1"', "arena_shrinkage must list devices as 'cpu:0' or"),
    ],
)
def test_a_wrong_option_names_its_field(text, fragment):
    message = _config_error(text)
    assert message.startswith(f"{SOURCE}: "), message
    assert fragment in message, message


@pytest.mark.timeout(30)
@pytest.mark.parametrize(
    ("level", "ort_level"),
    [("disable", "ORT_DISABLE_ALL"), ("basic", "ORT_ENABLE_BASIC"), ("all", "ORT_ENABLE_ALL")],
)
def test_session_options_reach_onnxruntime(mlp_model, level, ort_level):
    with corral.Session(
        mlp_model, graph_optimization_level=level, execution_mode="parallel"
    ) as session:
        options = _onnxruntime_session(session).session_options
        assert options.graph_optimization_level.name == ort_level
        assert options.execution_mode.name == "ORT_PARALLEL"
        assert session.run({"X": np.ones((2, 4), np.float32)})


@pytest.mark.timeout(30)
def test_without_options_onnxruntime_keeps_its_defaults(mlp_model):
    with corral.Session(mlp_model) as session:
        options = _onnxruntime_session(session).session_options
        assert options.graph_optimization_level.name == "ORT_ENABLE_ALL"
        assert options.execution_mode.name == "ORT_SEQUENTIAL"


@pytest.mark.timeout(30)
def test_a_provider_option_onnxruntime_drops_is_refused_by_name(mlp_model):
    # onnxruntime's CPU provider takes no options and drops unknown ones without a word.
    with pytest.raises(corral.ModelConfigError) as info:
        corral.Session(mlp_model, providers=[("CPUExecutionProvider", {"device_id": 1})])
    message = str(info.value)
    assert "'device_id' of CPUExecutionProvider" in message
    assert "it takes: none" in message
    assert corral.runtime().stats().sessions_alive == 0


@pytest.mark.timeout(30)
def test_an_unknown_provider_with_options_is_refused_before_onnxruntime(mlp_model):
    with pytest.raises(corral.ProviderUnavailable, match="'NoSuchExecutionProvider'"):
        corral.Session(mlp_model, providers=[("NoSuchExecutionProvider", {"device_id": 1})])


@pytest.mark.timeout(30)
def test_malformed_provider_options_are_refused_naming_the_provider(mlp_model):
    bad: Any = ("CPUExecutionProvider", 5)  # options that are neither a mapping nor pairs
    with pytest.raises(corral.ProviderUnavailable, match="options of CPUExecutionProvider must"):
        corral.Session(mlp_model, providers=[bad])


def test_boolean_provider_options_go_to_onnxruntime_as_1_or_0():
    from corral._onnx.providers import resolve_providers

    resolved = resolve_providers([("CPUExecutionProvider", {"a": True, "b": False, "c": 2})])
    assert resolved.ort_providers == (("CPUExecutionProvider", {"a": "1", "b": "0", "c": "2"}),)
    assert resolved.options_asked == (("CPUExecutionProvider", ("a", "b", "c")),)


class _ReportingSession:
    """Stands for a session on a GPU provider: reports the options it took."""

    def get_provider_options(self) -> dict[str, dict[str, str]]:
        return {"CUDAExecutionProvider": {"device_id": "1", "gpu_mem_limit": "1024"}}


def test_options_the_session_reports_taking_pass_and_others_are_named():
    session = _ReportingSession()
    _ort.check_provider_options(session, [("CUDAExecutionProvider", ("device_id",))], "m:1")
    with pytest.raises(corral.ModelConfigError) as info:
        _ort.check_provider_options(
            session, [("CUDAExecutionProvider", ("device_id", "device_idx"))], "m:1"
        )
    message = str(info.value)
    assert "'device_idx' of CUDAExecutionProvider" in message
    assert "it takes: device_id, gpu_mem_limit" in message


@pytest.mark.timeout(30)
def test_memory_options_and_session_config_entries_reach_onnxruntime(mlp_model):
    with corral.Session(
        mlp_model,
        cpu_mem_arena=False,
        mem_pattern=False,
        session_config={"session.set_denormal_as_zero": "1"},
    ) as session:
        options = _onnxruntime_session(session).session_options
        assert options.enable_cpu_mem_arena is False
        assert options.enable_mem_pattern is False
        assert options.get_session_config_entry("session.set_denormal_as_zero") == "1"
        # No arena at all: not the Runtime's shared one either.
        with pytest.raises(Exception, match=r"session\.use_env_allocators"):
            options.get_session_config_entry("session.use_env_allocators")
        assert session.run({"X": np.ones((2, 4), np.float32)})
    with corral.Session(mlp_model) as session:
        options = _onnxruntime_session(session).session_options
        assert options.enable_mem_pattern is True
        assert options.get_session_config_entry("session.use_env_allocators") == "1"


@pytest.mark.timeout(60)
def test_a_shrunk_arena_is_the_runs_own_and_a_device_without_one_is_named(
    tmp_path: Path, mlp_model, caplog: pytest.LogCaptureFixture
):
    x = {"X": np.ones((2, 4), np.float32)}
    with corral.Session(mlp_model, arena_shrinkage="cpu:0") as session:
        assert session.run(x)
    # onnxruntime fails every run that shrinks a device without an arena: refused up front.
    with pytest.raises(corral.ModelConfigError, match="pools no CPU memory"):
        corral.Session(mlp_model, cpu_mem_arena=False, arena_shrinkage="cpu:0")
    with pytest.raises(corral.ModelConfigError, match="names gpu:0, but this session runs on"):
        corral.Session(mlp_model, arena_shrinkage="gpu:0")
    # A Host passes on only the devices the model has an arena on, and names the others.
    add_model(tmp_path, "shrunk", mlp_model, toml='arena_shrinkage = "cpu:0"\n')
    add_model(
        tmp_path,
        "unpooled",
        mlp_model,
        toml='cpu_mem_arena = false\narena_shrinkage = "cpu:0;gpu:0"\n',
    )
    caplog.set_level(logging.WARNING, logger="corral")
    with corral.Host(tmp_path).start() as host:
        for name in ("shrunk", "unpooled"):
            assert host.infer(name, x)["Y"].shape == (2, 1)
    named = [r.getMessage() for r in caplog.records if "without effect" in r.getMessage()]
    assert len(named) == 1, named
    assert "model 'unpooled'" in named[0]
    assert "cpu:0;gpu:0: this model has no memory arena on that device" in named[0]


@pytest.mark.timeout(30)
def test_a_thread_count_other_than_the_global_pools_is_refused_naming_the_mode(mlp_model):
    pool = corral.runtime().options.intra_op_threads
    with corral.Session(mlp_model, intra_op_threads=pool):  # the pool's own size: no change
        pass
    with pytest.raises(corral.ModelConfigError) as info:
        corral.Session(mlp_model, intra_op_threads=pool + 1)
    message = str(info.value)
    assert f"intra_op_threads = {pool + 1}" in message
    assert "thread_pools='per_session'" in message
    assert "--thread-pools per_session" in message
    inter = corral.runtime().options.inter_op_threads
    with pytest.raises(corral.ModelConfigError, match=f"inter_op_threads = {inter + 1} needs"):
        corral.Session(mlp_model, inter_op_threads=inter + 1)


@pytest.mark.timeout(60)
def test_model_toml_options_reach_the_session_a_host_loads(tmp_path: Path, mlp_model):
    add_model(
        tmp_path,
        "big",
        mlp_model,
        toml='graph_optimization_level = "extended"\nexecution_mode = "parallel"\n'
        'mem_pattern = false\n[session_config]\n"session.set_denormal_as_zero" = true\n',
    )
    add_model(
        tmp_path, "typo", mlp_model, toml='providers = [{ name = "CPUExecutionProvider", x = 1 }]'
    )
    with corral.Host(tmp_path).start() as host:
        with host.acquire("big") as lease:
            options = _onnxruntime_session(lease.session).session_options
            assert options.graph_optimization_level.name == "ORT_ENABLE_EXTENDED"
            assert options.execution_mode.name == "ORT_PARALLEL"
            assert options.enable_mem_pattern is False
            assert options.get_session_config_entry("session.set_denormal_as_zero") == "1"
        with pytest.raises(corral.ModelConfigError, match="'x' of CPUExecutionProvider"):
            host.acquire("typo")


_PER_SESSION = """
import corral, numpy as np
from corral.testing import build_mlp
rt = corral.Runtime(intra_op_threads=1, inter_op_threads=1, thread_pools="per_session")
own = corral.Session(build_mlp(), runtime=rt, intra_op_threads=2)
default = corral.Session(build_mlp(), runtime=rt)
own.run({"X": np.ones((2, 4), np.float32)})
for session in (own, default):
    options = session._replicas[0].session_options
    print(options.intra_op_num_threads, options.use_per_session_threads)
print(rt.stats().threads)
rt.shutdown()
try:
    corral.Runtime(thread_pools="sometimes")
except corral.RuntimeConfigError as exc:
    print("refused:", exc)
"""

_PER_SESSION_AFTER_GLOBAL = """
import corral
from corral.testing import build_mlp
corral.Session(build_mlp())  # the default Runtime sets the global pools
corral.runtime().shutdown()
try:
    corral.Runtime(thread_pools="per_session")
except corral.RuntimeConfigError as exc:
    print("refused:", exc)
"""


_PBTXT_THREADS = """
import pathlib, sys, corral
from corral.testing import build_mlp
root = pathlib.Path(sys.argv[1])
(root / "m" / "1").mkdir(parents=True)
(root / "m" / "1" / "model.onnx").write_bytes(build_mlp())
(root / "m" / "config.pbtxt").write_text(
    'parameters { key: "intra_op_thread_count" value { string_value: "2" } }\\n'
    'parameters { key: "inter_op_thread_count" value { string_value: "3" } }\\n'
)
rt = corral.Runtime(intra_op_threads=1, inter_op_threads=1, thread_pools="per_session")
with corral.Host(root, runtime=rt) as host, host.acquire("m") as lease:
    seen = []
    lease.session.instrument(lambda replica: seen.append(replica) or replica)
    options = seen[0].session_options
    print(options.intra_op_num_threads, options.inter_op_num_threads)
"""


def _run_script(script: str, *args: str) -> str:
    result = subprocess.run(
        [sys.executable, "-c", script, *args], capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0, result.stderr
    return result.stdout


@pytest.mark.timeout(90)
def test_per_session_pools_give_each_model_its_own_thread_count():
    lines = _run_script(_PER_SESSION).splitlines()
    assert lines[0] == "2 True"  # asked for 2
    assert lines[1] == "1 True"  # the Runtime's intra_op_threads as each session's default
    assert lines[2] == "0"  # no compute workers were started and no global pool exists
    assert lines[3].startswith("refused: thread_pools must be one of 'global', 'per_session'")


@pytest.mark.timeout(90)
def test_a_config_pbtxts_thread_counts_are_a_sessions_own_with_per_session_pools(
    tmp_path: Path,
):
    # Under the global pools (this process's) they are named instead: test_triton_configs.
    assert _run_script(_PBTXT_THREADS, str(tmp_path)).split() == ["2", "3"]


@pytest.mark.timeout(90)
def test_per_session_pools_are_refused_once_the_global_pools_exist():
    out = _run_script(_PER_SESSION_AFTER_GLOBAL)
    assert "refused:" in out
    assert "thread_pools='per_session'" in out


@pytest.mark.timeout(120)
def test_corral_serve_runs_per_session_pools_and_logs_its_onnxruntime(tmp_path: Path, mlp_model):
    import json
    import urllib.request

    from tests.processes import start_server, stop_server

    repo = tmp_path / "repo"
    add_model(repo, "big", mlp_model, toml="intra_op_threads = 2\n")
    served = start_server(repo, tmp_path / "serve.log", "--thread-pools", "per_session")
    try:
        body = {"inputs": [{"name": "X", "shape": [1, 4], "datatype": "FP32", "data": [1] * 4}]}
        request = urllib.request.Request(
            f"http://{served.http}/v2/models/big/infer", data=json.dumps(body).encode()
        )
        with urllib.request.urlopen(request, timeout=30) as response:
            assert json.loads(response.read())["outputs"][0]["shape"] == [1, 1]
    finally:
        stop_server(served)
    log = served.log.read_text()
    summary = next(line for line in log.splitlines() if " serving " in line)
    # Which Python serves, and whether its GIL is enabled (the same interpreter as this one).
    assert f" on {describe_interpreter()}: " in summary
    assert "from onnxruntime with " in summary
    assert "CPUExecutionProvider" in summary
    assert "per_session thread pools of 1 intra-op thread(s)" in summary
