"""Triton's config.pbtxt: parsing, the mapping onto ModelConfig, refusals, and the load check."""

from __future__ import annotations

import importlib
import json
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import corral
from corral import Host
from corral._base.errors import ModelConfigError
from corral._models.config import (
    ModelConfig,
    TensorConfig,
    VersionPolicy,
    WarmupInput,
    WarmupSample,
)
from corral._models.pbtxt.parse import parse_pbtxt, pbtxt_from_json
from corral._models.pbtxt.warmup import MAX_WARMUP_BYTES, warmup_feed
from corral._models.repository import MAX_LABELS_BYTES, Repository
from corral.testing import build_linear
from tests.gates import hold_compute_workers
from tests.helpers import add_model, build_reshape

pytestmark = [
    pytest.mark.timeout(60),
    # tritonclient's HTTP client is gevent-based: collected on another thread, it fails.
    pytest.mark.usefixtures("garbage_collected_on_the_main_thread"),
]

LINEAR = """
name: "linear"
platform: "onnxruntime_onnx"
max_batch_size: 8
input [ { name: "X" data_type: TYPE_FP32 dims: [ 4 ] } ]
output [ { name: "Y" data_type: TYPE_FP32 dims: [ 1 ] } ]
"""


def no_labels(path: str, field: str) -> tuple[str, ...]:
    raise AssertionError(f"no label file expected, asked for {path} ({field})")


def parse(text: str, name: str = "linear") -> ModelConfig:
    return parse_pbtxt(text, source="m/config.pbtxt", model_name=name, read_labels=no_labels)


def refused(text: str, name: str = "linear") -> str:
    with pytest.raises(ModelConfigError) as caught:
        parse(text, name)
    message = str(caught.value)
    assert message.startswith("m/config.pbtxt: "), message
    return message


# -- the mapping -----------------------------------------------------------------------------


def test_the_fields_corral_honours_map_onto_its_config():
    config = parse(
        LINEAR
        + """
        version_policy { specific { versions: [ 1, 3 ] } }
        dynamic_batching {
          max_queue_delay_microseconds: 250
          default_queue_policy { max_queue_size: 17 }
        }
        instance_group [ { count: 2 kind: KIND_CPU }, { kind: KIND_AUTO } ]
        default_model_filename: "net.onnx"
        parameters { key: "team" value { string_value: "fraud" } }
        """
    )
    assert config.source == "config.pbtxt"
    assert config.max_batch_size == 8
    assert config.batch_window_us == 250
    assert config.max_queue_size == 17
    assert config.concurrency == "pool:3"  # 2 + Triton's default of one instance
    assert config.version_policy == VersionPolicy("specific", versions=(1, 3))
    assert config.model_filename == "net.onnx"
    assert config.parameters == (("team", "fraud"),)
    assert config.inputs == (TensorConfig("X", "TYPE_FP32", (4,)),)
    assert config.outputs == (TensorConfig("Y", "TYPE_FP32", (1,)),)


@pytest.mark.parametrize(
    ("policy", "expected"),
    [
        ("", VersionPolicy("latest", 1)),
        ("version_policy { all { } }", VersionPolicy("all")),
        ("version_policy { latest { num_versions: 2 } }", VersionPolicy("latest", 2)),
    ],
)
def test_each_version_policy_maps_onto_corrals(policy: str, expected: VersionPolicy):
    assert parse(LINEAR + policy).version_policy == expected


def test_preferred_batch_sizes_are_the_batchers_cut_points():
    config = parse(LINEAR + "dynamic_batching { preferred_batch_size: [ 8, 4, 4 ] }")
    assert config.max_batch_size == 8
    assert config.combine_requests is True
    assert config.preferred_batch_sizes == (4, 8)


def test_response_cache_enable_maps_onto_the_models_response_cache():
    assert parse(LINEAR + "response_cache { enable: true }").response_cache is True
    assert parse(LINEAR + "response_cache { enable: false }").response_cache is False
    assert parse(LINEAR).response_cache is False


def test_without_dynamic_batching_no_request_waits_for_a_batch():
    config = parse(LINEAR)
    assert config.batch_window_us == 0
    assert config.concurrency == "auto"
    assert config.providers is None
    assert config.version_policy == VersionPolicy("latest", 1)


def test_zero_data_warmup_and_the_openvino_accelerator_map():
    config = parse(
        'model_warmup [ { name: "w" batch_size: 1 inputs { key: "X" value { '
        "data_type: TYPE_FP32 dims: [ 4 ] zero_data: true } } } ]\n"
        "optimization { execution_accelerators { cpu_execution_accelerator "
        '[ { name: "openvino" } ] } }'
    )
    assert config.warmup is False  # corral's own zero run, model.toml's; the sample is Triton's
    assert config.warmup_samples == (
        WarmupSample("w", 1, 1, (WarmupInput("X", "TYPE_FP32", (4,), "zero_data"),)),
    )
    assert config.providers == ("OpenVINOExecutionProvider", "CPUExecutionProvider")


def test_kind_gpu_asks_for_the_cuda_provider():
    config = parse("instance_group [ { count: 1 kind: KIND_GPU } ]")
    assert config.providers == ("CUDAExecutionProvider", "CPUExecutionProvider")
    assert config.concurrency == "pool:1"


def test_accelerator_parameters_become_provider_options_under_onnxruntime_names():
    config = parse(
        "instance_group [ { kind: KIND_GPU } ]\n"
        "optimization { execution_accelerators { gpu_execution_accelerator [\n"
        '  { name: "tensorrt" parameters { key: "precision_mode" value: "FP16" }\n'
        '    parameters { key: "max_workspace_size_bytes" value: "1073741824" }\n'
        '    parameters { key: "trt_engine_cache_enable" value: "1" } },\n'
        '  { name: "cuda" parameters { key: "device_id" value: "1" } } ] } }'
    )
    assert config.providers == (
        (
            "TensorrtExecutionProvider",
            (
                ("trt_engine_cache_enable", "1"),
                ("trt_fp16_enable", "1"),
                ("trt_max_workspace_size", "1073741824"),
            ),
        ),
        ("CUDAExecutionProvider", (("device_id", "1"),)),
        "CPUExecutionProvider",
    )


def test_graph_level_and_the_backends_session_parameters_map_onto_session_options():
    config = parse(
        "optimization { graph { level: -1 } }\n"
        'parameters { key: "execution_mode" value { string_value: "1" } }\n'
        'parameters { key: "intra_op_thread_count" value { string_value: "3" } }'
    )
    assert config.graph_optimization_level == "basic"
    assert config.execution_mode == "parallel"
    assert config.intra_op_threads == 3
    assert ("execution_mode", "1") in config.parameters  # reported back as it came
    assert parse("optimization { graph { level: 2 } }").graph_optimization_level == "disable"
    assert parse("optimization { graph { level: 1 } }").graph_optimization_level == "extended"


