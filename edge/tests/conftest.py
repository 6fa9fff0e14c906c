"""Shared setup of the native edge's Python tests (run with corral's venv).

The corral they compare against is this checkout's (the folder above ``edge/``), put first on
``sys.path``: the venv's editable corral may be another branch's, mid-change.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

_CHECKOUT = str(Path(__file__).resolve().parents[2])
if _CHECKOUT not in sys.path:
    sys.path.insert(0, _CHECKOUT)
for _name in [name for name in sys.modules if name == "corral" or name.startswith("corral.")]:
    del sys.modules[_name]

corral_edge = pytest.importorskip("corral_edge")
