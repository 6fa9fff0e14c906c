"""A Triton repository of ONNX models, with the config.pbtxt fields Triton's users write, serves.

Each model below is the linear model under a config.pbtxt made of fields Triton documents:
its model configuration guide's examples (dynamic batching with preferred sizes and a delay,
instance groups with a rate limiter, priorities and queue policies, model warm-up, metric
controls) and its onnxruntime backend's parameters and optimization settings (graph level,
thread counts, memory arena and pattern, CUDA graphs and CUDA-only parameters on a CPU
machine). Written here from the documented fields. Every model must serve the linear model's
answers; what has no effect on this machine is named once per model in the log at its load.
"""

from __future__ import annotations

import logging
from pathlib import Path

import numpy as np
import pytest

import corral
from corral.testing import build_linear
from tests.helpers import add_model

pytestmark = pytest.mark.timeout(120)

_TENSORS = """
input [ { name: "X" data_type: TYPE_FP32 dims: [ 4 ] } ]
output [ { name: "Y" data_type: TYPE_FP32 dims: [ 1 ] } ]
"""

#: Model name → its config.pbtxt body (after name, platform, max_batch_size and tensors), and
#: the fields its load must name as without effect here (empty: none).
CONFIGS: dict[str, tuple[str, tuple[str, ...]]] = {
    "minimal": ("", ()),
    "preferred": (
        "dynamic_batching { preferred_batch_size: [ 4, 8 ] max_queue_delay_microseconds: 100 }",
        (),
    ),
    "instances": ("instance_group [ { count: 2 kind: KIND_CPU } ]", ()),
    "rate_limited": (
        "instance_group [ { count: 2 kind: KIND_CPU rate_limiter { resources [ "
        '{ name: "R1" count: 4 }, { name: "R2" global: true count: 2 } ] priority: 2 } } ]',
        ("instance_group.rate_limiter",),
    ),
    "priorities": (
        "dynamic_batching { priority_levels: 2 default_priority_level: 1 preserve_ordering: true "
        "default_queue_policy { max_queue_size: 64 default_timeout_microseconds: 1000000 "
        "allow_timeout_override: true } }",
        (
            "dynamic_batching.priority_levels",
            "dynamic_batching.default_priority_level",
            "dynamic_batching.preserve_ordering",
        ),
    ),
    "backend_tuning": (
        "optimization { graph { level: 1 } }\n"
        'parameters { key: "intra_op_thread_count" value: { string_value: "0" } }\n'
        'parameters { key: "execution_mode" value: { string_value: "0" } }\n'
        'parameters { key: "inter_op_thread_count" value: { string_value: "0" } }',
        ("intra_op_thread_count", "inter_op_thread_count"),  # the Runtime's global pools
    ),
    "memory": (
        'parameters { key: "enable_mem_arena" value: { string_value: "1" } }\n'
        'parameters { key: "enable_mem_pattern" value: { string_value: "0" } }\n'
        'parameters { key: "session.use_device_allocator_for_initializers" value: { '
        'string_value: "1" } }\n'
        'parameters { key: "memory.enable_memory_arena_shrinkage" value: { string_value: '
        '"cpu:0" } }',
        (),
    ),
    "gpu_settings": (
        "optimization { cuda { graphs: true busy_wait_events: true output_copy_stream: true } "
        "priority: PRIORITY_MAX input_pinned_memory { enable: true } "
        "output_pinned_memory { enable: true } gather_kernel_buffer_threshold: 8 "
        "eager_batching: true }\n"
        'parameters { key: "cudnn_conv_algo_search" value: { string_value: "0" } }\n'
        'parameters { key: "gpu_mem_limit" value: { string_value: "4294967200" } }\n'
        'parameters { key: "arena_extend_strategy" value: { string_value: "0" } }\n'
        'parameters { key: "do_copy_in_default_stream" value: { string_value: "1" } }\n'
        'parameters { key: "memory.enable_memory_arena_shrinkage" value: { string_value: '
        '"cpu:0;gpu:0" } }\n'
        'cc_model_filenames { key: "7.5" value: "model_t4.onnx" }',
        (
            "optimization.cuda.graphs",
            "optimization.priority",
            "optimization.input_pinned_memory",
            "gather_kernel_buffer_threshold",
            "eager_batching",
            "cudnn_conv_algo_search",
            "gpu_mem_limit",
            "arena_extend_strategy",
            "do_copy_in_default_stream",
            "cc_model_filenames",
            "arena_shrinkage (parameters['memory.enable_memory_arena_shrinkage']) gpu:0",
        ),
    ),
    "observed": (
        'metric_tags { key: "team" value: "fraud" }\n'
        "model_metrics { metric_control [ { metric_identifier { family: "
        '"nv_inference_request_duration" } histogram_options { buckets: [ 1, 2, 4 ] } } ] }\n'
        "model_transaction_policy { decoupled: false }\n"
        'parameters { key: "use_global_thread_pool" value: { string_value: "1" } }',
        ("metric_tags", "model_metrics", "use_global_thread_pool"),
    ),
    "warmed": (
        'model_warmup [ { name: "zeros" batch_size: 2 count: 2 inputs { key: "X" value: { '
        "data_type: TYPE_FP32 dims: [ 4 ] zero_data: true } } } ]\n"
        "version_policy: { latest: { num_versions: 2 } }",
        (),
    ),
}


