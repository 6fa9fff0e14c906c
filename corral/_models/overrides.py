"""Overrides: a model's configuration and files given with a load, instead of the repository's.

Triton's model repository extension lets a load request carry a ``config`` and the files of
a model folder. A :class:`ModelOverride` is what such a load puts in place of the model's own
settings and, with files, of its own folder; the :class:`~corral._models.repository.Repository`
reads a model's entry through it for as long as it stays in place (every later load, lazy or
explicit, and every poll), until a load without them puts the repository's files back. The
loads and unloads that put overrides in place and take them out, and the uploaded files'
folder, are the Host's (:mod:`corral._host.uploads`).
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["ModelOverride"]


@dataclass(frozen=True)
class ModelOverride:
    """What a load put in place of a model's own configuration and, with files, its folder."""

    #: The configuration, as config.pbtxt text (``corral._models.pbtxt.parse.pbtxt_from_json``'s):
    #: read instead of the folder's model.toml or config.pbtxt, through the same checks.
    config_text: str
    #: The uploaded model folder, read instead of the repository's; None: the repository's.
    folder: str | None
    #: Distinguishes overrides: part of the entry's fingerprint, so that a new one is a change.
    generation: int
