"""`corral serve`'s flags and CORRAL_* variables are generated from one settings class.

Every flag is a ServerSettings field, its help names its variable, and the flag and the
variable set the same thing: tested for every field, so that a new field without a sample
value here fails.
"""

from __future__ import annotations

import argparse
import dataclasses
import logging
from pathlib import Path
from typing import Any

import pytest
from pydantic import SecretStr

import corral
import corral.server.app
import corral.server.processes
from corral import HostOptions
from corral.cli.commands import command_parser, main
from corral.cli.serve import TRITON_SPELLINGS, TRITON_TLS_OPTIONS
from corral.cli.triton_flags import TRITON_FLAGS
from corral.server.settings import HOST_OPTIONS_NOT_SERVED, SERVER_DEFAULTS, ServerSettings

# A value other than the default for every field, as the command line and the environment
# spell it, and what the setting then holds.
SAMPLES: dict[str, tuple[str, Any]] = {
    "host": ("0.0.0.0", "0.0.0.0"),
    "http_port": ("8123", 8123),
    "grpc_port": ("-1", -1),
    "edge": ("python", "python"),
    "edge_threads": ("2", 2),
    "memory_budget": ("2GiB", "2GiB"),
    "memory_watch_s": ("2.5", 2.5),
    "max_upload_bytes": ("2GiB", "2GiB"),
    "cache_dir": ("/var/cache/corral", "/var/cache/corral"),
    "optimized_models": ("/var/cache/corral-optimized", "/var/cache/corral-optimized"),
    "cache_bytes": ("10GiB", "10GiB"),
    "max_loaded_models": ("7", 7),
    "load_concurrency": ("3", 3),
    "load_timeout_s": ("45", 45.0),
    "poll_interval_s": ("2.5", 2.5),
    "max_queue_per_model": ("9", 9),
    "compute_workers": ("2", 2),
    "intra_op_threads": ("2", 2),
    "inter_op_threads": ("3", 3),
    "thread_pools": ("per_session", "per_session"),
    "max_request_bytes": ("4096", 4096),
    "max_body_bytes_in_flight": ("536870912", 536870912),
    "auth_token": ("s3cret", "s3cret"),
    "inference_tokens": ("a,b", "a,b"),
    "metadata_tokens": ("open", "open"),
    "model_control_tokens": ("admin", "admin"),
    "shared_memory_tokens": ("admin,other", "admin,other"),
    "statistics_tokens": ("stats", "stats"),
    "drain_timeout_s": ("1.5", 1.5),
    "drain_notice_s": ("5", 5.0),
    "log_level": ("DEBUG", "debug"),
    "grpc_log_level": ("info", "info"),
    "log_format": ("json", "json"),
    "log_file": ("/var/log/corral.log", "/var/log/corral.log"),
    "max_url_bytes": ("4096", 4096),
    "max_header_bytes": ("16384", 16384),
    "header_timeout_s": ("2.5", 2.5),
    "idle_timeout_s": ("7.5", 7.5),
    "body_timeout_s": ("12.5", 12.5),
    "body_min_rate_bytes_s": ("512", 512),
    "max_connections": ("100", 100),
    "grpc_max_connections": ("50", 50),
    "grpc_idle_timeout_s": ("30.5", 30.5),
    "grpc_handshake_timeout_s": ("2.5", 2.5),
    "grpc_keepalive_time_s": ("90", 90.0),
    "grpc_keepalive_timeout_s": ("5", 5.0),
    "grpc_min_ping_interval_s": ("1.5", 1.5),
    "grpc_max_concurrent_streams": ("8", 8),
    "grpc_max_health_watches": ("9", 9),
    "ready_load_timeout_s": ("2.5", 2.5),
    "server_name": ("triton", "triton"),
    "model_control_mode": ("explicit", "explicit"),
    "load_model": ("mlp", ("mlp",)),
    "allowed_hosts": ("models.example", ("models.example",)),
    "max_shared_memory_regions": ("16", 16),
    "trace_exporter": ("console", "console"),
    "metrics_port": ("8002", 8002),
    "processes": ("3", 3),
    "model_latency_histograms": ("0", 0),
    "inline_run_us": ("25", 25),
    "default_max_batch_size": ("8", 8),
    "cache_config": ("local,size=64MiB", f"local,size={64 * 2**20}"),
    "response_cache_byte_size": ("1048576", 1048576),
}
# Switches: a flag and its --no- form; the sample is the one that is not the default.
SWITCHES = {
    "access_log",
    "batching",
    "strict",
    "system_shared_memory",
    "exit_on_error",
    "strict_readiness",
    "measure_charges",
    "allow_python_uploads",
}
# Files read at start, each valid only with the others: tests/server/test_tls.py gives them.
TLS_FIELDS = {"tls_cert_file", "tls_key_file", "tls_client_ca_file"}


