"""Problem: one thing wrong in a model repository, found without loading a model.

The repository records the problems it meets while reading an entry (``ModelEntry.problems``)
and :mod:`corral._host.check` adds what a listing, the providers and the memory budget show. Each
carries a :class:`ProblemKind` from a small closed set, so that a metric can count them by
kind and an alert can name one, plus the file, what is wrong and how to fix it.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

__all__ = ["Problem", "ProblemKind"]


class ProblemKind(enum.Enum):
    """What sort of problem a :class:`Problem` is (the ``kind`` label of its metric)."""

    #: The repository holds no model at all.
    EMPTY_REPOSITORY = "empty_repository"
    #: A folder or ``.onnx`` file whose name cannot name a model: it is not served.
    INVALID_NAME = "invalid_name"
    #: A model that cannot be read as laid out: both ``name/`` and ``name.onnx``, both
    #: model.toml and config.pbtxt, a path leading outside the root, a file that cannot be
    #: stat'ed or listed.
    BAD_LAYOUT = "bad_layout"
    #: A model folder without any version folder holding its model file.
    NO_VERSION = "no_version"
    #: A version folder without the model file (``model.onnx``, or the config's
    #: ``default_model_filename``): that version is not served.
    NO_MODEL_FILE = "no_model_file"
    #: A model file whose protobuf cannot be read, or whose external data is missing.
    BAD_MODEL_FILE = "bad_model_file"
    #: A model.toml that cannot be parsed or breaks a rule.
    BAD_MODEL_TOML = "bad_model_toml"
    #: A config.pbtxt (or a load's config) that cannot be parsed or asks for what corral
    #: cannot honour.
    BAD_CONFIG_PBTXT = "bad_config_pbtxt"
    #: An execution provider the settings ask for that this onnxruntime build lacks.
    MISSING_PROVIDER = "missing_provider"
    #: A custom operator library (model.toml's ``custom_op_libraries``, config.pbtxt's
    #: ``model_operations``) that onnxruntime cannot load, or onnxruntime-extensions' when
    #: the package is missing (only when the scan reads model files).
    BAD_CUSTOM_OP_LIBRARY = "bad_custom_op_library"
    #: A version whose estimated size is larger than the whole memory budget.
    TOO_LARGE = "too_large"
    #: A model that failed to load (only ``corral check --load`` loads models).
    LOAD_FAILED = "load_failed"


@dataclass(frozen=True)
class Problem:
    """One problem in a repository: what is wrong, where, and the fix.

    Two problems are equal when all their fields are: that is how a problem seen at one poll
    is recognised at the next and not logged again.
    """

    kind: ProblemKind
    #: The model it belongs to, or None (an invalid name, an empty repository).
    model: str | None
    #: The file or folder at fault.
    path: str
    #: What is wrong, in one sentence (often the error a load would raise).
    message: str
    #: What to do about it.
    fix: str

    def __str__(self) -> str:
        return f"{self.kind.value}: {self.message} (fix: {self.fix})"
