"""benchmarks/perf_analyzer.py: where Triton's perf_analyzer comes from, without installing it."""

from __future__ import annotations

import pytest

from tests.helpers import load_benchmark

tools = load_benchmark("perf_analyzer.py")


def test_the_standalone_wheel_only_where_glibc_loads_it():
    # PyPI's perf-analyzer ships manylinux_2_38 wheels only: on glibc 2.36 it does not load.
    assert tools.pins((2, 36)) == tools.TRITONCLIENT_PINS
    assert tools.pins(None) == tools.TRITONCLIENT_PINS  # musl, or no answer
    assert tools.pins((2, 38)) == ("perf-analyzer",)
    assert tools.pins((3, 0)) == ("perf-analyzer",)
    assert any(pin.startswith("tritonclient==2.41") for pin in tools.TRITONCLIENT_PINS)


def test_a_binary_given_by_the_environment_is_used_once_it_starts(tmp_path, monkeypatch):
    binary = tmp_path / "perf_analyzer"
    binary.write_text("#!/bin/sh\necho 'perf_analyzer 2.41'\n")
    binary.chmod(0o755)
    monkeypatch.setenv("CORRAL_PERF_ANALYZER", str(binary))
    found = tools.perf_analyzer(tmp_path / "cache")
    assert found.binary == binary
    assert found.source == "$CORRAL_PERF_ANALYZER"
    assert not (tmp_path / "cache").exists()  # no venv made for it


def test_a_binary_that_does_not_start_is_refused_naming_it_and_why(tmp_path, monkeypatch):
    binary = tmp_path / "perf_analyzer"
    binary.write_text(
        "#!/bin/sh\necho 'libb64.so.0d: cannot open shared object file' >&2\nexit 127\n"
    )
    binary.chmod(0o755)
    monkeypatch.setenv("CORRAL_PERF_ANALYZER", str(binary))
    with pytest.raises(tools.PerfAnalyzerUnavailable, match="libb64") as caught:
        tools.perf_analyzer(tmp_path / "cache")
    assert str(binary) in str(caught.value)