@pytest.mark.parametrize(
    ("text", "named"),
    [
        ("optimization { cuda { graphs: true busy_wait_events: true } }", "optimization.cuda."),
        ("optimization { priority: PRIORITY_MAX }", "optimization.priority"),
        ("optimization { input_pinned_memory { enable: true } }", "input_pinned_memory"),
        ("optimization { output_pinned_memory { enable: false } }", None),  # false: not set
        ("optimization { gather_kernel_buffer_threshold: 4 }", "gather_kernel_buffer_threshold"),
        ("optimization { eager_batching: true }", "eager_batching"),
        ("dynamic_batching { preserve_ordering: true }", "preserve_ordering"),
        ("dynamic_batching { priority_levels: 2 default_priority_level: 1 }", "priority_level"),
        ("instance_group [ { count: 1 kind: KIND_GPU gpus: [ 1 ] } ]", "instance_group.gpus"),
        (
            'instance_group [ { count: 2 rate_limiter { resources [ { name: "R" count: 1 } ] '
            "priority: 2 } } ]",
            "instance_group.rate_limiter",
        ),
        ('instance_group [ { profile: [ "0" ] passive: true host_policy: "numa0" } ]', "passive"),
        ('metric_tags { key: "team" value: "fraud" }', "metric_tags"),
        (
            'model_metrics { metric_control [ { metric_identifier { family: "x" } } ] }',
            "model_metrics",
        ),
        ('cc_model_filenames { key: "7.5" value: "a.onnx" }', "cc_model_filenames"),
        ("model_transaction_policy { decoupled: false }", None),
        ('runtime: "libtriton_onnxruntime.so"', None),
        ('parameters { key: "gpu_mem_limit" value { string_value: "4294967200" } }', "CUDA"),
        ('parameters { key: "cudnn_conv_algo_search" value { string_value: "1" } }', "CUDA"),
        ('parameters { key: "arena_extend_strategy" value { string_value: "1" } }', "CUDA"),
        ('parameters { key: "do_copy_in_default_stream" value { string_value: "0" } }', "CUDA"),
        ('parameters { key: "use_global_thread_pool" value { string_value: "1" } }', "pools"),
    ],
)
def test_what_has_no_effect_here_is_accepted_and_named(text: str, named: str | None):
    config = parse(LINEAR + text)
    if named is None:
        assert config.no_effect == ()
    else:
        assert any(named in line for line in config.no_effect), config.no_effect


def test_the_backends_memory_and_session_parameters_become_session_options():
    config = parse(
        LINEAR + 'parameters { key: "enable_mem_arena" value { string_value: "0" } }\n'
        'parameters { key: "enable_mem_pattern" value { string_value: "false" } }\n'
        'parameters { key: "inter_op_thread_count" value { string_value: "2" } }\n'
        'parameters { key: "session.use_device_allocator_for_initializers" value { '
        'string_value: "1" } }\n'
        'parameters { key: "share_session_between_instances" value { string_value: "true" } }\n'
        'parameters { key: "memory.enable_memory_arena_shrinkage" value { string_value: '
        '"cpu:0" } }\n'
        "instance_group [ { count: 3 kind: KIND_CPU } ]"
    )
    assert config.cpu_mem_arena is False
    assert config.mem_pattern is False
    assert config.inter_op_threads == 2
    assert config.session_config == (("session.use_device_allocator_for_initializers", "1"),)
    assert config.concurrency == "shared"  # the group's instances share one session
    assert config.arena_shrinkage == "cpu:0"
    assert config.no_effect == ()
    assert ("enable_mem_arena", "0") in config.parameters  # reported back as it came


def test_the_backends_cuda_parameters_set_the_cuda_providers_options_on_a_gpu():
    config = parse(
        LINEAR + "instance_group [ { kind: KIND_GPU } ]\n"
        'parameters { key: "cudnn_conv_algo_search" value { string_value: "1" } }\n'
        'parameters { key: "gpu_mem_limit" value { string_value: "4294967200" } }'
    )
    assert config.providers == (
        (
            "CUDAExecutionProvider",
            (("cudnn_conv_algo_search", "HEURISTIC"), ("gpu_mem_limit", "4294967200")),
        ),
        "CPUExecutionProvider",
    )
    assert config.no_effect == ()


# -- refusals --------------------------------------------------------------------------------


def test_a_syntax_error_names_the_line_and_column():
    message = refused('name: "linear"\nmax_batch_size: eight\n')
    assert "line 2" in message, message


def test_an_unknown_field_is_named():
    message = refused('name: "linear"\nmax_batch_sise: 8\n')
    assert "max_batch_sise" in message, message
    assert "line 2" in message, message


