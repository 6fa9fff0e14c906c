"""`corral --version` and `corral serve`'s start-up line say which Python runs, and its GIL."""

from __future__ import annotations

import sys
import sysconfig

import pytest

from corral._base import interpreter as _interpreter
from corral._base.interpreter import describe_interpreter, free_threaded_build, gil_enabled
from corral.cli import main


def _build(monkeypatch: pytest.MonkeyPatch, *, free_threaded: bool) -> None:
    real = sysconfig.get_config_var

    def config_var(name: str) -> object:
        return int(free_threaded) if name == "Py_GIL_DISABLED" else real(name)

    monkeypatch.setattr(sysconfig, "get_config_var", config_var)


def test_this_interpreter_is_described_as_it_runs() -> None:
    expected = sys._is_gil_enabled() if hasattr(sys, "_is_gil_enabled") else True
    assert gil_enabled() is expected
    assert free_threaded_build() is bool(sysconfig.get_config_var("Py_GIL_DISABLED"))
    version = ".".join(map(str, sys.version_info[:3]))
    assert describe_interpreter().startswith(f"CPython {version}")
    assert describe_interpreter().endswith("GIL enabled" if expected else "GIL disabled")


def test_a_python_without_is_gil_enabled_has_the_gil(monkeypatch: pytest.MonkeyPatch) -> None:
    # 3.11 and 3.12 have no sys._is_gil_enabled: every such CPython runs with the GIL.
    monkeypatch.delattr(sys, "_is_gil_enabled", raising=False)
    _build(monkeypatch, free_threaded=False)
    assert gil_enabled() is True
    assert describe_interpreter().endswith(", GIL enabled")
    assert "free-threaded" not in describe_interpreter()


@pytest.mark.parametrize(
    ("enabled", "ending"),
    [
        (False, ", free-threaded build, GIL disabled"),
        # An extension not marked safe for free threading re-enabled it at import.
        (True, ", free-threaded build, GIL enabled"),
    ],
)
def test_a_free_threaded_build_says_whether_its_gil_is_on(
    monkeypatch: pytest.MonkeyPatch, enabled: bool, ending: str
) -> None:
    monkeypatch.setattr(_interpreter.sys, "_is_gil_enabled", lambda: enabled, raising=False)
    _build(monkeypatch, free_threaded=True)
    assert describe_interpreter().endswith(ending)


def test_version_says_whether_the_gil_is_enabled(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(_interpreter.sys, "_is_gil_enabled", lambda: False, raising=False)
    _build(monkeypatch, free_threaded=True)
    with pytest.raises(SystemExit):
        main(["--version"])
    assert capsys.readouterr().out.endswith(", free-threaded build, GIL disabled)\n")