def _write(root: Path) -> None:
    for name, (body, _) in CONFIGS.items():
        add_model(root, name, build_linear())
        if name == "warmed":
            add_model(root, name, build_linear(), version=2)
        (root / name / "config.pbtxt").write_text(
            f'name: "{name}"\nplatform: "onnxruntime_onnx"\nmax_batch_size: 8\n{_TENSORS}{body}\n'
        )


def test_every_model_of_a_triton_repository_serves_with_triton_s_answers(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
):
    _write(tmp_path)
    caplog.set_level(logging.WARNING, logger="corral")
    x = np.arange(12, dtype=np.float32).reshape(3, 4)
    with corral.Session(build_linear()) as reference:
        expected = reference.run({"X": x})["Y"]
    with corral.Host(tmp_path).start() as host:
        for name in CONFIGS:
            np.testing.assert_allclose(host.infer(name, {"X": x})["Y"], expected, rtol=1e-6)
        # A second load of every version (a reload) names nothing again.
        named_once = [r.getMessage() for r in caplog.records if "without effect" in r.getMessage()]
        host.infer("warmed", {"X": x}, version=1)
    lines = [r.getMessage() for r in caplog.records if "without effect" in r.getMessage()]
    assert lines == named_once
    for name, (_, named) in CONFIGS.items():
        mine = [line for line in lines if f"model {name!r}:" in line]
        if not named:
            assert mine == [], mine
            continue
        assert len(mine) == 1, mine  # one line per model, for all its fields
        for field in named:
            assert field in mine[0], (field, mine[0])


def test_preferred_batch_sizes_cut_a_batch_before_its_window_closes(tmp_path: Path):
    add_model(tmp_path, "linear", build_linear())
    (tmp_path / "linear" / "config.pbtxt").write_text(
        'name: "linear"\nmax_batch_size: 8\n'
        # A window no test waits for: the two requests are answered when they fill 2.
        "dynamic_batching { preferred_batch_size: [ 2 ] max_queue_delay_microseconds: 60000000 }"
    )
    x = np.ones((1, 4), np.float32)
    with corral.Host(tmp_path).start() as host:
        host.infer("linear", {"X": x})  # loaded
        first = host.submit("linear", {"X": x})
        second = host.submit("linear", {"X": 2 * x})
        assert first.result(timeout=30)["Y"].shape == (1, 1)
        assert second.result(timeout=30)["Y"].shape == (1, 1)


def test_the_config_documents_report_the_preferred_batch_sizes(tmp_path: Path):
    from corral.protocol.grpc_codec import encode_model_config
    from corral.protocol.json.documents import config_doc
    from corral.protocol.metadata import model_configuration

    _write(tmp_path)
    with corral.Host(tmp_path).start() as host:
        for name, sizes in (("preferred", [4, 8]), ("priorities", [])):
            with host.acquire(name) as lease:
                config = model_configuration(lease)
            batching = config_doc(config)["dynamic_batching"]
            assert batching.get("preferred_batch_size", []) == sizes
            message = encode_model_config(config).config
            assert list(message.dynamic_batching.preferred_batch_size) == sizes