@pytest.mark.parametrize(
    ("text", "named", "why"),
    [
        ('platform: "tensorrt_plan"', "tensorrt_plan", "onnxruntime"),
        ('backend: "pytorch"', "pytorch", "onnxruntime"),
        ('platform: "ensemble"', "ensemble_scheduling", "steps"),
        ("sequence_batching { max_sequence_idle_microseconds: 5 }", "sequence_batching", "state"),
        ('ensemble_scheduling { step [ { model_name: "a" } ] }', "ensemble_scheduling", "steps"),
        (
            'platform: "ensemble" ensemble_scheduling { step [ { model_name: "a" '
            'model_namespace: "n" } ] }',
            "ensemble_scheduling.step[0].model_namespace",
            "namespaces",
        ),
        ('platform: "ensemble" ensemble_scheduling { }', "ensemble_scheduling", "no step"),
        (
            'platform: "ensemble" ensemble_scheduling { step [ { model_name: "a" '
            "model_version: 0 } ] }",
            "model_version 0",
            "-1",
        ),
        ("model_transaction_policy { decoupled: true }", "decoupled", "decoupled"),
        ("dynamic_batching { preferred_batch_size: [ 4 ] }", "preferred_batch_size", "prefer"),
        (
            "max_batch_size: 8 dynamic_batching { preferred_batch_size: [ 8, 16 ] }",
            "preferred_batch_size[1] is 16",
            "from 1 to max_batch_size (8)",
        ),
        ('runtime: "model.py"', "runtime 'model.py'", "remove runtime"),
        (
            'cc_model_filenames { key: "7.5" value: "a.onnx" } '
            "instance_group [ { kind: KIND_GPU } ]",
            "cc_model_filenames",
            "default_model_filename",
        ),
        (
            'input [ { name: "X" data_type: TYPE_FP32 dims: [ 4 ] optional: true } ]',
            "input[0].optional",
            "remove optional",
        ),
        (
            "dynamic_batching { priority_levels: 2 priority_queue_policy { key: 1 value { "
            "max_queue_size: 3 } } }",
            "priority_queue_policy",
            "use default_queue_policy",
        ),
        (
            'parameters { key: "enable_mem_arena" value { string_value: "maybe" } }',
            "parameters['enable_mem_arena']",
            "'1'/'true'/'on' or '0'/'false'/'off'",
        ),
        (
            'parameters { key: "cudnn_conv_algo_search" value { string_value: "3" } }',
            "parameters['cudnn_conv_algo_search']",
            "'0' (EXHAUSTIVE)",
        ),
        ('model_repository_agents { agents [ { name: "checksum" } ] }', "agents", "remove"),
        (
            "dynamic_batching { default_queue_policy { timeout_action: DELAY } }",
            "default_queue_policy.timeout_action",
            "does not DELAY",
        ),
        (
            'input [ { name: "X" data_type: TYPE_FP32 dims: [ 4 ] reshape { shape: [ 3 ] } } ]',
            "input[0].reshape.shape [3]",
            "element count",
        ),
        ("instance_group [ { count: 100 } ]", "100 instances", "pool:64"),
        (
            'parameters { key: "inter_op_thread_count" value { string_value: "two" } }',
            "inter_op",
            "a count of threads",
        ),
        ('name: "other"', "'other'", "must match"),
        ("optimization { graph { level: 3 } }", "optimization.graph.level 3", "-1 (basic)"),
        (
            "instance_group [ { kind: KIND_GPU } ] optimization { execution_accelerators { "
            'gpu_execution_accelerator [ { name: "tensorrt" parameters { key: "precision_mode" '
            'value: "FP8" } } ] } }',
            "gpu_execution_accelerator[0].parameters['precision_mode']",
            "FP32, FP16 or INT8",
        ),
        (
            "optimization { execution_accelerators { gpu_execution_accelerator "
            '[ { name: "tensorrt" } ] } }',
            "gpu_execution_accelerator[0]",
            "KIND_GPU",
        ),
        (
            'model_warmup [ { name: "w" batch_size: 1 inputs { key: "X" value { '
            "data_type: TYPE_FP32 dims: [ 4 ] } } } ]",
            "model_warmup[0] ('w').inputs['X']",
            "sets none of zero_data",
        ),
        (
            'model_warmup [ { name: "w" batch_size: 9 inputs { key: "X" value { '
            "data_type: TYPE_FP32 dims: [ 4 ] zero_data: true } } } ]",
            "batch_size must be from 1 to 1 (max_batch_size 0)",
            "got 9",
        ),
        (
            'model_warmup [ { name: "w" batch_size: 1 inputs { key: "X" value { '
            'data_type: TYPE_FP32 dims: [ 4 ] input_data_file: "../x" } } } ]',
            "input_data_file '../x'",
            "plain file name",
        ),
        (
            'model_warmup [ { name: "w" batch_size: 1 inputs { key: "X" value { '
            "data_type: TYPE_FP32 dims: [ -1 ] random_data: true } } } ]",
            "dims must hold sizes >= 1",
            "",
        ),
        ('default_model_filename: "../x.onnx"', "model_filename", "plain file name"),
        ('input [ { name: "X" data_type: TYPE_BF16 dims: [ 4 ] } ]', "TYPE_BF16", ""),
        ("max_batch_size: -1", "max_batch_size must be >= 0, got -1", ""),
        (
            "version_policy { latest { num_versions: 0 } }",
            "version_policy.latest.num_versions must be >= 1, got 0",
            "",
        ),
        (
            "version_policy { specific { versions: [ 2, 0 ] } }",
            "version_policy.specific.versions must list versions >= 1, got [2, 0]",
            "",
        ),
        ("version_policy { specific { } }", "must list versions >= 1, got []", ""),
        ('input [ { name: "X" data_type: TYPE_FP32 dims: [ 0 ] } ]', "input[0].dims", ">= 1 or -1"),
        ("input [ { data_type: TYPE_FP32 dims: [ 4 ] } ]", "input[0].name is missing", ""),
        (
            'parameters { key: "corral.version" value { string_value: "x" } }',
            "parameters['corral.version']",
            "corral's own",
        ),
        (  # count is a uint32: protobuf refuses a negative one while parsing
            'model_warmup [ { name: "w" batch_size: 1 count: -1 inputs { key: "X" value { '
            "data_type: TYPE_FP32 dims: [ 4 ] zero_data: true } } } ]",
            "column 49",
            "Value out of range: -1",
        ),
        ("model_warmup [ { batch_size: 1 } ]", "model_warmup[0] has no inputs", ""),
        (
            'model_warmup [ { name: "w" batch_size: 1 inputs { key: "X" value { '
            "data_type: TYPE_BF16 dims: [ 4 ] zero_data: true } } } ]",
            "inputs['X'].data_type TYPE_BF16",
            "not a type corral serves",
        ),
        (
            'model_warmup [ { name: "w" batch_size: 1 inputs { key: "X" value { '
            "data_type: TYPE_FP32 dims: [ 4 ] random_data: false } } } ]",
            "inputs['X'].random_data is false",
            "set it true",
        ),
        (
            'model_warmup [ { name: "w" batch_size: 1 inputs { key: "X" value { '
            'data_type: TYPE_FP32 dims: [ 4 ] input_data_file: "x.raw" } } } ]',
            "input_data_file",
            "no model folder to read from",
        ),
        (
            'input [ { name: "X" data_type: TYPE_FP32 dims: [ 4 ] '
            "is_non_linear_format_io: true } ]",
            "input[0].is_non_linear_format_io is set (True)",
            "TensorRT's: remove it",
        ),
        ("instance_group [ { kind: KIND_MODEL } ]", "instance_group[0].kind KIND_MODEL", ""),
        ("instance_group [ { count: -2 } ]", "instance_group[0].count must be >= 0, got -2", ""),
        (
            "optimization { execution_accelerators { cpu_execution_accelerator [ { "
            'name: "tensorrt" } ] } }',
            "cpu_execution_accelerator[0].name 'tensorrt'",
            "openvino",
        ),
    ],
)
def test_what_corral_cannot_honour_is_refused_by_name(text: str, named: str, why: str):
    message = refused(text)
    assert named in message, message
    assert why in message, message


# -- the repository --------------------------------------------------------------------------


