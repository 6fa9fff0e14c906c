"""Triton's onnxruntime backend parameters mapped onto corral's settings, one pair at a time.

``backend_setting`` is what a config.pbtxt's ``parameters`` go through, and what the server's
``--backend-config onnxruntime,<key>=<value>`` pairs are to go through.
"""

from __future__ import annotations

import os

import pytest

from corral._base.errors import ModelConfigError
from corral._models import BACKEND_PARAMETERS, backend_setting, backend_settings

#: A value each parameter takes, and what it sets: ModelConfig fields, CUDA provider options,
#: or why it has no effect (a fragment of it).
VALID = {
    "execution_mode": ("1", {"execution_mode": "parallel"}, (), None),
    "intra_op_thread_count": ("3", {"intra_op_threads": 3}, (), None),
    "inter_op_thread_count": ("0", {"inter_op_threads": os.cpu_count() or 1}, (), None),
    "enable_mem_arena": ("off", {"cpu_mem_arena": False}, (), None),
    "enable_mem_pattern": ("TRUE", {"mem_pattern": True}, (), None),
    "session.use_device_allocator_for_initializers": (
        "true",
        {"session_config": (("session.use_device_allocator_for_initializers", "1"),)},
        (),
        None,
    ),
    "share_session_between_instances": ("1", {"concurrency": "shared"}, (), None),
    "cudnn_conv_algo_search": ("2", {}, (("cudnn_conv_algo_search", "DEFAULT"),), None),
    "gpu_mem_limit": ("1024", {}, (("gpu_mem_limit", "1024"),), None),
    "arena_extend_strategy": ("1", {}, (("arena_extend_strategy", "kSameAsRequested"),), None),
    "do_copy_in_default_stream": ("false", {}, (("do_copy_in_default_stream", "0"),), None),
    "use_global_thread_pool": ("1", {}, (), "thread pools"),
    "memory.enable_memory_arena_shrinkage": (
        "cpu:0;gpu:1",
        {"arena_shrinkage": "cpu:0;gpu:1"},
        (),
        None,
    ),
    "share_weights_between_sessions": ("1", {}, (), "weights"),
    "enable_dynamic_shapes": ("1", {}, (), "shapes"),
}


def test_every_backend_parameter_has_a_case():
    assert set(VALID) == BACKEND_PARAMETERS


@pytest.mark.parametrize("name", sorted(VALID))
def test_each_parameter_maps_onto_corrals_settings(name: str):
    value, values, cuda, why = VALID[name]
    setting = backend_setting(name, value)
    assert dict(setting.values) == values
    assert setting.cuda_options == cuda
    if why is None:
        assert setting.no_effect is None
    else:
        assert setting.no_effect is not None
        assert why in setting.no_effect


@pytest.mark.parametrize(
    ("name", "value", "fragment"),
    [
        ("execution_mode", "2", "'0' (sequential), '1' (parallel), got '2'"),
        ("intra_op_thread_count", "-1", "a count of threads (0: the cores), got '-1'"),
        ("enable_mem_pattern", "yes", "'1'/'true'/'on' or '0'/'false'/'off', got 'yes'"),
        ("gpu_mem_limit", "4GiB", "a number of bytes, got '4GiB'"),
        ("arena_extend_strategy", "2", "'0' (kNextPowerOfTwo), '1' (kSameAsRequested)"),
        ("use_global_thread_pool", "maybe", "got 'maybe'"),
        ("memory.enable_memory_arena_shrinkage", "cpu", "'cpu:0' or 'gpu:<id>', separated by"),
    ],
)
def test_a_value_the_backend_would_not_take_is_refused_naming_the_values(
    name: str, value: str, fragment: str
):
    with pytest.raises(ModelConfigError) as refused:
        backend_setting(name, value)
    assert f"parameters[{name!r}] must be" in str(refused.value)
    assert fragment in str(refused.value)


def test_a_name_that_is_not_the_backends_is_refused_with_the_known_ones():
    with pytest.raises(ModelConfigError, match="'intra_op_threads' is not a parameter of"):
        backend_setting("intra_op_threads", "2")


def test_together_cuda_settings_go_to_a_gpu_and_are_named_on_the_cpu():
    parameters = {"gpu_mem_limit": "1024", "enable_mem_arena": "0", "label": "kept apart"}
    on_gpu = backend_settings(parameters, gpu=True)
    assert on_gpu.cuda_options == (("gpu_mem_limit", "1024"),)
    assert (dict(on_gpu.values), on_gpu.no_effect) == ({"cpu_mem_arena": False}, ())
    on_cpu = backend_settings(parameters, gpu=False)
    assert on_cpu.cuda_options == ()
    assert on_cpu.no_effect == (
        "parameters['gpu_mem_limit']: a setting of the CUDA provider, and this model runs on "
        "the CPU",
    )


def test_a_session_config_key_among_the_parameters_is_named_not_applied():
    # Triton's backend reads only session.use_device_allocator_for_initializers of these.
    settings = backend_settings({"session.set_denormal_as_zero": "1"}, gpu=False)
    assert dict(settings.values) == {}
    (line,) = settings.no_effect
    assert line.startswith("parameters['session.set_denormal_as_zero']: ")
    assert "model.toml's [session_config]" in line
