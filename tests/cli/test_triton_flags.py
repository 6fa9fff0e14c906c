"""Issue 48: every tritonserver flag is honoured, accepted and named, or refused saying why;
``corral serve``'s own errors name real flags, in corral's words, with the nearest flag.

In process: the settings ``corral serve`` would serve with are captured instead of served.
A real tritonserver command line against a real server: tests/server/test_triton_compat.py.
"""

from __future__ import annotations

import logging
import re
from pathlib import Path
from typing import Any

import pytest

from corral.cli.commands import SERVE_GROUPS, main
from corral.cli.serve import TRITON_SPELLINGS, TRITON_TLS_OPTIONS
from corral.cli.triton_flags import NO_EFFECT, TRITON_FLAGS
from corral.server.settings import ServerSettings

DOCS = Path(__file__).resolve().parents[2] / "docs" / "server.md"


def serve(tmp_path: Path, *flags: str) -> int:
    return main(["serve", str(tmp_path), *flags])


# -- honoured ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("flags", "name", "expected"),
    [
        (["--exit-on-error=false"], "exit_on_error", False),
        (["--exit-on-error", "false"], "exit_on_error", False),
        (["--exit-on-error=0"], "exit_on_error", False),
        (["--exit-on-error=OFF"], "exit_on_error", False),
        (["--no-exit-on-error"], "exit_on_error", False),
        (["--exit-on-error=true"], "exit_on_error", True),
        (["--strict-readiness=false"], "strict_readiness", False),
        (["--strict-readiness", "1"], "strict_readiness", True),
        (["--strict=true"], "strict", True),
        (["--strict-model-config=false"], "strict", False),
        (["--log-verbose=1"], "log_level", "debug"),
        (["--log-verbose=true"], "log_level", "debug"),
        (["--log-verbose=0"], "log_level", "info"),
        (["--log-info=false"], "log_level", "warning"),
        (["--log-info=false", "--log-warning=false"], "log_level", "error"),
        (["--log-info=0", "--log-warning=0", "--log-error=0"], "log_level", "critical"),
        (["--log-format=ISO8601"], "log_format", "text"),
        (["--allow-grpc=false"], "grpc_port", -1),
        (["--allow-grpc=true"], "grpc_port", 8001),
        (["--allow-http=true"], "http_port", 8000),
        (["--allow-sagemaker=false", "--allow-vertex-ai=false"], "http_port", 8000),
        (["--model-load-thread-count=3"], "load_concurrency", 3),
        (["--id=triton"], "server_name", "triton"),
        (["--http-address=0.0.0.0", "--grpc-address=0.0.0.0"], "host", "0.0.0.0"),
        (["--metrics-address=127.0.0.1"], "host", "127.0.0.1"),
        (["--grpc-keepalive-time=90000"], "grpc_keepalive_time_s", 90.0),
        (["--grpc-keepalive-timeout=5000"], "grpc_keepalive_timeout_s", 5.0),
        (
            ["--grpc-http2-min-recv-ping-interval-without-data=300000"],
            "grpc_min_ping_interval_s",
            300.0,
        ),
        (
            ["--backend-config=onnxruntime,enable-global-threadpool=0"],
            "thread_pools",
            "per_session",
        ),
        (
            [
                "--backend-config=onnxruntime,enable-global-threadpool=1",
                "--backend-config",
                "onnxruntime,intra_op_thread_count=1",
                "--backend-config=onnxruntime,inter_op_thread_count=2",
            ],
            "inter_op_threads",
            2,
        ),
        (
            [
                "--backend-config=onnxruntime,enable-global-threadpool=true",
                "--backend-config=onnxruntime,intra_op_thread_count=1",
            ],
            "intra_op_threads",
            1,
        ),
        (["--backend-config=default-max-batch-size=8"], "default_max_batch_size", 8),
        (["--backend-config=onnxruntime,default-max-batch-size=4"], "default_max_batch_size", 4),
    ],
)
def test_tritons_flags_set_corrals_settings(
    tmp_path: Path, served: list[ServerSettings], flags: list[str], name: str, expected: Any
):
    assert serve(tmp_path, *flags) == 0
    assert getattr(served[0], name) == expected
    assert served[0].repository == tmp_path  # a switch's word never takes its place


def test_a_bare_switch_before_the_repository_leaves_it_the_repository(
    tmp_path: Path, served: list[ServerSettings]
):
    assert main(["serve", "--strict-readiness", str(tmp_path), "--exit-on-error"]) == 0
    assert (served[0].repository, served[0].strict_readiness, served[0].exit_on_error) == (
        tmp_path,
        True,
        True,
    )


