"""Provider options: what each execution provider's options name, for a model's settings.

A model's settings (its model.toml's ``providers`` tables, its config.pbtxt's accelerator
``parameters``, a load's ``config``) reach onnxruntime as provider options, text keys and
values. Some of those values are not numbers or switches but paths: a library the provider
loads (TensorRT's ``trt_extra_plugin_lib_paths``, QNN's ``backend_path``: code that runs in
the server, as a custom op library's does), a file or folder it reads or writes (engine and
timing caches, calibration tables, profiles, compiled models), or a switch that makes it write
files where another option says. This table records, for the providers corral knows, every
option it lets a model's settings give and what kind of thing the option names;
:mod:`corral._models.provider_options` checks a model's settings against it before any session
is built, so that the check does not depend on which providers this onnxruntime build has.

It is an allow-list, not a list of the dangerous options: an option not in it is refused by
name, since nothing is known of what it names (onnxruntime adds options with each release,
and a new one may name a file). The names are onnxruntime's, as its execution-provider pages
give them; options that carry a pointer (``user_compute_stream``, OpenVINO's ``context``)
are left out on purpose: a setting can never give one.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType

__all__ = ["PROVIDER_OPTIONS", "OptionKind", "ProviderOption"]


class OptionKind(enum.Enum):
    #: A number, a switch or a mode's name: it names nothing on disk.
    VALUE = "value"
    #: A library the provider loads: code that runs in the server.
    LIBRARY = "library"
    #: A file or folder the provider reads or writes (a cache, a table, a profile).
    PATH = "path"
    #: A file name the provider joins to a folder another option names: a plain name only.
    NAME = "name"
    #: A switch that makes the provider read or write files (where a PATH option says, else
    #: in the server's working folder).
    FILES = "files"

    @property
    def described(self) -> str:
        """What an option of this kind names, for messages."""
        return _DESCRIBED[self]


_DESCRIBED = {
    OptionKind.VALUE: "a value",
    OptionKind.LIBRARY: "a library to load",
    OptionKind.PATH: "a file or folder",
    OptionKind.NAME: "a file name",
    OptionKind.FILES: "a switch that reads or writes files",
}


@dataclass(frozen=True)
class ProviderOption:
    """One option a model's settings may give a provider."""

    #: What its value names.
    kind: OptionKind
    #: For a value that lists several paths, what separates them ("" if it names one).
    separator: str = ""


_VALUE = ProviderOption(OptionKind.VALUE)
_LIBRARY = ProviderOption(OptionKind.LIBRARY)
_PATH = ProviderOption(OptionKind.PATH)
_NAME = ProviderOption(OptionKind.NAME)
_FILES = ProviderOption(OptionKind.FILES)


def _options(
    values: str, paths: str = "", libraries: str = "", names: str = "", files: str = ""
) -> Mapping[str, ProviderOption]:
    table: dict[str, ProviderOption] = {}
    for text, option in (
        (values, _VALUE),
        (paths, _PATH),
        (libraries, _LIBRARY),
        (names, _NAME),
        (files, _FILES),
    ):
        table.update(dict.fromkeys(text.split(), option))
    return table


_TENSORRT = {
    **_options(
        values="""
            device_id trt_max_workspace_size trt_max_partition_iterations trt_min_subgraph_size
            trt_fp16_enable trt_bf16_enable trt_int8_enable trt_int8_use_native_calibration_table
            trt_dla_enable trt_dla_core trt_engine_decryption_enable
            trt_force_sequential_engine_build trt_context_memory_sharing_enable
            trt_layer_norm_fp32_fallback trt_force_timing_cache trt_detailed_build_log
            trt_build_heuristics_enable trt_sparsity_enable trt_builder_optimization_level
            trt_auxiliary_streams trt_tactic_sources trt_profile_min_shapes
            trt_profile_max_shapes trt_profile_opt_shapes trt_cuda_graph_enable
            trt_ep_context_embed_mode trt_weight_stripped_engine_enable trt_engine_hw_compatible
            trt_op_types_to_exclude trt_preview_features
        """,
        paths="trt_engine_cache_path trt_timing_cache_path trt_ep_context_file_path "
        "trt_onnx_model_folder_path",
        libraries="trt_engine_decryption_lib_path",
        names="trt_int8_calibration_table_name trt_engine_cache_prefix",
        files="trt_engine_cache_enable trt_timing_cache_enable trt_dump_subgraphs "
        "trt_dump_ep_context_model",
    ),
    # onnxruntime splits this one on ';' and loads each library.
    "trt_extra_plugin_lib_paths": ProviderOption(OptionKind.LIBRARY, separator=";"),
}

