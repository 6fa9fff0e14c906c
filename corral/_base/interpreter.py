"""Which Python runs corral, and whether its GIL is enabled.

corral's thread-safety contract (``docs/thread-safety.md``) is tested on CPython with the GIL.
A free-threaded build (3.13t, 3.14t) runs without it unless an extension module that does not
declare itself safe re-enables it at import, silently but for one warning. So ``corral
--version`` and the server's start-up line say which case runs: an operator who asked for a
free-threaded build reads there whether it really runs free-threaded. ``docs/thread-safety.md``
("Free-threaded Python") says what corral needs before it claims that case.
"""

from __future__ import annotations

import platform
import sys
import sysconfig

__all__ = ["describe_interpreter", "free_threaded_build", "gil_enabled"]


def free_threaded_build() -> bool:
    """Whether this interpreter was built free-threaded (``--disable-gil``, ``python3.13t``)."""
    return bool(sysconfig.get_config_var("Py_GIL_DISABLED"))


def gil_enabled() -> bool:
    """Whether the GIL is enabled now: ``sys._is_gil_enabled()`` where it exists (3.13+).

    Before 3.13 every CPython has the GIL. On a free-threaded build the answer can change once,
    from False to True, when an extension that is not marked safe is imported.
    """
    is_gil_enabled = getattr(sys, "_is_gil_enabled", None)
    if is_gil_enabled is None:
        return True
    return bool(is_gil_enabled())


def describe_interpreter() -> str:
    """The interpreter in a few words, as ``corral --version`` and ``corral serve`` print it.

    Example::

        CPython 3.12.1, GIL enabled
        CPython 3.13.1, free-threaded build, GIL disabled
    """
    build = ", free-threaded build" if free_threaded_build() else ""
    gil = "GIL enabled" if gil_enabled() else "GIL disabled"
    return f"{platform.python_implementation()} {platform.python_version()}{build}, {gil}"
