"""Where models live and how they are configured, on :mod:`corral._base` and :mod:`corral._onnx`.

The repository (a local folder or object storage with a bounded cache), model entries,
model.toml, load overrides and uploads, and Triton's config.pbtxt (:mod:`corral._models.pbtxt`).

This is the folder's face: the layers above import these names from here, never a module
inside it (tests/test_layers.py).
"""

from corral._models.backend_parameters import (
    BACKEND_PARAMETERS,
    BackendSetting,
    BackendSettings,
    backend_setting,
    backend_settings,
)
from corral._models.config import ModelConfig, TensorConfig, VersionPolicy, WarmupSample
from corral._models.model_entry import ModelEntry, ModelVersion
from corral._models.overrides import ModelOverride
from corral._models.pbtxt.declared import (
    check_declared,
    declaration_mismatches,
    declared_signature,
    triton_type,
)
from corral._models.pbtxt.parse import (
    CONFIG_PBTXT,
    ISOLATION_PARAMETER,
    pbtxt_from_json,
    python_isolation,
)
from corral._models.pbtxt.warmup import MAX_WARMUP_BYTES, warmup_bytes, warmup_feed
from corral._models.repository import Repository, natural_key, validate_model_name
from corral._models.store import is_store_url

__all__ = [
    "BACKEND_PARAMETERS",
    "CONFIG_PBTXT",
    "ISOLATION_PARAMETER",
    "MAX_WARMUP_BYTES",
    "BackendSetting",
    "BackendSettings",
    "ModelConfig",
    "ModelEntry",
    "ModelOverride",
    "ModelVersion",
    "Repository",
    "TensorConfig",
    "VersionPolicy",
    "WarmupSample",
    "backend_setting",
    "backend_settings",
    "check_declared",
    "declaration_mismatches",
    "declared_signature",
    "is_store_url",
    "natural_key",
    "pbtxt_from_json",
    "python_isolation",
    "triton_type",
    "validate_model_name",
    "warmup_bytes",
    "warmup_feed",
]
