"""The onnxruntime and ONNX-file boundary, on :mod:`corral._base`.

onnxruntime's calls (:mod:`corral._onnx.ort`, the one place they are made), execution
providers, their device lanes and the options a model's settings may give them, model
signatures, session tuning, and the model-file reader.

This is the folder's face: the layers above import these names from here, never a module
inside it (tests/test_layers.py).
"""

from corral._onnx import ort
from corral._onnx.device_lanes import DeviceKey, device_lane, run_on_lanes
from corral._onnx.modelfile import ModelFile, ModelFootprint, read_footprint, read_model_file
from corral._onnx.optimized_models import OptimizedModels
from corral._onnx.ort import EXTENSIONS_LIBRARY
from corral._onnx.provider_options import PROVIDER_OPTIONS, OptionKind, ProviderOption
from corral._onnx.providers import (
    MAX_POOL_SIZE,
    PROVIDER_TABLE,
    ConcurrencyPolicy,
    ProviderTraits,
    ResolvedProviders,
    emulate_on_cpu,
    resolve_policy,
    resolve_providers,
)
from corral._onnx.session_config import SESSION_CONFIG_KEYS
from corral._onnx.signature import DeclaredSignature, Dim, Reshape, Signature, TensorSpec
from corral._onnx.tuning import SessionTuning
from corral._onnx.value_dependence import (
    footprint_and_value_dependence,
    read_model_file_and_proof,
)

__all__ = [
    "EXTENSIONS_LIBRARY",
    "MAX_POOL_SIZE",
    "PROVIDER_OPTIONS",
    "PROVIDER_TABLE",
    "SESSION_CONFIG_KEYS",
    "ConcurrencyPolicy",
    "DeclaredSignature",
    "DeviceKey",
    "Dim",
    "ModelFile",
    "ModelFootprint",
    "OptimizedModels",
    "OptionKind",
    "ProviderOption",
    "ProviderTraits",
    "Reshape",
    "ResolvedProviders",
    "SessionTuning",
    "Signature",
    "TensorSpec",
    "device_lane",
    "emulate_on_cpu",
    "footprint_and_value_dependence",
    "ort",
    "read_footprint",
    "read_model_file",
    "read_model_file_and_proof",
    "resolve_policy",
    "resolve_providers",
    "run_on_lanes",
]
