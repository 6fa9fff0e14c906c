"""constraints/minimum.txt (``make test-min``) pins exactly the floors pyproject.toml declares."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def _floors() -> dict[str, str]:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    extras = project["optional-dependencies"]
    floors = {}
    for requirement in [*project["dependencies"], *extras["server"], *extras["grpc"]]:
        # A floor, and maybe a ceiling below the next untested release (uvicorn's).
        found = re.fullmatch(
            r"([A-Za-z0-9_.-]+)(?:\[[^\]]*\])?>=([0-9.]+)(?:,<[0-9.]+)?", requirement
        )
        assert found, f"{requirement!r} has no plain >= floor"
        floors[found[1].lower()] = found[2]
    return floors


def _pins() -> dict[str, str]:
    pins = {}
    for line in (ROOT / "constraints" / "minimum.txt").read_text().splitlines():
        line = line.split("#")[0].strip()
        if line:
            name, version = line.split("==")
            pins[name.lower()] = version
    return pins


def test_every_floor_is_pinned_in_the_minimum_constraints():
    pins = _pins()
    for name, floor in _floors().items():
        assert name in pins, f"{name} >= {floor} is not pinned in constraints/minimum.txt"
        # numpy's floor is a series (1.26), pinned to its first release (1.26.0).
        assert pins[name] in (floor, f"{floor}.0"), (name, floor, pins[name])