def test_the_repository_reads_config_pbtxt_and_its_labels(tmp_path: Path):
    add_model(tmp_path, "linear", build_linear(), version=1)
    add_model(tmp_path, "linear", build_linear(seed=1), version=2)
    (tmp_path / "linear" / "labels.txt").write_text("fraud\n")
    (tmp_path / "linear" / "config.pbtxt").write_text(
        'name: "linear"\nversion_policy { specific { versions: [ 1 ] } }\n'
        'output [ { name: "Y" data_type: TYPE_FP32 dims: [ -1, 1 ] label_filename: "labels.txt" } ]'
    )
    entry = Repository(tmp_path).entry("linear")
    assert entry.error is None, entry.error
    assert entry.served_versions == (1,)
    assert entry.config.outputs[0].labels == ("fraud",)


def test_model_toml_and_config_pbtxt_together_are_refused(tmp_path: Path):
    add_model(tmp_path, "linear", build_linear(), toml="pinned = true")
    (tmp_path / "linear" / "config.pbtxt").write_text('name: "linear"')
    error = Repository(tmp_path).entry("linear").error
    assert isinstance(error, ModelConfigError)
    assert "model.toml" in str(error), error
    assert "config.pbtxt" in str(error), error


def test_a_label_file_outside_the_folder_is_refused(tmp_path: Path):
    add_model(tmp_path, "linear", build_linear())
    (tmp_path / "linear" / "config.pbtxt").write_text(
        'output [ { name: "Y" data_type: TYPE_FP32 dims: [ -1, 1 ] label_filename: "../x" } ]'
    )
    error = Repository(tmp_path).entry("linear").error
    assert isinstance(error, ModelConfigError)
    assert "label_filename" in str(error), error


def test_default_model_filename_names_the_file_in_each_version(tmp_path: Path):
    folder = tmp_path / "linear" / "1"
    folder.mkdir(parents=True)
    (folder / "net.onnx").write_bytes(build_linear())
    (tmp_path / "linear" / "config.pbtxt").write_text('default_model_filename: "net.onnx"')
    entry = Repository(tmp_path).entry("linear")
    assert entry.error is None, entry.error
    assert entry.versions[1].path.name == "net.onnx"


# -- the load check --------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("declared", "named"),
    [
        ('input [ { name: "Z" data_type: TYPE_FP32 dims: [ 4 ] } ]', "'Z'"),
        ('input [ { name: "X" data_type: TYPE_INT64 dims: [ 4 ] } ]', "TYPE_INT64"),
        ('input [ { name: "X" data_type: TYPE_FP32 dims: [ 5 ] } ]', "dimension 1 is 4"),
        ('input [ { name: "X" data_type: TYPE_FP32 dims: [ 4, 1 ] } ]', "3 dimensions"),
        ('output [ { name: "Y" data_type: TYPE_FP32 dims: [ 2 ] } ]', "dimension 1 is 1"),
    ],
)
def test_declarations_that_do_not_match_the_model_fail_its_load(
    tmp_path: Path, declared: str, named: str
):
    add_model(tmp_path, "linear", build_linear())
    (tmp_path / "linear" / "config.pbtxt").write_text("max_batch_size: 8\n" + declared)
    with Host(tmp_path) as host, pytest.raises(ModelConfigError) as caught:
        host.load("linear")
    assert named in str(caught.value), caught.value


@pytest.mark.parametrize(
    ("extra", "combined_rows"),
    [("", 0), ("dynamic_batching { max_queue_delay_microseconds: 100 }\n", 8)],
    ids=["no dynamic_batching", "dynamic_batching"],
)
def test_a_matching_config_serves_with_its_batch_size(
    tmp_path: Path, extra: str, combined_rows: int
):
    # As in Triton: max_batch_size says the first dimension is the batch's; only with
    # dynamic_batching are requests combined, up to max_batch_size rows.
    add_model(tmp_path, "linear", build_linear())
    (tmp_path / "linear" / "config.pbtxt").write_text(LINEAR + extra)
    with Host(tmp_path) as host:
        outputs = host.infer("linear", {"X": np.ones((2, 4), np.float32)})
        assert outputs["Y"].shape == (2, 1)
        with host.acquire("linear") as lease:
            assert lease.max_batch_size == combined_rows
            assert lease.config.max_batch_size == 8
            assert lease.config.source == "config.pbtxt"
            assert lease.batching.startswith("not batched" if not combined_rows else "batched")
        # Each request's batch dimension is bounded by max_batch_size, as Triton's is.
        nine = np.ones((9, 4), np.float32)
        with pytest.raises(corral.InvalidInput, match="batch-size must be <= 8 for 'linear'"):
            host.infer("linear", {"X": nine})
        with host.acquire("linear") as lease, pytest.raises(corral.InvalidInput, match="<= 8"):
            lease.run({"X": nine})


