"""`corral ray-serve`'s flags and CORRAL_* variables: one of each for every option.

Checked up to where Ray would start: ``serve_on_ray`` is replaced by a recorder, so no Ray
node starts. A field of RayServeConfig without a sample value here fails the test.
"""

from __future__ import annotations

import argparse
import dataclasses
import logging
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("ray.serve", reason="the ray extra is not installed")

import corral.ray
from corral.cli.commands import command_parser, main
from corral.cli.ray_serve import RAY_SERVE_OPTIONS
from corral.ray import RayServeConfig

# A value other than the default for every option, as text, and what it then holds.
SAMPLES: dict[str, tuple[str, Any]] = {
    "address": ("ray://head:10001", "ray://head:10001"),
    "host": ("0.0.0.0", "0.0.0.0"),
    "port": ("8123", 8123),
    "log_level": ("debug", "debug"),
    "replicas": ("3", 3),
    "max_replicas": ("6", 6),
    "queued_per_replica": ("8", 8.0),
    "replica_cpus": ("0.5", 0.5),
    "memory_budget": ("2Gi", 2 * 1024**3),
    "memory_watch_s": ("2.5", 2.5),
    "max_upload_bytes": ("3Gi", 3 * 1024**3),
    "cache_dir": ("/var/cache/corral", "/var/cache/corral"),
    "cache_bytes": ("10Gi", 10 * 1024**3),
    "optimized_models": ("/var/cache/corral-optimized", "/var/cache/corral-optimized"),
    "max_models_per_replica": ("-1", -1),
    "max_loaded_models": ("7", 7),
    "load_concurrency": ("3", 3),
    "load_timeout_s": ("45", 45.0),
    "batching": ("false", False),
    "measure_charges": ("true", True),
    "allow_python_uploads": ("true", True),
    "model_latency_histograms": ("0", 0),
    "inline_run_us": ("25", 25),
    "default_max_batch_size": ("8", 8),
    "compute_workers": ("2", 2),
    "max_queue_per_model": ("9", 9),
    "poll_interval_s": ("2.5", 2.5),
    "max_ongoing_requests": ("8", 8),
    "max_queued_requests": ("16", 16),
    "ingress_replicas": ("2", 2),
    "hot_model_in_flight": ("4", 4),
    "max_request_bytes": ("4096", 4096),
    "auth_token": ("s3cret", "s3cret"),
    "grpc_port": ("9001", 9001),
    "grpc_host": ("0.0.0.0", "0.0.0.0"),
    "drain_timeout_s": ("1.5", 1.5),
    "intra_op_threads": ("2", 2),
    "inter_op_threads": ("3", 3),
    "thread_pools": ("per_session", "per_session"),
}
CACHE_OPTIONS = ("cache_dir", "cache_bytes")
OPTION_NAMES = [option[0] for option in RAY_SERVE_OPTIONS]
CONFIG_NAMES = [field.name for field in dataclasses.fields(RayServeConfig)]


@pytest.fixture
def launched(monkeypatch: pytest.MonkeyPatch) -> list[dict[str, Any]]:
    """What `corral ray-serve` would start Ray with, recorded instead of started."""
    calls: list[dict[str, Any]] = []
    levels: list[str] = []

    def serve_on_ray(repository: str, config: RayServeConfig, **options: Any) -> int:
        calls.append(
            {"repository": repository, "config": config, "log_level": levels[-1].lower(), **options}
        )
        return 0

    def basic_config(*, level: str, **_: Any) -> None:
        levels.append(level)  # the command's logging setup, kept out of this process

    monkeypatch.setattr(corral.ray, "serve_on_ray", serve_on_ray)
    monkeypatch.setattr(logging, "basicConfig", basic_config)
    for name in OPTION_NAMES + CONFIG_NAMES:
        monkeypatch.delenv(f"CORRAL_{name.upper()}", raising=False)
    # The command sets these for a local Ray node; restore them after.
    monkeypatch.setenv("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")
    monkeypatch.setenv("RAY_USAGE_STATS_ENABLED", "0")
    return calls


def ray_serve_flags() -> dict[str, argparse.Action]:
    commands = next(
        action
        for action in command_parser("ray-serve")._actions
        if isinstance(action, argparse._SubParsersAction)
    )
    parser = commands.choices["ray-serve"]
    return {action.dest: action for action in parser._actions if action.dest != "help"}


