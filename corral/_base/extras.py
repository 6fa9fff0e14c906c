"""The ``pip install`` that brings an extra's packages, as a hint that works where corral is.

corral is installed from a clone (a wheel built there, or ``pip install '.[server]'``), not
from the package index: asking pip for corral with an extra finds no such project. The
packages an extra needs are on the index, so the hint names them, with the bounds corral's
own metadata gives them (``pip install 'obstore>=0.12'``): that works for any installed
corral, in a venv or an image. Without metadata (corral imported from a source tree), the
hint is the clone's own install.
"""

from __future__ import annotations

import importlib.metadata
import re
import shlex

__all__ = ["install_hint"]

# One requirement of an extra, as the metadata writes it: "obstore>=0.12; extra == 's3'".
_OF_EXTRA = re.compile(
    r"""^(?P<requirement>[^;]+?)\s*;\s*extra\s*==\s*["'](?P<extra>[^"']+)["']$"""
)


def install_hint(*extras: str) -> str:
    """The command that installs the packages of ``extras`` beside this corral.

    Example::

        >>> install_hint("s3")
        "pip install 'obstore>=0.12'"
    """
    try:
        requires = importlib.metadata.distribution("corral").requires or []
    except importlib.metadata.PackageNotFoundError:
        requires = []
    wanted: list[str] = []
    for line in requires:
        found = _OF_EXTRA.match(line.strip())
        if found is not None and found["extra"] in extras and found["requirement"] not in wanted:
            wanted.append(found["requirement"])
    if not wanted:
        return f"pip install '.[{','.join(extras)}]' in corral's clone"
    return "pip install " + " ".join(shlex.quote(requirement) for requirement in wanted)