def serve_flags() -> dict[str, argparse.Action]:
    commands = next(
        action
        for action in command_parser("serve")._actions
        if isinstance(action, argparse._SubParsersAction)
    )
    serve = commands.choices["serve"]
    return {action.dest: action for action in serve._actions if action.dest != "help"}


def value(settings: ServerSettings, name: str) -> Any:
    held = getattr(settings, name)
    return held.get_secret_value() if isinstance(held, SecretStr) else held


def test_every_field_is_a_flag_whose_help_names_its_variable():
    flags = serve_flags()
    triton = set(TRITON_SPELLINGS) | set(TRITON_TLS_OPTIONS) | TRITON_FLAGS
    assert set(flags) == set(ServerSettings.model_fields) | triton
    for name, action in flags.items():
        if name in triton:
            continue
        variable = f"CORRAL_{name.upper()}"
        assert variable in (action.help or ""), name
        if name != "repository":
            assert action.option_strings[0] == "--" + name.replace("_", "-")


@pytest.mark.parametrize(
    "name", sorted(set(ServerSettings.model_fields) - {"repository"} - TLS_FIELDS)
)
def test_a_flag_and_its_variable_set_the_same_setting(
    name: str, tmp_path: Path, served: list[ServerSettings], monkeypatch: pytest.MonkeyPatch
):
    flag = "--" + name.replace("_", "-")
    if name in SWITCHES:
        expected: Any = not ServerSettings.model_fields[name].default
        switch = flag if expected else "--no-" + flag.removeprefix("--")
        assert main(["serve", str(tmp_path), switch]) == 0
        monkeypatch.setenv(f"CORRAL_{name.upper()}", str(expected).lower())
    else:
        text, expected = SAMPLES[name]
        assert main(["serve", str(tmp_path), f"{flag}={text}"]) == 0
        monkeypatch.setenv(f"CORRAL_{name.upper()}", text)
    assert main(["serve", str(tmp_path)]) == 0
    by_flag, by_variable = served
    assert value(by_flag, name) == value(by_variable, name) == expected
    assert value(by_flag, name) != ServerSettings.model_fields[name].default


def test_the_repository_comes_from_its_variable_too(
    tmp_path: Path, served: list[ServerSettings], monkeypatch: pytest.MonkeyPatch
):
    monkeypatch.setenv("CORRAL_REPOSITORY", str(tmp_path))
    assert main(["serve"]) == 0
    assert served[0].repository == tmp_path


def test_samples_cover_every_field():
    covered = set(SAMPLES) | {"repository"} | SWITCHES | TLS_FIELDS
    assert covered == set(ServerSettings.model_fields)


def test_a_bad_value_names_its_flag_and_variable(
    tmp_path: Path, served: list[ServerSettings], capsys: pytest.CaptureFixture[str]
):
    assert main(["serve", str(tmp_path), "--max-loaded-models", "0"]) == 2
    err = capsys.readouterr().err
    assert "--max-loaded-models (CORRAL_MAX_LOADED_MODELS)" in err
    assert "max_loaded_models must be a positive integer, got 0" in err
    assert main(["serve", str(tmp_path), "--memory-budget", "lots"]) == 2
    assert "--memory-budget (CORRAL_MEMORY_BUDGET): memory_budget 'lots' is not a size" in (
        capsys.readouterr().err
    )
    assert main(["serve", str(tmp_path), "--http-port", "70000"]) == 2
    assert "--http-port (CORRAL_HTTP_PORT)" in capsys.readouterr().err
    assert served == []