def held(call: dict[str, Any], name: str) -> Any:
    return getattr(call["config"], name) if name in CONFIG_NAMES else call[name]


def test_every_option_is_a_flag_whose_help_names_its_variable():
    flags = ray_serve_flags()
    assert set(flags) == {"repository", *OPTION_NAMES, *CONFIG_NAMES}
    assert set(SAMPLES) == set(OPTION_NAMES) | set(CONFIG_NAMES)
    for name, action in flags.items():
        if name == "repository":
            continue
        assert f"CORRAL_{name.upper()}" in (action.help or ""), name
        assert action.option_strings == ["--" + name.replace("_", "-")]


@pytest.mark.timeout(30)
@pytest.mark.parametrize("name", sorted(SAMPLES))
def test_a_flag_and_its_variable_set_the_same_option(
    name: str, tmp_path: Path, launched: list[dict[str, Any]], monkeypatch: pytest.MonkeyPatch
):
    text, expected = SAMPLES[name]
    flag = "--" + name.replace("_", "-")
    # The cache's options are a store's only: its URL goes to Ray as it is.
    repository = "s3://models/prod" if name in CACHE_OPTIONS else str(tmp_path)
    assert main(["ray-serve", repository, f"{flag}={text}"]) == 0
    monkeypatch.setenv(f"CORRAL_{name.upper()}", text)
    assert main(["ray-serve", repository]) == 0
    by_flag, by_variable = launched
    assert held(by_flag, name) == held(by_variable, name) == expected
    assert by_flag["repository"] == by_variable["repository"] == repository


@pytest.mark.timeout(30)
def test_a_relative_cache_dir_reaches_the_replicas_absolute(
    tmp_path: Path, launched: list[dict[str, Any]], monkeypatch: pytest.MonkeyPatch
):
    monkeypatch.chdir(tmp_path)
    assert main(["ray-serve", "s3://models/prod", "--cache-dir", "cache"]) == 0
    assert launched[0]["config"].cache_dir == str(tmp_path / "cache")


@pytest.mark.timeout(30)
def test_a_flag_wins_over_its_variable(tmp_path: Path, launched: list[dict[str, Any]], monkeypatch):
    monkeypatch.setenv("CORRAL_REPLICAS", "5")
    assert main(["ray-serve", str(tmp_path), "--replicas", "3"]) == 0
    assert launched[0]["config"].replicas == 3


@pytest.mark.parametrize(
    ("variable", "text", "fragment"),
    [
        ("CORRAL_REPLICAS", "many", "CORRAL_REPLICAS='many': must be a whole number"),
        ("CORRAL_PORT", "http", "CORRAL_PORT='http': invalid literal"),
        ("CORRAL_MEMORY_BUDGET", "2G", "CORRAL_MEMORY_BUDGET='2G': size '2G' is ambiguous"),
    ],
)
def test_a_malformed_variable_is_refused_by_name(
    variable: str,
    text: str,
    fragment: str,
    tmp_path: Path,
    launched: list[dict[str, Any]],
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
):
    monkeypatch.setenv(variable, text)
    with pytest.raises(SystemExit) as exited:
        main(["ray-serve", str(tmp_path)])
    assert exited.value.code == 2
    assert fragment in capsys.readouterr().err
    assert not launched


@pytest.mark.timeout(30)
def test_an_out_of_range_variable_is_refused_by_its_config(
    tmp_path: Path,
    launched: list[dict[str, Any]],
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
):
    monkeypatch.setenv("CORRAL_THREAD_POOLS", "sometimes")
    assert main(["ray-serve", str(tmp_path)]) == 1
    assert "thread_pools must be one of 'global', 'per_session'" in capsys.readouterr().err
    assert not launched


@pytest.mark.timeout(30)
def test_a_variable_that_names_no_option_is_reported(
    tmp_path: Path,
    launched: list[dict[str, Any]],
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
):
    monkeypatch.setenv("CORRAL_REPLICA", "3")
    with caplog.at_level(logging.WARNING, logger="corral.cli"):
        assert main(["ray-serve", str(tmp_path)]) == 0
    assert "CORRAL_REPLICA names no option of corral ray-serve" in caplog.text
    assert "did you mean CORRAL_REPLICAS?" in caplog.text
