"""``corral``'s command line: ``serve``, ``ray-serve``, ``check``, ``status``, ``models``, ``demo``.

:func:`main` is the console script (``corral = "corral.cli:main"``); each command lives in a
module of its own here, and rich, which draws them, is imported only in this folder.
"""

from corral.cli.commands import main

__all__ = ["main"]