def test_strings_with_a_batch_dimension_and_no_dynamic_batching_are_served(tmp_path: Path):
    # Triton's simple_identity: BYTES tensors cannot be combined, but max_batch_size: 8
    # without dynamic_batching asks for no combining; with dynamic_batching it is refused.
    from onnx import TensorProto, helper

    graph = helper.make_graph(
        [helper.make_node("Identity", ["S"], ["T"])],
        "strings",
        [helper.make_tensor_value_info("S", TensorProto.STRING, ["rows", "n"])],
        [helper.make_tensor_value_info("T", TensorProto.STRING, ["rows", "n"])],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8
    add_model(tmp_path, "strings", model.SerializeToString())
    config = tmp_path / "strings" / "config.pbtxt"
    config.write_text(
        'name: "strings"\nmax_batch_size: 8\n'
        'input [ { name: "S" data_type: TYPE_STRING dims: [ -1 ] } ]\n'
        'output [ { name: "T" data_type: TYPE_STRING dims: [ -1 ] } ]\n'
    )
    with Host(tmp_path) as host:
        words = np.array([[b"a", b"bc"]], dtype=object)
        answer = host.infer("strings", {"S": words})["T"]
        assert answer.tolist() == [["a", "bc"]]  # onnxruntime gives strings back as str
        config.write_text(config.read_text() + "dynamic_batching { }\n")
        host.unload("strings")
        with pytest.raises(ModelConfigError, match="remove dynamic_batching"):
            host.load("strings")


# -- a real server, stock clients ------------------------------------------------------------

CLASSIFIER = """
name: "classifier"
backend: "onnxruntime"
max_batch_size: 8
version_policy { specific { versions: [ 1 ] } }
input [ { name: "X" data_type: TYPE_FP32 dims: [ 4 ] } ]
output [ { name: "Y" data_type: TYPE_FP32 dims: [ 3 ] label_filename: "labels.txt" } ]
dynamic_batching { max_queue_delay_microseconds: 100 }
"""


def expected_classes(scores: np.ndarray, count: int, labels: list[str]) -> list[list[bytes]]:
    rows = []
    for row in scores:
        order = sorted(range(len(row)), key=lambda i: (-row[i], i))[:count]
        rows.append([f"{row[i]:.6f}:{i}:{labels[i]}".encode() for i in order])
    return rows


@pytest.mark.timeout(120)
def test_stock_clients_get_the_pinned_version_the_files_config_and_classes(tmp_path: Path):
    import tritonclient.grpc as grpcclient
    import tritonclient.http as httpclient
    from tritonclient.utils import InferenceServerException

    from tests.helpers import reference_run
    from tests.processes import start_server, stop_server

    repo = tmp_path / "repo"
    version_1 = build_linear(4, 3, seed=1)
    add_model(repo, "classifier", version_1, version=1)
    add_model(repo, "classifier", build_linear(4, 3, seed=2), version=2)
    labels = ["cat", "dog", "bird"]
    (repo / "classifier" / "labels.txt").write_text("\n".join(labels) + "\n")
    (repo / "classifier" / "config.pbtxt").write_text(CLASSIFIER)
    x = np.random.default_rng(3).standard_normal((2, 4)).astype(np.float32)
    scores = reference_run(version_1, {"X": x})[0]

    served = start_server(repo, tmp_path / "serve.log")
    try:
        http = httpclient.InferenceServerClient(served.http)
        grpc = grpcclient.InferenceServerClient(served.grpc)
        try:
            config = http.get_model_config("classifier")
            assert config["max_batch_size"] == 8
            assert config["version_policy"] == {"specific": {"versions": [1]}}
            assert config["dynamic_batching"]["max_queue_delay_microseconds"] == 100
            assert config["output"][0]["label_filename"] == "labels.txt"
            grpc_config = grpc.get_model_config("classifier").config
            assert grpc_config.max_batch_size == 8
            assert list(grpc_config.version_policy.specific.versions) == [1]
            assert grpc_config.output[0].label_filename == "labels.txt"

            tensor = httpclient.InferInput("X", [2, 4], "FP32")
            tensor.set_data_from_numpy(x)
            plain = http.infer("classifier", [tensor])
            assert plain.get_response()["model_version"] == "1"
            np.testing.assert_allclose(plain.as_numpy("Y"), scores, rtol=1e-6)
            with pytest.raises(InferenceServerException):
                http.infer("classifier", [tensor], model_version="2")

            wanted = expected_classes(scores, 2, labels)
            classes = http.infer(
                "classifier",
                [tensor],
                outputs=[httpclient.InferRequestedOutput("Y", class_count=2)],
            ).as_numpy("Y")
            assert classes.tolist() == wanted

            grpc_tensor = grpcclient.InferInput("X", [2, 4], "FP32")
            grpc_tensor.set_data_from_numpy(x)
            grpc_classes = grpc.infer(
                "classifier",
                [grpc_tensor],
                outputs=[grpcclient.InferRequestedOutput("Y", class_count=2)],
            ).as_numpy("Y")
            assert grpc_classes.tolist() == wanted
        finally:
            http.close()
            grpc.close()
    finally:
        stop_server(served)


# -- the classification extension ------------------------------------------------------------


def test_classes_of_an_unbatched_output_rank_the_whole_tensor():
    from corral.protocol.classification import top_classes

    values = np.array([[1, 3, 2], [9, 7, 8]], np.int64)
    assert top_classes("y", values, 2, batched=False).tolist() == [b"9:3", b"8:5"]
    assert top_classes("y", values, 9, batched=True).shape == (2, 3)  # clamped to the classes


def test_equal_values_rank_by_index_and_labels_end_where_the_file_does():
    from corral.protocol.classification import top_classes

    values = np.array([0.5, 0.5, 0.25], np.float32)
    ranked = top_classes("y", values, 3, batched=False, labels=("a",))
    assert ranked.tolist() == [b"0.500000:0:a", b"0.500000:1", b"0.250000:2"]


@pytest.mark.parametrize("value", [0, -1, True, "2"])
def test_a_class_count_that_is_not_a_positive_integer_is_refused(value: object):
    from corral._base.errors import InvalidInput
    from corral.protocol.classification import class_count
    from corral.protocol.types import RequestedOutput

    with pytest.raises(InvalidInput, match="classification"):
        class_count(RequestedOutput("y", parameters={"classification": value}))  # type: ignore[dict-item]


@pytest.mark.parametrize("values", [np.array([True, False]), np.array([b"a"], dtype=object)])
def test_outputs_without_an_order_cannot_be_classified(values: np.ndarray):
    from corral._base.errors import InvalidInput
    from corral.protocol.classification import top_classes

    with pytest.raises(InvalidInput, match="rank"):
        top_classes("y", values, 1, batched=False)


# -- model_warmup ----------------------------------------------------------------------------

WARM = """
name: "linear"
max_batch_size: 8
model_warmup [ {
  name: "%s" batch_size: 2 count: 3
  inputs { key: "X" value { data_type: TYPE_FP32 dims: [ 4 ] %s } }
} ]
"""


def _warm_model(root: Path, sample: str, data: str, name: str = "w") -> None:
    add_model(root, "linear", build_linear())
    (root / "linear" / "config.pbtxt").write_text(WARM % (name, data))


def test_a_warmup_file_is_read_from_the_warmup_folder_and_runs_count_times(tmp_path: Path):
    values = np.arange(8, dtype=np.float32).reshape(2, 4)
    _warm_model(tmp_path, "", 'input_data_file: "x.raw"')
    (tmp_path / "linear" / "warmup").mkdir()
    (tmp_path / "linear" / "warmup" / "x.raw").write_bytes(values.tobytes())
    config = Repository(tmp_path).entry("linear").config
    (sample,) = config.warmup_samples
    assert (sample.batch_size, sample.count) == (2, 3)
    np.testing.assert_array_equal(warmup_feed(sample, batched=True)["X"], values)
    # The inline lane off: its measuring runs at load would count among the runs too.
    with Host(tmp_path, inline_run_us=0) as host:
        host.load("linear")
        (version,) = host.status("linear").versions
        assert version.runs == 3  # no dynamic_batching: no probe; the sample's three runs


def test_random_data_is_random_and_of_the_sample_shape():
    (sample,) = parse(WARM % ("w", "random_data: true")).warmup_samples
    feed = warmup_feed(sample, batched=True)["X"]
    assert feed.shape == (2, 4)
    assert feed.dtype == np.float32
    assert len(np.unique(feed)) == 8


def test_a_warmup_file_of_the_wrong_size_is_refused_with_the_sizes(tmp_path: Path):
    _warm_model(tmp_path, "", 'input_data_file: "x.raw"')
    (tmp_path / "linear" / "warmup").mkdir()
    (tmp_path / "linear" / "warmup" / "x.raw").write_bytes(b"\0" * 31)
    error = Repository(tmp_path).entry("linear").error
    assert isinstance(error, ModelConfigError)
    assert "31 bytes, but 8 elements of TYPE_FP32 take 32" in str(error), error


def test_a_warmup_file_linked_out_of_the_model_folder_is_refused(tmp_path: Path):
    _warm_model(tmp_path, "", 'input_data_file: "x.raw"')
    (tmp_path / "secret").write_bytes(b"\0" * 32)
    (tmp_path / "linear" / "warmup").mkdir()
    (tmp_path / "linear" / "warmup" / "x.raw").symlink_to(tmp_path / "secret")
    error = Repository(tmp_path).entry("linear").error
    assert isinstance(error, ModelConfigError)
    assert "resolves outside the model's folder" in str(error), error


def test_a_missing_warmup_file_is_refused(tmp_path: Path):
    _warm_model(tmp_path, "", 'input_data_file: "x.raw"')
    error = Repository(tmp_path).entry("linear").error
    assert isinstance(error, ModelConfigError)
    assert "no such file in the model's warmup/ folder" in str(error), error


def test_bytes_warmup_data_is_read_as_triton_lays_it_out():
    data = b"".join(len(w).to_bytes(4, "little") + w for w in (b"ab", b"", b"xyz"))
    sample = WarmupSample(
        "s", 3, 1, (WarmupInput("S", "TYPE_STRING", (), "input_data_file", data),)
    )
    assert list(warmup_feed(sample, batched=True)["S"]) == [b"ab", b"", b"xyz"]


def test_a_warmup_sample_of_another_type_than_the_models_fails_the_load(tmp_path: Path):
    add_model(tmp_path, "linear", build_linear())
    (tmp_path / "linear" / "config.pbtxt").write_text(
        'max_batch_size: 8\nmodel_warmup [ { name: "half" batch_size: 1 inputs { '
        'key: "X" value { data_type: TYPE_FP16 dims: [ 4 ] zero_data: true } } } ]'
    )
    with Host(tmp_path) as host, pytest.raises(corral.ModelLoadError) as caught:
        host.load("linear")
    assert "warm-up sample 'half' gives input 'X' as TYPE_FP16" in str(caught.value)


def test_a_failing_warmup_sample_fails_the_load_naming_it(tmp_path: Path):
    add_model(tmp_path, "linear", build_linear())
    (tmp_path / "linear" / "config.pbtxt").write_text(
        'max_batch_size: 8\nmodel_warmup [ { name: "wrong-shape" batch_size: 1 inputs { '
        'key: "X" value { data_type: TYPE_FP32 dims: [ 5 ] zero_data: true } } } ]'
    )
    with Host(tmp_path) as host, pytest.raises(corral.ModelLoadError) as caught:
        host.load("linear")
    assert "warm-up sample 'wrong-shape' failed" in str(caught.value), caught.value


def test_an_unnamed_warmup_sample_for_an_input_the_model_lacks_fails_the_load(tmp_path: Path):
    add_model(tmp_path, "linear", build_linear())
    (tmp_path / "linear" / "config.pbtxt").write_text(
        "max_batch_size: 8\nmodel_warmup [ { batch_size: 1 inputs { "
        'key: "Z" value { data_type: TYPE_FP32 dims: [ 4 ] zero_data: true } } } ]'
    )
    with Host(tmp_path) as host:
        with pytest.raises(corral.ModelLoadError) as caught:
            host.load("linear")
        # Named as the sample's mistake, not as the model's input 'X' it leaves out.
        assert (
            "a warm-up sample gives input 'Z', which the model does not have; its inputs "
            "are 'X'" in str(caught.value)
        ), caught.value
        assert host.status("linear").state is corral.ModelState.FAILED


# -- default_queue_policy --------------------------------------------------------------------

QUEUE_POLICY = """
max_batch_size: 8
dynamic_batching { default_queue_policy { default_timeout_microseconds: 1 %s } }
"""


def test_the_queue_policy_maps_its_timeout_and_override():
    config = parse(QUEUE_POLICY % "allow_timeout_override: true")
    assert config.queue_timeout_us == 1
    assert config.queue_timeout_override is True
    assert parse(QUEUE_POLICY % "").queue_timeout_override is False


def _queued_past_the_default_timeout(tmp_path: Path, override: str, timeout: float | None) -> Any:
    """Answer to one request for 'linear' queued behind held compute workers, then released."""
    # One run per request, so that each blocker holds one compute worker.
    add_model(tmp_path, "slow", build_linear(), toml="max_batch_size = 0\n")
    add_model(tmp_path, "linear", build_linear())
    (tmp_path / "linear" / "config.pbtxt").write_text(QUEUE_POLICY % override)
    with Host(tmp_path) as host:
        assert host.preload() == {}
        gate, blockers = hold_compute_workers(host)
        try:
            answer = host.submit("linear", {"X": np.ones((1, 4), np.float32)}, timeout=timeout)
        finally:
            gate.open.set()
            for blocker in blockers:
                blocker.result(timeout=30)
        try:
            return answer.result(timeout=30)
        except corral.DeadlineExceeded as exc:
            return exc


def test_a_request_queued_past_the_default_timeout_is_deadline_exceeded(tmp_path: Path):
    assert isinstance(_queued_past_the_default_timeout(tmp_path, "", None), corral.DeadlineExceeded)


def test_without_override_the_default_timeout_holds_over_the_requests(tmp_path: Path):
    answer = _queued_past_the_default_timeout(tmp_path, "", 30.0)
    assert isinstance(answer, corral.DeadlineExceeded)


def test_with_override_a_requests_own_timeout_replaces_the_default(tmp_path: Path):
    answer = _queued_past_the_default_timeout(tmp_path, "allow_timeout_override: true", 30.0)
    assert set(answer) == {"Y"}


@pytest.mark.timeout(120)
def test_the_server_answers_504_for_a_request_queued_past_the_default_timeout(tmp_path: Path):
    import json
    import urllib.error
    import urllib.request

    from tests.processes import start_server, stop_server

    repo = tmp_path / "repo"
    add_model(repo, "linear", build_linear())
    add_model(repo, "patient", build_linear())
    # 1 µs: the request's deadline has passed by the time a compute worker takes it.
    (repo / "linear" / "config.pbtxt").write_text(QUEUE_POLICY % "")
    (repo / "patient" / "config.pbtxt").write_text("max_batch_size: 8\ndynamic_batching { }")
    body = json.dumps(
        {"inputs": [{"name": "X", "datatype": "FP32", "shape": [1, 4], "data": [1, 2, 3, 4]}]}
    ).encode()

    def post(model: str) -> tuple[int, str]:
        request = urllib.request.Request(f"http://{served.http}/v2/models/{model}/infer", body)
        try:
            with urllib.request.urlopen(request, timeout=30) as answer:
                return answer.status, answer.read().decode()
        except urllib.error.HTTPError as exc:
            return exc.code, exc.read().decode()

    served = start_server(repo, tmp_path / "serve.log")
    try:
        status, text = post("linear")
        assert status == 504, text
        status, text = post("patient")
        assert status == 200, text
        # /config reports the policy in force.
        with urllib.request.urlopen(f"http://{served.http}/v2/models/linear/config") as answer:
            policy = json.loads(answer.read())["dynamic_batching"]["default_queue_policy"]
        assert policy["default_timeout_microseconds"] == 1
        assert policy["allow_timeout_override"] is False
        assert policy["timeout_action"] == "REJECT"
    finally:
        stop_server(served)


def _string_sample(data: bytes) -> ModelConfig:
    text = (
        'name: "linear"\nmodel_warmup [ { name: "s" batch_size: 1 inputs { key: "S" value { '
        'data_type: TYPE_STRING dims: [ 2 ] input_data_file: "s.raw" } } } ]'
    )
    return parse_pbtxt(
        text,
        source="m/config.pbtxt",
        model_name="linear",
        read_labels=no_labels,
        read_warmup=lambda name, field, limit: data,
    )


def _element(value: bytes) -> bytes:
    return len(value).to_bytes(4, "little") + value


@pytest.mark.parametrize(
    ("data", "named"),
    [
        (_element(b"ab"), "ends before element 1 of 2"),
        (_element(b"ab") + b"\x01\x00", "ends before element 1 of 2"),
        (_element(b"ab") + (9).to_bytes(4, "little") + b"xy", "element 1 says 9 bytes"),
        (_element(b"ab") + _element(b"c") + b"!", "holds 1 bytes after its 2 elements"),
    ],
)
def test_a_string_warmup_file_must_hold_exactly_its_elements(data: bytes, named: str):
    with pytest.raises(ModelConfigError) as caught:
        _string_sample(data)
    assert str(caught.value).startswith("m/config.pbtxt: model_warmup[0] ('s').inputs['S']")
    assert named in str(caught.value), caught.value


def test_a_string_warmup_file_of_its_elements_is_fed_as_given():
    (sample,) = _string_sample(_element(b"ab") + _element(b"")).warmup_samples
    assert list(warmup_feed(sample, batched=False)["S"]) == [b"ab", b""]


@pytest.mark.parametrize(
    ("data_type", "dtype"),
    [("TYPE_BOOL", np.bool_), ("TYPE_INT8", np.int8), ("TYPE_UINT64", np.uint64)],
)
def test_random_data_of_bool_and_integers_keeps_the_type(data_type: str, dtype: type):
    sample = WarmupSample("r", 2, 1, (WarmupInput("X", data_type, (64,), "random_data"),))
    feed = warmup_feed(sample, batched=True)["X"]
    assert feed.dtype == dtype
    assert feed.shape == (2, 64)
    assert len(np.unique(feed)) > 1  # random, not zeros


def test_zero_and_random_strings_are_empty_as_in_triton():
    for kind in ("zero_data", "random_data"):
        sample = WarmupSample("z", 1, 1, (WarmupInput("S", "TYPE_STRING", (3,), kind),))
        feed = warmup_feed(sample, batched=False)["S"]
        assert feed.dtype == object
        assert list(feed) == [b"", b"", b""]


def test_declaring_some_inputs_but_not_all_fails_the_load_naming_the_rest(tmp_path: Path):
    add_model(tmp_path, "twoin", build_reshape())  # inputs X [N] and S [1]
    (tmp_path / "twoin" / "config.pbtxt").write_text(
        'input [ { name: "X" data_type: TYPE_FP32 dims: [ -1 ] } ]'
    )
    with Host(tmp_path) as host, pytest.raises(ModelConfigError) as caught:
        host.load("twoin")
    assert "config.pbtxt declares inputs but not the model's 'S'" in str(caught.value)


def _labels_at(root: Path, make: Any) -> BaseException | None:
    add_model(root / "repo", "linear", build_linear())
    folder = root / "repo" / "linear"
    (folder / "config.pbtxt").write_text(
        'output [ { name: "Y" data_type: TYPE_FP32 dims: [ -1, 1 ] label_filename: "labels.txt" } ]'
    )
    make(folder / "labels.txt", root)
    return Repository(root / "repo").entry("linear").error


def _sparse(path: Path, size: int) -> None:
    path.parent.mkdir(exist_ok=True)
    with path.open("wb") as file:
        file.truncate(size)  # a hole: no disk written


def _outside_the_root(path: Path, root: Path) -> None:
    (root / "elsewhere.txt").write_text("a\n")
    path.symlink_to(root / "elsewhere.txt")


@pytest.mark.parametrize(
    ("make", "named"),
    [
        (lambda path, root: None, "no such file in the model's folder"),
        (
            lambda path, root: path.symlink_to(path.parent / "gone.txt"),
            "cannot read it: [Errno 2] it is a symlink to a path that does not exist",
        ),
        (_outside_the_root, "resolves outside the repository root"),
        (lambda path, root: path.mkdir(), "not a regular file"),
        (
            lambda path, root: _sparse(path, MAX_LABELS_BYTES + 1),
            f"{MAX_LABELS_BYTES + 1} bytes is larger than the {MAX_LABELS_BYTES}-byte limit",
        ),
        (lambda path, root: path.write_bytes(b"caf\xe9\n"), "not UTF-8 text"),
    ],
    ids=["missing", "dangling", "outside", "folder", "too large", "not utf-8"],
)
def test_a_label_file_that_cannot_be_read_is_refused_naming_it(
    tmp_path: Path, make: Any, named: str
):
    error = _labels_at(tmp_path, make)
    assert isinstance(error, ModelConfigError)
    assert "output[0].label_filename 'labels.txt'" in str(error), error
    assert named in str(error), error


@pytest.mark.parametrize(
    ("make", "named"),
    [
        (lambda warmup: warmup.write_bytes(b""), "cannot read it: [Errno 20] Not a directory"),
        (lambda warmup: (warmup / "x.raw").mkdir(parents=True), "not a regular file"),
        (
            lambda warmup: _sparse(warmup / "x.raw", MAX_WARMUP_BYTES + 1),
            f"{MAX_WARMUP_BYTES + 1} bytes is larger than the {MAX_WARMUP_BYTES}-byte limit",
        ),
    ],
    ids=["warmup is a file", "folder", "too large"],
)
def test_a_warmup_file_that_cannot_be_read_is_refused_naming_it(
    tmp_path: Path, make: Any, named: str
):
    _warm_model(tmp_path, "", 'input_data_file: "x.raw"')
    make(tmp_path / "linear" / "warmup")
    error = Repository(tmp_path).entry("linear").error
    assert isinstance(error, ModelConfigError)
    assert "input_data_file 'x.raw'" in str(error), error
    assert named in str(error), error


def _make_absent(monkeypatch: pytest.MonkeyPatch, module: str) -> None:
    # A None entry in sys.modules makes the import fail; the parent's attribute must go too,
    # or ``from parent import module`` finds it there.
    parent, _, child = module.rpartition(".")
    monkeypatch.setitem(sys.modules, module, None)
    monkeypatch.delattr(importlib.import_module(parent), child, raising=False)


@pytest.mark.parametrize(
    "module", ["google.protobuf.text_format", "corral._proto.model_config_pb2"]
)
def test_without_protobuf_a_config_pbtxt_names_the_install(
    monkeypatch: pytest.MonkeyPatch, module: str
):
    _make_absent(monkeypatch, module)
    message = refused(LINEAR)
    assert "reading a config.pbtxt needs protobuf" in message, message
    assert "the grpc extra: pip install 'grpcio>=1.72.2' 'protobuf>=6.30.0'" in message, message
    assert "ModuleNotFoundError" in message, message


def test_without_protobuf_a_json_config_names_the_install(monkeypatch: pytest.MonkeyPatch):
    _make_absent(monkeypatch, "google.protobuf.json_format")
    with pytest.raises(ModelConfigError) as caught:
        pbtxt_from_json("{}", source="load config")
    assert "pip install 'grpcio>=1.72.2' 'protobuf>=6.30.0'" in str(caught.value)


def _leaf_configs() -> list[tuple[str, Any]]:
    """Each leaf of Triton's ModelConfig, at any depth: (its path, a message with it set)."""
    from corral._models.pbtxt.fields import is_repeated
    from corral._proto import model_config_pb2 as pb

    made: list[tuple[str, Any]] = []

    def walk(descriptor: Any, path: tuple[str, ...]) -> None:
        for field in descriptor.fields:
            here = (*path, field.name)
            is_map = field.message_type is not None and field.message_type.GetOptions().map_entry
            if field.message_type is not None and not is_map and len(here) < 8:
                walk(field.message_type, here)
            elif field.message_type is None or is_map:
                made.append((".".join(here), _with_leaf(pb.ModelConfig(), here, is_repeated)))

    walk(pb.ModelConfig.DESCRIPTOR, ())
    return made


def _with_leaf(message: Any, path: tuple[str, ...], is_repeated: Any) -> Any:
    root = message
    for name in path[:-1]:
        field = message.DESCRIPTOR.fields_by_name[name]
        message = getattr(message, name).add() if is_repeated(field) else getattr(message, name)
    field = message.DESCRIPTOR.fields_by_name[path[-1]]
    if field.message_type is not None:  # a map: one entry
        entries = getattr(message, path[-1])
        key = 1 if field.message_type.fields_by_name["key"].type != field.TYPE_STRING else "k"
        value = field.message_type.fields_by_name["value"]
        if value.message_type is not None:
            entries[key].SetInParent()
        else:
            entries[key] = "v"
        return root
    value = {
        field.TYPE_BOOL: True,
        field.TYPE_STRING: "x",
        field.TYPE_ENUM: 1,
        field.TYPE_FLOAT: 1.0,
        field.TYPE_DOUBLE: 1.0,
    }.get(field.type, 1)
    if is_repeated(field):
        getattr(message, path[-1]).append(value)
    else:
        setattr(message, path[-1], value)
    return root


@pytest.mark.parametrize(
    ("path", "message"), [pytest.param(*leaf, id=leaf[0]) for leaf in _leaf_configs()]
)
def test_every_field_of_tritons_config_is_honoured_named_or_refused_with_a_reason(
    path: str, message: Any
):
    from corral._models.pbtxt.fields import check_fields

    try:
        check_fields(message, "m/config.pbtxt")
        reason = ""
    except ModelConfigError as refused:
        reason = str(refused)
    assert "corral does not honour this field" not in reason, path


# -- a declared size (issue 49) ---------------------------------------------------------------


def test_corral_memory_bytes_declares_what_one_version_costs():
    config = parse(
        'name: "linear"\n'
        'parameters { key: "corral_memory_bytes" value { string_value: "64MiB" } }\n'
    )
    assert config.memory_bytes == 64 * 2**20
    assert ("corral_memory_bytes", "64MiB") in config.parameters


@pytest.mark.parametrize(
    ("value", "problem"),
    [
        ("64M", "is ambiguous"),
        ("lots", "is not a size"),
        ("0", "must be positive"),
        ("1.5B", "is not a whole number of bytes"),
    ],
)
def test_a_declared_size_that_is_not_one_is_refused_naming_the_parameter(value, problem):
    with pytest.raises(ModelConfigError) as caught:
        parse(
            'name: "linear"\n'
            f'parameters {{ key: "corral_memory_bytes" value {{ string_value: "{value}" }} }}\n'
        )
    assert f"parameters['corral_memory_bytes'] {problem}" in str(caught.value).replace(
        f" {value!r}", ""
    )
    assert "config.pbtxt" in str(caught.value)


# -- Triton Python models (backend: "python") ------------------------------------------------

PYTHON_CONFIG = """
name: "pre"
backend: "python"
max_batch_size: 8
input [ { name: "RAW" data_type: TYPE_STRING dims: [ 1 ] } ]
output [ { name: "OUT" data_type: TYPE_FP32 dims: [ -1, 3 ] } ]
instance_group [ { count: 3 kind: KIND_CPU } ]
parameters { key: "EXECUTION_ENV_PATH" value { string_value: "env.tar.gz" } }
"""


def test_a_python_models_config_keeps_tritons_json_for_its_initialize():
    config = parse(PYTHON_CONFIG, name="pre")
    assert (config.backend, config.model_filename, config.concurrency) == (
        "python",
        "model.py",
        "pool:3",
    )
    triton = json.loads(config.triton_json)
    assert triton["name"] == "pre"
    assert triton["max_batch_size"] == 8
    # Numbers, as Triton writes them (protobuf's JSON writes 64-bit integers as strings).
    assert triton["output"] == [{"name": "OUT", "data_type": "TYPE_FP32", "dims": [-1, 3]}]
    assert triton["instance_group"] == [{"count": 3, "kind": "KIND_CPU"}]
    assert any("EXECUTION_ENV_PATH" in why for why in config.no_effect)
    assert parse('name: "m"\nplatform: "onnxruntime_onnx"\n', name="m").triton_json == ""


def test_a_python_model_with_a_platform_is_refused():
    message = refused('backend: "python"\nplatform: "onnxruntime_onnx"\n', name="m")
    assert "remove platform" in message, message