def test_model_store_is_the_repository(tmp_path: Path, served: list[ServerSettings]):
    assert main(["serve", f"--model-store={tmp_path}"]) == 0
    # The same folder given twice, as a deployment's templates may: one repository.
    assert (
        main(["serve", f"--model-repository={tmp_path}", "--model-repository", str(tmp_path)]) == 0
    )
    assert [settings.repository for settings in served] == [tmp_path, tmp_path]


def test_onnxruntimes_thread_counts_without_its_global_pool_change_nothing(
    tmp_path: Path, served: list[ServerSettings], caplog: pytest.LogCaptureFixture
):
    # As Triton's backend: the counts size its global pool, and are read only with it.
    caplog.set_level(logging.WARNING, logger="corral.cli")
    flags = ["--backend-config=onnxruntime,intra_op_thread_count=3"]
    flags += ["--backend-config=onnxruntime,enable-mem-arena=1"]
    assert serve(tmp_path, *flags) == 0
    assert served[0].intra_op_threads == ServerSettings.model_fields["intra_op_threads"].default
    lines = [record.getMessage() for record in caplog.records]
    assert any("intra_op_thread_count=3 has no effect here" in x for x in lines)
    assert any("onnxruntime,enable-mem-arena=1 has no effect here" in x for x in lines)


def test_the_global_pool_switch_and_thread_pools_must_agree(
    tmp_path: Path, served: list[ServerSettings], capsys: pytest.CaptureFixture[str]
):
    flags = ["--backend-config=onnxruntime,enable-global-threadpool=0", "--thread-pools=global"]
    assert serve(tmp_path, *flags) == 2
    assert "disagree: give one" in capsys.readouterr().err
    assert served == []


# -- accepted and named -----------------------------------------------------------------------


def test_every_flag_without_effect_is_accepted_and_named_once(
    tmp_path: Path, served: list[ServerSettings], caplog: pytest.LogCaptureFixture
):
    flags = [f"--{name.replace('_', '-')}=7" for name in NO_EFFECT]
    flags += ["--backend-config=some-global=8", "--backend-config=tensorflow,a=b"]
    flags += ["--allow-metrics=true"]
    caplog.set_level(logging.WARNING, logger="corral.cli")
    assert serve(tmp_path, *flags) == 0
    lines = [record.getMessage() for record in caplog.records]
    for name in NO_EFFECT:
        named = [line for line in lines if f"Triton's --{name.replace('_', '-')}=7 " in line]
        assert len(named) == 1, name
        assert "has no effect here: " in named[0]
    assert any("some-global=8 (every backend's) has no effect" in x for x in lines)
    assert any("tensorflow,a=b has no effect here: corral serves no tensorflow" in x for x in lines)
    assert any("--allow-metrics=true: corral serves /metrics on the HTTP port" in x for x in lines)


# -- refused ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--allow-http=false"], "--allow-http=false is refused: corral always serves HTTP"),
        (["--strict-model-config=true"], "--strict-model-config=true is refused"),
        (["--disable-auto-complete-config"], "--disable-auto-complete-config is refused"),
        (["--allow-sagemaker=true"], "corral has no SageMaker endpoint"),
        (["--allow-vertex-ai=1"], "corral has no Vertex AI endpoint"),
        (["--http-restricted-api=model-repository:k=v"], "restricts its APIs by token"),
        (["--grpc-restricted-protocol=health:k=v"], "restricts its APIs by token"),
        (["--grpc-address=0.0.0.0"], "--grpc-address 0.0.0.0 differs from --host 127.0.0.1"),
        (["--allow-metrics=false", "--metrics-port=8002"], "give one"),
        (["--allow-grpc=maybe"], "--allow-grpc=maybe: give true or false"),
        (["--log-info=true", "--log-warning=false"], "cannot: turn off the lower ones only"),
        (["--log-verbose=1", "--log-level=error"], "mean --log-level debug, but --log-level"),
        (["--log-verbose=lots"], "--log-verbose 'lots': give a whole number"),
        (["--grpc-keepalive-time=soon"], "give a whole number of milliseconds"),
        (
            ["--grpc-keepalive-time=1000", "--grpc-keepalive-time-s=9"],
            "name the same setting with different values",
        ),
        (["--backend-config=onnxruntime"], "Triton's form is <backend>,<setting>=<value>"),
        (["--backend-config=,a=b"], "Triton's form is <backend>,<setting>=<value>"),
        (
            ["--backend-config=default-max-batch-size=8", "--default-max-batch-size=16"],
            "name the same setting with different values",
        ),
        (["--backend-config=default-max-batch-size=0"], "default_max_batch_size must be"),
        (["--id=a", "--server-name=b"], "name the same setting with different values"),
        (["--model-repository=/a", "--model-repository=/b"], "serves one model repository"),
        # A bad value, in corral's words (never pydantic's "Input should ...").
        (["--http-port", "abc"], "--http-port (CORRAL_HTTP_PORT): must be a whole number"),
        (["--edge", "rust"], "--edge (CORRAL_EDGE): must be one of 'auto', 'native' or"),
        (["--http-port", "70000"], "--http-port (CORRAL_HTTP_PORT): must be at most 65535"),
    ],
)
def test_what_would_answer_otherwise_is_refused_saying_what_to_change(
    tmp_path: Path,
    served: list[ServerSettings],
    capsys: pytest.CaptureFixture[str],
    flags: list[str],
    message: str,
):
    assert serve(tmp_path, *flags) == 2
    err = capsys.readouterr().err
    assert message in err
    assert "Input should" not in err
    assert served == []


