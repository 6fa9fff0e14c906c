"""An option of the Host or the Runtime, declared once: its dataclass field and its help.

:class:`corral.HostOptions`' and :class:`corral.RuntimeOptions`' fields are the options: the
field gives the name, the type and the default, :func:`option` adds the help. The edges are
made from them (:func:`declared` reads them): ``corral serve``'s settings and flags, the
``CORRAL_*`` variables, and ``corral.ray``'s config and ``corral ray-serve``'s flags, so that
adding an option is adding a field. Plain data: the core imports no settings library.
"""

from __future__ import annotations

import dataclasses
import typing
from collections.abc import Callable
from dataclasses import MISSING, dataclass
from typing import Any

__all__ = ["ENV_PREFIX", "Declared", "declared", "given_by", "option"]

#: What every option's environment variable starts with: ``CORRAL_<NAME>``.
ENV_PREFIX = "CORRAL_"

# The key of a declared field's metadata: its _Help.
_HELP = "corral.option"


@dataclass(frozen=True)
class _Help:
    text: str
    made_default: str | None
    not_offered: str | None


def option(
    default: Any = MISSING,
    help_text: str = "",
    *,
    default_factory: Callable[[], Any] | None = None,
    made_default: str = "",
    not_offered: str = "",
) -> Any:
    """A dataclass field that is an option: its default, and its help for the edges.

    ``default_factory`` makes the default when the options are built (the cores ...);
    ``made_default`` says what it makes, for the help. ``not_offered`` says why the edges
    (the command line, the variables, Ray's config) leave the option at its default.

    Example::

        batching: bool = option(True, "batch concurrent requests for a model where it allows")
    """
    metadata = {_HELP: _Help(help_text, made_default or None, not_offered or None)}
    if default_factory is not None:
        return dataclasses.field(default_factory=default_factory, metadata=metadata)
    return dataclasses.field(default=default, metadata=metadata)


@dataclass(frozen=True)
class Declared:
    """One option as the edges offer it: a field, a flag and a variable of the same name."""

    name: str
    #: The type a value is checked against: the field's, or None too when the default is
    #: made when the options are built (None then stands for that default).
    annotation: Any
    #: The default the edges hold: the field's, or None when it is made when built.
    default: object
    help: str
    #: What a default made when the options are built is ("the cores"); None: ``default``.
    made_default: str | None
    #: Why the edges leave the option at its default; None: they offer it.
    not_offered: str | None

    @property
    def variable(self) -> str:
        """The environment variable that sets it at the edges: ``CORRAL_<NAME>``."""
        return ENV_PREFIX + self.name.upper()

    def described(self, made_default: str | None = None) -> str:
        """The help, with what a default made when built is (``made_default`` instead)."""
        made = made_default or self.made_default
        return self.help if made is None else f"{self.help} (default: {made})"


def declared(options: type) -> tuple[Declared, ...]:
    """The options declared by the fields of the dataclass ``options``, in field order."""
    hints = typing.get_type_hints(options)
    found = []
    for field in dataclasses.fields(options):
        if _HELP not in field.metadata:
            continue
        info: _Help = field.metadata[_HELP]
        made = field.default is MISSING
        found.append(
            Declared(
                name=field.name,
                annotation=hints[field.name] | None if made else hints[field.name],
                default=None if made else field.default,
                help=info.text,
                made_default=info.made_default,
                not_offered=info.not_offered,
            )
        )
    return tuple(found)


def given_by(options: type, source: object) -> dict[str, Any]:
    """The values of ``options``' fields that ``source`` carries as attributes of their names.

    For the edges' objects (the server's settings, Ray's config), which carry the options
    among their own: an attribute that is None leaves an option whose default is not None
    (a default made when built, ``batching`` ...) at that default.
    """
    given: dict[str, Any] = {}
    for field in dataclasses.fields(options):
        if not field.init or not hasattr(source, field.name):
            continue
        value = getattr(source, field.name)
        if value is not None or field.default is None:
            given[field.name] = value
    return given
