"""The provider options of a model's settings, checked against what each one names.

A model's settings give execution-provider options three ways, and all three meet here, as a
:class:`~corral._models.config.ModelConfig`'s ``providers``, before any session is built:

- a model.toml's ``providers`` tables (``{ name = "TensorrtExecutionProvider", ... }``);
- a config.pbtxt's ``optimization { execution_accelerators { gpu_execution_accelerator {
  name: "tensorrt" parameters {...} } } }`` (and ``cuda``, ``openvino``), mapped onto
  onnxruntime's names by :mod:`corral._models.pbtxt.parse`;
- a load's ``config`` (the model control API), which becomes config.pbtxt text and goes
  the same way (:class:`~corral._models.overrides.ModelOverride`).

Every option must be in :data:`corral._onnx.provider_options.PROVIDER_OPTIONS` for its provider,
or it is refused by name: an allow-list, because an option corral does not know may name a
file (onnxruntime adds options with its releases). What an option names then decides:

- from a load's config (:func:`refuse_provider_paths`), only options that name nothing on
  disk pass. A library, a file or folder, a file name, or a switch that makes the provider
  read or write files is refused, as ``model_operations.op_library_filename`` is: the config
  comes from whoever can reach the model control API, and a path in it would have the server
  load that code or write where it says;
- from a model.toml or config.pbtxt in the repository (:func:`locate_provider_paths`), a path
  is taken relative to the model's folder and must stay inside it, symlinks followed, as a
  custom op library must; a library must be a regular file there (its stamp joins the
  entry's, so that a new library is a change); a file name must be a plain name. The paths
  are handed to onnxruntime as real absolute paths, since onnxruntime reads a relative one
  from the server's working folder.

Each check runs when the settings are read, so a refusal names the option and the provider on
any build, whether or not this onnxruntime has the provider.
"""

from __future__ import annotations

import dataclasses
import os

from corral._base import ModelConfigError
from corral._models.config import ModelConfig, ProviderEntry
from corral._models.confined import locate_inside, locate_library
from corral._onnx import PROVIDER_OPTIONS, OptionKind, ProviderOption

__all__ = ["locate_provider_paths", "refuse_provider_paths"]


def refuse_provider_paths(source: str, config: ModelConfig) -> None:
    """A load's config may give provider options that name nothing on disk, and no others.

    Raises :class:`ModelConfigError` naming ``source``, the option and its provider for an
    option corral does not know, or one that names a library, a file or a folder.
    """
    for provider, option, _ in _options(config):
        kind = _known(source, provider, option).kind
        if kind is not OptionKind.VALUE:
            raise ModelConfigError(
                f"{source}: option {option!r} of {provider} names {kind.described}: a load's "
                "config may give a provider only options that name nothing on disk; a file or "
                "library a provider opens is named only from a config.pbtxt or model.toml in "
                "the repository (inside the model's folder), never from a load's config or files"
            )


def locate_provider_paths(
    source: str, real_folder: str, config: ModelConfig, stamps: list[tuple[object, ...]]
) -> ModelConfig:
    """``config`` with each provider option that names a path made a real path inside the folder.

    For a model.toml or config.pbtxt of the repository: raises :class:`ModelConfigError`
    naming ``source``, the option and its provider for an option corral does not know, a path
    that resolves outside ``real_folder`` (the model's), a library that is not a regular file
    there, or a file name that is not a plain name. A library's stamp is added to ``stamps``.
    """
    if not config.providers:
        return config
    located: list[ProviderEntry] = []
    for entry in config.providers:
        if isinstance(entry, str):
            located.append(entry)
            continue
        provider, options = entry
        pairs = tuple(
            (option, _located(source, real_folder, provider, option, value, stamps))
            for option, value in options
        )
        located.append((provider, pairs))
    return dataclasses.replace(config, providers=tuple(located))


def _options(config: ModelConfig) -> list[tuple[str, str, str]]:
    """Each ``(provider, option, value)`` of ``config``'s providers."""
    return [
        (entry[0], option, value)
        for entry in config.providers or ()
        if not isinstance(entry, str)
        for option, value in entry[1]
    ]


def _known(source: str, provider: str, option: str) -> ProviderOption:
    """The table's row of ``option``; refused by name when corral does not know it."""
    options = PROVIDER_OPTIONS.get(provider)
    if options is None:
        raise ModelConfigError(
            f"{source}: option {option!r} of {provider}: corral knows no options of this "
            "provider, and a model's settings may give a provider only options corral knows "
            "(one it does not know could name a file); name the provider without options"
        )
    row = options.get(option)
    if row is None:
        known = ", ".join(sorted(options)) or "none"
        raise ModelConfigError(
            f"{source}: option {option!r} of {provider} is not one corral knows, and a model's "
            f"settings may give a provider only options corral knows (one it does not know "
            f"could name a file); it knows: {known}"
        )
    return row


def _located(
    source: str,
    real_folder: str,
    provider: str,
    option: str,
    value: str,
    stamps: list[tuple[object, ...]],
) -> str:
    """``value`` as onnxruntime is given it: a path made real inside the model's folder."""
    row = _known(source, provider, option)
    if row.kind in (OptionKind.VALUE, OptionKind.FILES):
        return value
    shown = f"{source}: option {option!r} of {provider}"
    if row.kind is OptionKind.NAME:
        if not value or value in (".", "..") or os.sep in value or "/" in value:
            raise ModelConfigError(
                f"{shown} must be a plain file name (no folder, not '.' or '..'), got {value!r}"
            )
        return value
    paths = value.split(row.separator) if row.separator else [value]
    if not all(paths):
        raise ModelConfigError(f"{shown} must name a path inside the model's folder, got {value!r}")
    if row.kind is OptionKind.LIBRARY:
        real = [
            locate_library(source, real_folder, path, stamps, shown=f"{shown} ({path!r})")
            for path in paths
        ]
    else:
        real = [locate_inside(f"{shown} ({path!r})", real_folder, path) for path in paths]
    return row.separator.join(real) if row.separator else real[0]