@pytest.mark.parametrize(
    ("flags", "size"),
    [
        ([], 0),
        (["--cache-config", "local,size=1048576"], 1048576),
        (["--cache-config=local,size=2MiB"], 2 * 2**20),
        (["--response-cache-byte-size", "4096"], 4096),
        (["--response-cache-byte-size", "0"], 0),
    ],
)
def test_tritons_cache_flags_give_the_response_cache_its_size(
    flags: list[str], size: int, tmp_path: Path, served: list[ServerSettings]
):
    assert main(["serve", str(tmp_path), *flags]) == 0
    assert served[0].response_cache_bytes() == size


@pytest.mark.parametrize(
    ("flags", "said"),
    [
        (["--cache-config", "redis,host=localhost"], "only response cache is local"),
        (["--cache-config", "local,bytes=10"], "must be local,size=<bytes>"),
        (["--cache-config", "local,size=0"], "cache_config must be positive"),
        (["--cache-config", "local,size=lots"], "'lots' is not a size"),
        (
            ["--cache-config", "local,size=10", "--response-cache-byte-size", "10"],
            "both given: give one",
        ),
    ],
)
def test_a_cache_flag_refused_says_why(
    flags: list[str],
    said: str,
    tmp_path: Path,
    served: list[ServerSettings],
    capsys: pytest.CaptureFixture[str],
):
    assert main(["serve", str(tmp_path), *flags]) == 2
    assert said in capsys.readouterr().err
    assert served == []


@pytest.mark.parametrize(
    ("name", "text", "expected"),
    [
        ("max_request_bytes", "64MiB", 64 * 2**20),
        ("max_request_bytes", "2g", 2 * 2**30),
        ("max_body_bytes_in_flight", "1Gi", 2**30),
        ("max_url_bytes", "8KB", 8000),
        ("max_header_bytes", "64k", 64 * 2**10),
        ("memory_budget", "2Gi", "2Gi"),
    ],
)
def test_size_settings_take_sizes_by_flag_and_variable(
    name: str,
    text: str,
    expected: Any,
    tmp_path: Path,
    served: list[ServerSettings],
    monkeypatch: pytest.MonkeyPatch,
):
    flag = "--" + name.replace("_", "-")
    assert main(["serve", str(tmp_path), flag, text]) == 0
    monkeypatch.setenv(f"CORRAL_{name.upper()}", text)
    assert main(["serve", str(tmp_path)]) == 0

    by_flag, by_variable = served
    assert getattr(by_flag, name) == getattr(by_variable, name) == expected
    assert ServerSettings(repository=tmp_path, **{name: 2**30}).model_dump()[name] == 2**30


@pytest.mark.parametrize(
    "name", ["memory_budget", "max_request_bytes", "max_url_bytes", "max_header_bytes"]
)
@pytest.mark.parametrize(("text", "problem"), [("2G", "is ambiguous"), ("2 GiBs", "is not a size")])
def test_a_size_refused_names_its_flag_and_variable(
    name: str,
    text: str,
    problem: str,
    tmp_path: Path,
    served: list[ServerSettings],
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
):
    flag, variable = "--" + name.replace("_", "-"), f"CORRAL_{name.upper()}"
    named = f"{flag} ({variable}): {name} {text!r} {problem}"

    assert main(["serve", str(tmp_path), flag, text]) == 2
    assert named in capsys.readouterr().err
    monkeypatch.setenv(variable, text)
    assert main(["serve", str(tmp_path)]) == 2
    assert named in capsys.readouterr().err
    assert served == []