#: Each provider corral knows, and the options a model's settings may give it. A provider
#: not here takes no options from a model's settings (its name alone is fine).
PROVIDER_OPTIONS: Mapping[str, Mapping[str, ProviderOption]] = MappingProxyType(
    {
        "CPUExecutionProvider": {},
        "CUDAExecutionProvider": _options(
            values="""
                device_id gpu_mem_limit arena_extend_strategy cudnn_conv_algo_search
                do_copy_in_default_stream cudnn_conv_use_max_workspace cudnn_conv1d_pad_to_nc1d
                enable_cuda_graph enable_skip_layer_norm_strict_mode use_tf32 prefer_nhwc
                use_ep_level_unified_stream tunable_op_enable tunable_op_tuning_enable
                tunable_op_max_tuning_duration_ms sdpa_kernel fuse_conv_bias
            """
        ),
        "TensorrtExecutionProvider": _TENSORRT,
        "ROCMExecutionProvider": _options(
            values="""
                device_id gpu_mem_limit arena_extend_strategy miopen_conv_exhaustive_search
                do_copy_in_default_stream tunable_op_enable tunable_op_tuning_enable
                tunable_op_max_tuning_duration_ms enable_hip_graph
            """
        ),
        "MIGraphXExecutionProvider": _options(
            values="""
                device_id migraphx_fp16_enable migraphx_bf16_enable migraphx_fp8_enable
                migraphx_int8_enable migraphx_use_native_calibration_table
                migraphx_exhaustive_tune migraphx_mem_limit migraphx_arena_extend_strategy
            """,
            paths="migraphx_int8_calibration_table_name migraphx_save_model_path "
            "migraphx_load_model_path migraphx_model_cache_dir",
            files="migraphx_save_compiled_model migraphx_load_compiled_model",
        ),
        "OpenVINOExecutionProvider": _options(
            values="""
                device_type precision num_of_threads num_streams enable_opencl_throttling
                enable_qdq_optimizer disable_dynamic_shapes enable_dynamic_shapes
                enable_npu_fast_compile model_priority device_id
            """,
            paths="cache_dir load_config",
        ),
        "DmlExecutionProvider": _options(
            values="device_id performance_preference device_filter disable_metacommands "
            "enable_graph_capture"
        ),
        "CoreMLExecutionProvider": _options(
            values="""
                ModelFormat MLComputeUnits RequireStaticInputShapes EnableOnSubgraphs
                SpecializationStrategy ProfileComputePlan AllowLowPrecisionAccumulationOnGPU
            """,
            paths="ModelCacheDirectory",
        ),
        "QNNExecutionProvider": _options(
            values="""
                backend_type profiling_level rpc_control_latency vtcm_mb htp_performance_mode
                htp_graph_finalization_optimization_mode qnn_context_priority soc_model
                htp_arch device_id enable_htp_fp16_precision offload_graph_io_quantization
                enable_htp_spill_fill_buffer enable_htp_shared_memory_allocator
            """,
            paths="profiling_file_path json_qnn_graph_dir",
            libraries="backend_path qnn_saver_path",
            files="dump_json_qnn_graph",
        ),
        "XnnpackExecutionProvider": _options(values="intra_op_num_threads"),
        "WebGpuExecutionProvider": _options(values="deviceId preferredLayout enableGraphCapture"),
    }
)
