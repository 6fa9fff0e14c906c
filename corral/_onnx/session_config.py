"""onnxruntime's session configuration entries a model may set (``add_session_config_entry``).

onnxruntime takes any key in ``SessionOptions.add_session_config_entry`` and drops the ones it
does not know without a word, so a misspelt key would leave a model running without the
setting its author asked for. corral takes only the keys listed here (from onnxruntime's
``onnxruntime_session_options_config_keys.h``) and refuses any other by name, with the list.
Left out on purpose: the keys that name a file for onnxruntime to read or write (a model's
settings never open a file outside the model's folder), and ``session.use_env_allocators``,
which the Runtime's ``arena`` sets.
"""

from __future__ import annotations

import difflib
from collections.abc import Iterable, Mapping
from types import MappingProxyType

__all__ = ["SESSION_CONFIG_KEYS", "check_session_config"]

#: The session configuration keys a model may set, and what each does.
SESSION_CONFIG_KEYS: Mapping[str, str] = MappingProxyType(
    {
        "session.set_denormal_as_zero": "flush denormal floats to zero ('1')",
        "session.disable_prepacking": "keep weights as stored, unpacked ('1')",
        "session.use_device_allocator_for_initializers": (
            "allocate initializers with the device allocator, not the arena ('1')"
        ),
        "session.intra_op.allow_spinning": "per-session intra-op threads spin between runs",
        "session.inter_op.allow_spinning": "per-session inter-op threads spin between runs",
        "session.intra_op_thread_affinities": "pin per-session intra-op threads to cores",
        "session.disable_quant_qdq": "do not fuse QuantizeLinear/DequantizeLinear pairs",
        "session.disable_double_qdq_remover": "keep double QDQ pairs",
        "session.enable_quant_qdq_cleanup": "remove redundant QDQ pairs",
        "session.qdqisint8allowed": "QDQ fusions may use int8",
        "session.x64quantprecision": "x64 quantized kernels' precision",
        "session.disable_aot_function_inlining": "do not inline functions ahead of time",
        "session.disable_cpu_ep_fallback": "fail instead of running nodes on the CPU provider",
        "session.strict_shape_type_inference": "fail on shape and type inference mismatches",
        "session.allow_released_opsets_only": "refuse models of opsets not yet released",
        "session.dynamic_block_base": "block base of dynamic parallel scheduling",
        "session.graph_optimizations_loop_level": "how often graph optimizations repeat",
        "session.qdq_matmulnbits_accuracy_level": "accuracy level of MatMulNBits from QDQ",
        "optimization.enable_gelu_approximation": "approximate Gelu",
        "optimization.disable_specified_optimizers": "optimizers to leave out, by name",
        "optimization.minimal_build_optimizations": "optimizations of a minimal build",
        "mlas.enable_gemm_fastmath_arm64_bfloat16": "bfloat16 fast-math GEMM on arm64",
    }
)

_NOT_OURS = {
    "session.use_env_allocators": "the Runtime's arena sets it (Runtime(arena=...))",
}


def check_session_config(entries: Iterable[tuple[str, object]]) -> tuple[tuple[str, str], ...]:
    """Session configuration entries checked, as sorted ``(key, text value)`` pairs.

    A boolean becomes ``"1"``/``"0"``, a number its text. Raises ValueError naming a key not
    in :data:`SESSION_CONFIG_KEYS` (with the closest known one and the list), a key given
    twice, or a value that is not a string, number or boolean.
    """
    checked: dict[str, str] = {}
    for key, value in entries:
        if key in _NOT_OURS:
            raise ValueError(f"session_config key {key!r} is not a model's: {_NOT_OURS[key]}")
        if key not in SESSION_CONFIG_KEYS:
            close = difflib.get_close_matches(key, SESSION_CONFIG_KEYS, n=1)
            hint = f" (did you mean {close[0]!r}?)" if close else ""
            raise ValueError(
                f"session_config key {key!r} is not one corral passes to onnxruntime{hint}; "
                f"the known keys are {', '.join(sorted(SESSION_CONFIG_KEYS))}"
            )
        if key in checked:
            raise ValueError(f"session_config sets {key!r} twice")
        if isinstance(value, bool):
            checked[key] = "1" if value else "0"
        elif isinstance(value, str | int | float):
            checked[key] = str(value)
        else:
            raise ValueError(
                f"session_config[{key!r}] must be a string, number or boolean, got {value!r}"
            )
    return tuple(sorted(checked.items()))