def test_a_size_setting_refuses_a_bool(tmp_path: Path):
    # pydantic would read True as 1 byte.
    with pytest.raises(ValueError, match="max_request_bytes must be bytes"):
        ServerSettings(repository=tmp_path, max_request_bytes=True)


def test_an_unknown_corral_variable_is_reported_at_start(
    tmp_path: Path,
    served: list[ServerSettings],
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
):
    monkeypatch.setenv("CORRAL_HTTP_PORTT", "9000")
    monkeypatch.setenv("CORRAL_DRAIN_TIMEOUT", "5")  # the name before it said its unit
    with caplog.at_level(logging.WARNING):
        assert main(["serve", str(tmp_path)]) == 0
    reported = [r.getMessage() for r in caplog.records if "names no setting" in r.getMessage()]
    assert any(
        "CORRAL_HTTP_PORTT names no setting" in line and "did you mean CORRAL_HTTP_PORT?" in line
        for line in reported
    ), reported
    assert any("did you mean CORRAL_DRAIN_TIMEOUT_S?" in line for line in reported), reported
    assert served[0].http_port == 8000  # not used


def test_the_settings_carry_every_host_option_with_its_default():
    host_fields = {f.name: f for f in dataclasses.fields(HostOptions) if f.init}
    served_fields = set(host_fields) - set(HOST_OPTIONS_NOT_SERVED)
    assert served_fields <= set(ServerSettings.model_fields)
    defaults = ServerSettings(repository=Path(".")).host_options()
    # The library's defaults, but for the server's own: a budget that follows the machine.
    assert defaults == HostOptions(**SERVER_DEFAULTS)
    assert defaults.budget_source is not None
    for name in served_fields:
        field = host_fields[name]
        if field.default is not dataclasses.MISSING:
            default = SERVER_DEFAULTS.get(name, field.default)
            assert ServerSettings.model_fields[name].default == default, name


def test_host_options_are_one_object_for_the_library_too(tmp_path: Path):
    options = HostOptions(memory_budget="1MiB", max_queue_per_model=3)
    with corral.Host(tmp_path, options=options, batching=False) as host:
        assert host.options.budget_bytes == 2**20
        assert (host.options.max_queue_per_model, host.options.batching) == (3, False)
    with pytest.raises(corral.InvalidOption, match="load_concurrency"):
        corral.Host(tmp_path, load_concurrency=0)


@pytest.mark.parametrize(
    ("triton", "corral_flag", "name", "text", "expected"),
    [
        ("--repository-poll-secs", "--poll-interval-s", "poll_interval_s", "4", 4.0),
        ("--exit-timeout-secs", "--drain-timeout-s", "drain_timeout_s", "2", 2.0),
    ],
)
def test_tritons_spellings_set_corrals_settings(
    tmp_path: Path,
    served: list[ServerSettings],
    capsys: pytest.CaptureFixture[str],
    triton: str,
    corral_flag: str,
    name: str,
    text: str,
    expected: float,
):
    assert main(["serve", str(tmp_path), triton, text]) == 0
    assert main(["serve", str(tmp_path), triton, text, corral_flag, text]) == 0  # agreeing
    assert [getattr(settings, name) for settings in served] == [expected, expected]
    assert main(["serve", str(tmp_path), triton, text, corral_flag, "9"]) == 2
    err = capsys.readouterr().err
    assert f"{triton} {text} and {corral_flag} 9 name the same setting" in err
    assert len(served) == 2


def test_spellings_that_are_not_numbers_are_compared_as_given(
    tmp_path: Path, served: list[ServerSettings], capsys: pytest.CaptureFixture[str]
):
    # Compared as text, not as numbers: the differing words are named, not a float error.
    given = ["serve", str(tmp_path), "--exit-timeout-secs", "soon", "--drain-timeout-s", "later"]
    assert main(given) == 2
    err = capsys.readouterr().err
    assert "--exit-timeout-secs soon and --drain-timeout-s later name the same setting" in err
    # The same word twice agrees; the setting then refuses it by name.
    given = ["serve", str(tmp_path), "--exit-timeout-secs", "soon", "--drain-timeout-s", "soon"]
    assert main(given) != 0
    err = capsys.readouterr().err
    assert "--drain-timeout-s (CORRAL_DRAIN_TIMEOUT_S): must be a number, got 'soon'" in err
    assert "name the same setting" not in err
    assert served == []