# -- corral serve's own errors and help -----------------------------------------------------


def test_a_typo_is_named_with_the_nearest_flag_in_the_subcommands_usage(
    tmp_path: Path, served: list[ServerSettings], capsys: pytest.CaptureFixture[str]
):
    with pytest.raises(SystemExit) as exited:
        serve(tmp_path, "--memory-budjet", "1GiB")
    assert exited.value.code == 2
    err = capsys.readouterr().err
    assert err.startswith("usage: corral serve ")
    assert "--memory-budjet (did you mean --memory-budget?)" in err
    assert "corral serve --help and docs/server.md" in err
    with pytest.raises(SystemExit):
        serve(tmp_path, "--strict-readyness=true")
    assert "(did you mean --strict-readiness?)" in capsys.readouterr().err
    assert served == []


def test_a_switch_takes_tritons_words_only(
    tmp_path: Path, served: list[ServerSettings], capsys: pytest.CaptureFixture[str]
):
    with pytest.raises(SystemExit) as exited:
        serve(tmp_path, "--exit-on-error=maybe")
    assert exited.value.code == 2
    err = capsys.readouterr().err
    assert "--exit-on-error=maybe: give true or false (or 1, 0, on, off)" in err
    assert err.startswith("usage: corral serve ")
    assert served == []


def test_without_a_repository_the_error_names_the_real_ways_to_give_one(
    served: list[ServerSettings], capsys: pytest.CaptureFixture[str]
):
    assert main(["serve"]) == 2
    err = capsys.readouterr().err
    assert "no model repository given" in err
    assert "REPOSITORY" in err
    assert "--model-repository PATH" in err
    assert "Field required" not in err
    assert not re.search(r"--repository\b", err)

    assert "Field required" not in err


def test_serve_help_shows_the_first_five_then_groups(capsys: pytest.CaptureFixture[str]):
    with pytest.raises(SystemExit):
        main(["serve", "--help"])
    shown = capsys.readouterr().out
    first = shown[shown.index("start here:") : shown.index("models and loading:")]
    for flag in ("REPOSITORY", "--host", "--http-port", "--grpc-port", "--memory-budget"):
        assert flag in first
    assert len(SERVE_GROUPS["start here"]) == 5
    titles = [*SERVE_GROUPS, "Triton's spellings"]
    assert [shown.index(f"\n{title}:") for title in titles] == sorted(
        shown.index(f"\n{title}:") for title in titles
    )
    assert "other settings:" not in shown  # every setting has its group
    assert shown.startswith("usage: corral serve [REPOSITORY]")


def test_docs_table_names_every_triton_flag():
    """docs/server.md's table of Triton's command line names each flag corral serve takes."""
    text = DOCS.read_text(encoding="utf-8")
    section = text[text.index("### Triton's command line") :]
    section = section[: section.index("\n### ", 1)]
    for name in TRITON_FLAGS | set(TRITON_SPELLINGS) | set(TRITON_TLS_OPTIONS):
        assert f"`--{name.replace('_', '-')}" in section, name
    for name in ("exit_on_error", "strict_readiness"):
        assert f"`--{name.replace('_', '-')}" in section, name
