"""Provider options from a model's settings (corral._models.provider_options): every option is
one corral knows, or refused by name; from a load's config, only options that name nothing on
disk pass; from the repository, paths are made real inside the model's folder. Each refusal
names the option and the provider on this CPU-only onnxruntime, before any provider is asked
for (issue 47)."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import httpx
import onnxruntime
import pytest

import corral
from corral._onnx import PROVIDER_OPTIONS, OptionKind
from corral.protocol import DataPlane
from corral.server.http.app import HttpApp
from corral.testing import build_mlp
from tests.helpers import add_model

GPU = "instance_group [ { kind: KIND_GPU } ]\n"


def _accelerator(kind: str, name: str, parameters: dict[str, str]) -> str:
    pairs = " ".join(
        f"parameters {{ key: {key!r} value: {value!r} }}".replace("'", '"')
        for key, value in parameters.items()
    )
    return (
        f"optimization {{ execution_accelerators {{ {kind}_execution_accelerator "
        f'[ {{ name: "{name}" {pairs} }} ] }} }}\n'
    )


def _load_config(kind: str, name: str, parameters: dict[str, str]) -> str:
    accelerator = {"name": name, "parameters": parameters}
    config: dict[str, object] = {
        "name": "mlp",
        "backend": "onnxruntime",
        "optimization": {
            "execution_accelerators": {f"{kind}_execution_accelerator": [accelerator]}
        },
    }
    if kind == "gpu":
        config["instance_group"] = [{"kind": "KIND_GPU"}]
    return json.dumps(config)


@pytest.mark.parametrize(
    ("kind", "name", "parameter", "value", "option", "provider", "named"),
    [
        (
            "gpu",
            "tensorrt",
            "trt_extra_plugin_lib_paths",
            "/tmp/libevil.so",
            "trt_extra_plugin_lib_paths",
            "TensorrtExecutionProvider",
            "a library to load",
        ),
        (
            "gpu",
            "tensorrt",
            "trt_engine_cache_path",
            "/tmp/cache",
            "trt_engine_cache_path",
            "TensorrtExecutionProvider",
            "a file or folder",
        ),
        (
            "gpu",
            "tensorrt",
            "trt_timing_cache_path",
            "/tmp",
            "trt_timing_cache_path",
            "TensorrtExecutionProvider",
            "a file or folder",
        ),
        (
            "gpu",
            "tensorrt",
            "trt_ep_context_file_path",
            "/tmp/ctx.onnx",
            "trt_ep_context_file_path",
            "TensorrtExecutionProvider",
            "a file or folder",
        ),
        (
            "gpu",
            "tensorrt",
            "trt_dump_ep_context_model",
            "1",
            "trt_dump_ep_context_model",
            "TensorrtExecutionProvider",
            "a switch that reads or writes files",
        ),
        (  # Triton's name, mapped onto onnxruntime's before the check
            "gpu",
            "tensorrt",
            "int8_calibration_table_name",
            "table.bin",
            "trt_int8_calibration_table_name",
            "TensorrtExecutionProvider",
            "a file name",
        ),
        (
            "cpu",
            "openvino",
            "cache_dir",
            "/tmp/ov",
            "cache_dir",
            "OpenVINOExecutionProvider",
            "a file or folder",
        ),
    ],
)
def test_a_loads_config_may_name_no_file_for_a_provider(
    tmp_path: Path,
    kind: str,
    name: str,
    parameter: str,
    value: str,
    option: str,
    provider: str,
    named: str,
):
    # This onnxruntime lacks the provider: the refusal shows the check runs before it is asked.
    assert provider not in onnxruntime.get_available_providers()
    add_model(tmp_path, "mlp", build_mlp(seed=1))
    with corral.Host(tmp_path) as host, pytest.raises(corral.ModelConfigError) as refused:
        host.load("mlp", config=_load_config(kind, name, {parameter: value}))
    assert isinstance(refused.value, corral.LoadRequestInvalid)  # the request's fault
    message = str(refused.value)
    assert f"option {option!r} of {provider} names {named}: a load's config" in message
    assert "never from a load's config or files" in message
    assert host.stats().loads == 0


@pytest.mark.timeout(60)
def test_over_http_the_refusal_is_a_400_naming_the_option(tmp_path: Path):
    add_model(tmp_path, "mlp", build_mlp(seed=1))
    config = _load_config("gpu", "tensorrt", {"trt_extra_plugin_lib_paths": "/tmp/libevil.so"})

    async def load(app: HttpApp) -> httpx.Response:
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://corral") as client:
            body = {"parameters": {"config": config}}
            return await client.post("/v2/repository/models/mlp/load", json=body)

    with corral.Host(tmp_path) as host:
        answer = asyncio.run(load(HttpApp(DataPlane(host))))
        assert answer.status_code == 400
        error = answer.json()["error"]
        assert error.startswith("failed to load 'mlp': ")
        assert "option 'trt_extra_plugin_lib_paths' of TensorrtExecutionProvider" in error
        assert host.stats().loads == 0


def test_a_loads_config_may_not_give_an_option_corral_does_not_know(tmp_path: Path):
    add_model(tmp_path, "mlp", build_mlp(seed=1))
    config = _load_config("gpu", "cuda", {"user_compute_stream": "140000000"})
    with corral.Host(tmp_path) as host, pytest.raises(corral.ModelConfigError) as refused:
        host.load("mlp", config=config)
    message = str(refused.value)
    assert "option 'user_compute_stream' of CUDAExecutionProvider is not one corral knows" in (
        message
    )
    assert "it knows: arena_extend_strategy, " in message


def test_a_loads_config_may_give_options_that_name_nothing_on_disk(tmp_path: Path):
    # Past the check, the provider is asked for, and this build has none: its own error.
    add_model(tmp_path, "mlp", build_mlp(seed=1))
    parameters = {"precision_mode": "FP16", "trt_max_workspace_size": "1073741824"}
    with corral.Host(tmp_path) as host, pytest.raises(corral.ProviderUnavailable) as missing:
        host.load("mlp", config=_load_config("gpu", "tensorrt", parameters))
    assert "'TensorrtExecutionProvider' is not in this onnxruntime build" in str(missing.value)


def _pbtxt_model(root: Path, name: str, parameters: dict[str, str]) -> Path:
    add_model(root, name, build_mlp(seed=1))
    text = GPU + _accelerator("gpu", "tensorrt", parameters)
    (root / name / "config.pbtxt").write_text(text)
    return root / name


def _tensorrt_options(root: Path, name: str) -> dict[str, str]:
    providers = corral.Repository(root).entry(name).config.providers
    assert providers is not None
    entry = providers[0]
    assert not isinstance(entry, str)
    assert entry[0] == "TensorrtExecutionProvider"
    return dict(entry[1])


def test_a_repository_config_names_paths_inside_the_model_folder_made_real(tmp_path: Path):
    folder = _pbtxt_model(
        tmp_path,
        "trt",
        {
            "trt_extra_plugin_lib_paths": "plugins/a.so;plugins/b.so",
            "trt_engine_cache_path": "cache",  # need not exist: the provider makes it
            "trt_engine_cache_prefix": "engine",
            "trt_engine_cache_enable": "1",
            "trt_fp16_enable": "1",
        },
    )
    (folder / "plugins").mkdir()
    for library in ("a.so", "b.so"):
        (folder / "plugins" / library).write_bytes(b"\x7fELF")
    real = folder.resolve()
    assert _tensorrt_options(tmp_path, "trt") == {
        "trt_extra_plugin_lib_paths": f"{real}/plugins/a.so;{real}/plugins/b.so",
        "trt_engine_cache_path": f"{real}/cache",
        "trt_engine_cache_prefix": "engine",
        "trt_engine_cache_enable": "1",
        "trt_fp16_enable": "1",
    }


@pytest.mark.parametrize(
    ("option", "value", "why"),
    [
        ("trt_extra_plugin_lib_paths", "../outside.so", "resolves outside the model's folder"),
        ("trt_extra_plugin_lib_paths", "plugin.so;/tmp/libevil.so", "resolves outside"),
        ("trt_extra_plugin_lib_paths", "missing.so", "no such file in the model's folder"),
        ("trt_extra_plugin_lib_paths", "plugin.so;", "must name a path inside the model's"),
        ("trt_engine_decryption_lib_path", "/usr/lib/libdecrypt.so", "resolves outside"),
        ("trt_engine_cache_path", "../cache", "resolves outside the model's folder"),
        ("trt_timing_cache_path", "/tmp", "resolves outside the model's folder"),
        ("trt_engine_cache_prefix", "../engine", "must be a plain file name"),
        ("trt_int8_calibration_table_name", "..", "must be a plain file name"),
        ("trt_engine_cache_path", "", "must name a path inside the model's folder"),
        ("trt_onnx_bytestream", "1234", "is not one corral knows"),
    ],
)
def test_a_repository_config_is_refused_naming_the_option_and_provider(
    tmp_path: Path, option: str, value: str, why: str
):
    folder = _pbtxt_model(tmp_path, "trt", {option: value})
    (folder / "plugin.so").write_bytes(b"\x7fELF")
    with corral.Host(tmp_path) as host, pytest.raises(corral.ModelConfigError) as refused:
        host.load("trt")
    message = str(refused.value)
    assert f"option {option!r} of TensorrtExecutionProvider" in message
    assert why in message


def test_a_symlink_out_of_the_model_folder_is_followed_and_refused(tmp_path: Path):
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "libevil.so").write_bytes(b"\x7fELF")
    root = tmp_path / "models"
    folder = _pbtxt_model(root, "trt", {"trt_extra_plugin_lib_paths": "plugins/libevil.so"})
    (folder / "plugins").symlink_to(outside)
    with corral.Host(root) as host, pytest.raises(corral.ModelConfigError) as refused:
        host.load("trt")
    assert "resolves outside the model's folder" in str(refused.value)


def test_model_toml_options_are_checked_alike(tmp_path: Path):
    add_model(
        tmp_path,
        "qnn",
        build_mlp(seed=1),
        toml=(
            'providers = [{ name = "QNNExecutionProvider", '
            'backend_path = "/usr/lib/libQnnHtp.so" }]'
        ),
    )
    add_model(
        tmp_path,
        "other",
        build_mlp(seed=1),
        toml='providers = [{ name = "AzureExecutionProvider", endpoint = "x" }]',
    )
    with corral.Host(tmp_path) as host:
        with pytest.raises(corral.ModelConfigError) as refused:
            host.load("qnn")
        assert "option 'backend_path' of QNNExecutionProvider ('/usr/lib/libQnnHtp.so') " in str(
            refused.value
        )
        # A provider this build has, but whose options corral does not know: refused too.
        with pytest.raises(corral.ModelConfigError) as unknown:
            host.load("other")
        assert "option 'endpoint' of AzureExecutionProvider: corral knows no options" in str(
            unknown.value
        )


def test_the_table_names_every_option_the_issue_named():
    tensorrt = PROVIDER_OPTIONS["TensorrtExecutionProvider"]
    assert tensorrt["trt_extra_plugin_lib_paths"].kind is OptionKind.LIBRARY
    assert tensorrt["trt_extra_plugin_lib_paths"].separator == ";"
    for option in ("trt_engine_cache_path", "trt_timing_cache_path", "trt_ep_context_file_path"):
        assert tensorrt[option].kind is OptionKind.PATH, option
    assert tensorrt["trt_dump_ep_context_model"].kind is OptionKind.FILES
    assert PROVIDER_OPTIONS["OpenVINOExecutionProvider"]["cache_dir"].kind is OptionKind.PATH
    assert PROVIDER_OPTIONS["QNNExecutionProvider"]["backend_path"].kind is OptionKind.LIBRARY
    assert PROVIDER_OPTIONS["CPUExecutionProvider"] == {}