def test_allow_client_shm_is_system_shared_memory(
    tmp_path: Path, served: list[ServerSettings], capsys: pytest.CaptureFixture[str]
):
    assert main(["serve", str(tmp_path), "--allow-client-shm", "true"]) == 0
    assert main(["serve", str(tmp_path), "--allow-client-shm=false"]) == 0
    assert main(["serve", str(tmp_path), "--allow-client-shm=true", "--system-shared-memory"]) == 0
    assert [settings.system_shared_memory for settings in served] == [True, False, True]
    assert (
        main(["serve", str(tmp_path), "--allow-client-shm=true", "--no-system-shared-memory"]) == 2
    )
    assert "name the same setting with different values" in capsys.readouterr().err
    assert main(["serve", str(tmp_path), "--allow-client-shm=maybe"]) != 0
    assert len(served) == 3


def test_model_repository_is_the_repository(
    tmp_path: Path, served: list[ServerSettings], capsys: pytest.CaptureFixture[str]
):
    assert main(["serve", "--model-repository", str(tmp_path)]) == 0
    assert main(["serve", str(tmp_path), f"--model-repository={tmp_path}/."]) == 0
    assert [settings.repository for settings in served] == [tmp_path, tmp_path]
    other = tmp_path / "other"
    assert main(["serve", str(tmp_path), "--model-repository", str(other)]) == 2
    assert "name the same setting with different values" in capsys.readouterr().err


def test_model_control_modes_and_load_model(
    tmp_path: Path, served: list[ServerSettings], capsys: pytest.CaptureFixture[str]
):
    assert main(["serve", str(tmp_path), "--model-control-mode", "poll"]) == 0
    assert served[-1].poll_interval_s == 15.0  # Triton's default interval
    assert main(["serve", str(tmp_path), "--model-control-mode=poll", "--poll-interval-s=3"]) == 0
    assert served[-1].poll_interval_s == 3.0
    assert main(["serve", str(tmp_path), "--load-model", "a", "--load-model=b,c"]) == 0
    assert served[-1].load_model == ("a", "b", "c")
    assert main(["serve", str(tmp_path), "--load-model", "*"]) == 0
    assert served[-1].load_model == ("*",)
    assert main(["serve", str(tmp_path), "--allowed-hosts", "a", "--allowed-hosts=b,c"]) == 0
    assert served[-1].allowed_hosts == ("a", "b", "c")
    count = len(served)
    assert (
        main(
            [
                "serve",
                str(tmp_path),
                "--model-control-mode",
                "explicit",
                "--repository-poll-secs",
                "5",
            ]
        )
        == 2
    )
    assert "model_control_mode explicit does not poll the repository" in capsys.readouterr().err
    assert main(["serve", str(tmp_path), "--model-control-mode", "sometimes"]) == 2
    assert "--model-control-mode (CORRAL_MODEL_CONTROL_MODE)" in capsys.readouterr().err
    assert main(["serve", str(tmp_path), "--load-model", "*", "--load-model", "a"]) == 2
    assert "load_model '*' loads every model" in capsys.readouterr().err
    assert len(served) == count


def test_edge_native_without_corral_edge_exits_2_saying_how_to_install_it(
    tmp_path: Path,
    served: list[ServerSettings],
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
):
    monkeypatch.setattr(
        "corral.server.native.edge.native_edge_problem",
        lambda: "corral_edge is not installed (No module named 'corral_edge'): pip install ./edge",
    )
    assert main(["serve", str(tmp_path), "--edge", "native"]) == 2
    assert served == []  # nothing served
    error = capsys.readouterr().err
    assert "corral serve: error: --edge native: corral_edge is not installed" in error
    assert "pip install ./edge" in error
