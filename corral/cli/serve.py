"""``corral serve``: its settings from the flags and the ``CORRAL_*`` variables, then the server.

The flags themselves are made by the parser (``corral.cli.commands``) from the settings' fields;
this module takes the parsed arguments, folds Triton's spellings of the same settings into them
(refusing two spellings that disagree), builds :class:`corral.server.settings.ServerSettings`
and runs the server. A setting refused is named by its flag and its variable.
"""

from __future__ import annotations

import argparse
import sys
from importlib.util import find_spec
from pathlib import Path
from typing import Any

from corral._base import install_hint
from corral._models import is_store_url
from corral.cli.progress import exit_missing_extra
from corral.cli.triton_flags import fold_triton_flags

__all__ = [
    "REPEATED_SPELLINGS",
    "TRITON_SPELLINGS",
    "TRITON_TLS_OPTIONS",
    "run_serve",
    "spelled",
]


#: Triton's spellings of corral serve's options: ``{Triton's option: corral's setting}``.
TRITON_SPELLINGS = {
    "model_repository": "repository",
    "model_store": "repository",
    "id": "server_name",
    "http_address": "host",
    "model_load_thread_count": "load_concurrency",
    "repository_poll_secs": "poll_interval_s",
    "exit_timeout_secs": "drain_timeout_s",
    "allow_client_shm": "system_shared_memory",
    "grpc_server_cert": "tls_cert_file",
    "grpc_server_key": "tls_key_file",
}

#: Triton's spellings it takes more than once: the parser gathers their values in a list.
REPEATED_SPELLINGS = frozenset({"model_repository", "model_store"})

#: Triton's gRPC TLS switches and its client CA, which mean something only together:
#: ``{Triton's option: its help}``. corral's one TLS serves both ports (``_triton_tls``).
TRITON_TLS_OPTIONS = {
    "grpc_use_ssl": "Triton's switch of TLS (true or false); TLS is on in corral when "
    "--tls-cert-file (--grpc-server-cert) is given, on HTTP and gRPC both",
    "grpc_use_ssl_mutual": "Triton's switch of mTLS (true or false): with true, "
    "--grpc-root-cert is --tls-client-ca-file",
    "grpc_root_cert": "Triton's client CA: --tls-client-ca-file when --grpc-use-ssl-mutual "
    "is true; without it, not used (as by Triton)",
}


def spelled(setting: str) -> str:
    """How ``corral serve`` spells ``setting`` on its command line."""
    return "REPOSITORY" if setting == "repository" else "--" + setting.replace("_", "-")


def _triton_spellings(args: argparse.Namespace, given: dict[str, Any]) -> str | None:
    """Fold Triton's spellings into ``given``; a problem if both spellings differ.

    Triton takes ``--model-repository`` more than once (several repositories); corral serves
    one, so the same folder given twice is taken and two folders are refused.
    """
    for spelling, setting in TRITON_SPELLINGS.items():
        value = getattr(args, spelling, None)
        if isinstance(value, list):  # a repeatable spelling (REPEATED_SPELLINGS)
            first, *others = value
            differing = [other for other in others if not _same_setting(setting, first, other)]
            if differing:
                return (
                    f"--{spelling.replace('_', '-')} is given {first} and {differing[0]}: "
                    "corral serves one model repository; give one"
                )
            value = first
        if value is None:
            continue
        other = given.get(setting)
        if other is not None and not _same_setting(setting, value, other):
            return (
                f"--{spelling.replace('_', '-')} {value} and {spelled(setting)} {other} "
                "name the same setting with different values: give one"
            )
        given[setting] = value
    return None


def _triton_tls(args: argparse.Namespace, given: dict[str, Any]) -> tuple[str | None, list[str]]:
    """Fold Triton's TLS switches into ``given``: a problem or None, and notes to log.

    ``--grpc-use-ssl`` and ``--grpc-use-ssl-mutual`` are checked against the files given, so
    that a Triton command line never serves differently here: ``--grpc-use-ssl=false`` with
    a certificate would serve TLS, and is refused. ``--grpc-root-cert`` is the client CA only
    with ``--grpc-use-ssl-mutual=true``; without it Triton does not use it, nor does corral.
    """
    switches: dict[str, bool | None] = {}
    for option in ("grpc_use_ssl", "grpc_use_ssl_mutual"):
        text = getattr(args, option, None)
        if text is None:
            switches[option] = None
            continue
        value = _switch(text)
        if value is None:
            flag = "--" + option.replace("_", "-")
            return f"{flag} {text!r}: give true or false", []
        switches[option] = value
    use_ssl, mutual = switches["grpc_use_ssl"], switches["grpc_use_ssl_mutual"]
    root = getattr(args, "grpc_root_cert", None)
    notes = []
    if root is not None:
        if mutual:
            other = given.get("tls_client_ca_file")
            if other is not None and not _same_setting("tls_client_ca_file", root, other):
                return (
                    f"--grpc-root-cert {root} and --tls-client-ca-file {other} name the same "
                    "setting with different values: give one"
                ), []
            given["tls_client_ca_file"] = root
        else:
            notes.append(
                f"--grpc-root-cert {root} is not used: Triton uses it only with "
                "--grpc-use-ssl-mutual=true, and so does corral"
            )
    if mutual and given.get("tls_client_ca_file") is None:
        return "--grpc-use-ssl-mutual=true needs --grpc-root-cert (--tls-client-ca-file)", []
    if (use_ssl or mutual) and given.get("tls_cert_file") is None:
        return (
            "--grpc-use-ssl=true needs --grpc-server-cert and --grpc-server-key "
            "(--tls-cert-file and --tls-key-file)"
        ), []
    if use_ssl is False and (mutual or given.get("tls_cert_file") is not None):
        return (
            "--grpc-use-ssl=false, but a certificate or --grpc-use-ssl-mutual=true is given, "
            "which would serve TLS: leave out one or the other"
        ), []
    return None, notes


def _switch(text: str) -> bool | None:
    word = text.strip().lower()
    if word in ("true", "1", "yes", "on"):
        return True
    if word in ("false", "0", "no", "off"):
        return False
    return None


def _same_setting(setting: str, one: str, other: str | bool) -> bool:
    if setting == "repository":
        if is_store_url(one) or is_store_url(other):
            return one == other
        return Path(one).resolve() == Path(str(other)).resolve()
    if isinstance(other, bool):  # corral's --flag / --no-flag against Triton's =true / =false
        return (
            one.strip().lower() in ("true", "1", "yes", "on")
            if other
            else (one.strip().lower() in ("false", "0", "no", "off"))
        )
    try:
        return float(one) == float(other)
    except ValueError:
        return one == other


def run_serve(args: argparse.Namespace) -> int:
    """``corral serve``: settings from the flags and ``CORRAL_*``, then serve until stopped.

    A setting refused, or Triton's spelling of one disagreeing with corral's, is exit
    status 2 naming the flag and its variable, before anything starts.
    """
    needed = {"uvicorn": "server", "orjson": "server", "prometheus_client": "server"}
    needed |= {"pydantic_settings": "server", "grpc": "grpc"}
    missing = sorted({extra for module, extra in needed.items() if find_spec(module) is None})
    if missing:
        extras = " and ".join(missing) + (" extras" if len(missing) > 1 else " extra")
        exit_missing_extra(f"corral serve needs the {extras}: {install_hint(*missing)}")
    from corral.protocol.proto import runtime_problems

    # Before the generated modules are imported: they would refuse with a traceback.
    problems = runtime_problems()
    if problems:
        raise SystemExit("corral serve: " + "; ".join(problems))
    import logging
    import os

    from pydantic import ValidationError

    from corral.server.app import run
    from corral.server.observe.logs import configure_logging
    from corral.server.processes import run_group
    from corral.server.settings import ServerSettings, unknown_variables

    given = {name: getattr(args, name, None) for name in ServerSettings.model_fields}
    conflict = _triton_spellings(args, given)
    notes: list[str] = []
    if conflict is None:
        conflict, notes = _triton_tls(args, given)
    if conflict is None:
        conflict, triton_notes = fold_triton_flags(args, given)
        notes += triton_notes
    if conflict is not None:
        print(f"corral serve: error: {conflict}", file=sys.stderr)
        return 2
    try:
        settings = ServerSettings(**{k: v for k, v in given.items() if v is not None})
    except ValidationError as exc:
        print(f"corral serve: error: {_settings_problems(exc)}", file=sys.stderr)
        return 2
    from corral.server.observe.tracing import TracingUnavailable, check_tracing

    try:
        check_tracing(settings.trace_exporter)  # imports OpenTelemetry only when asked for
    except TracingUnavailable as exc:
        print(f"corral serve: error: {exc}", file=sys.stderr)
        return 2
    if settings.edge == "native":
        from corral.server.native.edge import native_edge_problem

        tls = settings.tls_cert_file is not None
        problem = native_edge_problem(tls=True) if tls else native_edge_problem()
        if problem is not None:
            print(f"corral serve: error: --edge native: {problem}", file=sys.stderr)
            return 2
    try:
        configure_logging(**settings.logging_options())
    except OSError as exc:
        print(
            f"corral serve: error: --log-file {settings.log_file}: cannot append to it: "
            f"{exc.strerror or exc}",
            file=sys.stderr,
        )
        return 2
    for line in unknown_variables(os.environ):
        logging.getLogger("corral.cli").warning("corral serve: %s", line)
    for note in notes:
        logging.getLogger("corral.cli").warning("corral serve: %s", note)
    from corral.server.tls import ServerTls, TlsFileError

    try:
        ServerTls.from_settings(settings)  # each process of a group reads them again
    except TlsFileError as exc:
        print(f"corral serve: error: {exc}", file=sys.stderr)
        return 2
    # Several processes: this one is their parent, and serves nothing itself.
    return run(settings) if settings.processes == 1 else run_group(settings)


def _settings_problems(error: Any) -> str:
    """A ValidationError's problems, each named by its flag and its environment variable.

    In corral's words, never pydantic's ("Field required", "Input should be ..."): the
    user gave flags, not a pydantic model.
    """
    problems = []
    for problem in error.errors():
        cause = problem.get("ctx", {}).get("error")
        field = problem["loc"][0] if problem["loc"] else getattr(cause, "option", None)
        message = str(cause) if cause is not None else _in_plain_words(problem)
        if field == "repository" and problem["type"] == "missing":
            problems.append(
                "no model repository given: give its folder (or s3:// URL) as REPOSITORY, "
                "after serve, or as --model-repository PATH (CORRAL_REPOSITORY)"
            )
        elif field is None:
            problems.append(message)
        else:
            flag = spelled(str(field))
            problems.append(f"{flag} (CORRAL_{str(field).upper()}): {message}")
    return "; ".join(problems)


def _in_plain_words(problem: Any) -> str:
    """One pydantic problem of a setting's value, as corral says it."""
    kind, given, bounds = problem["type"], problem.get("input"), problem.get("ctx", {})
    words = {
        "missing": "is required",
        "int_parsing": f"must be a whole number, got {given!r}",
        "int_from_float": f"must be a whole number, got {given!r}",
        "float_parsing": f"must be a number, got {given!r}",
        "bool_parsing": f"must be true or false, got {given!r}",
        "literal_error": f"must be one of {bounds.get('expected')}, got {given!r}",
        "greater_than": f"must be more than {bounds.get('gt')}, got {given!r}",
        "greater_than_equal": f"must be at least {bounds.get('ge')}, got {given!r}",
        "less_than": f"must be less than {bounds.get('lt')}, got {given!r}",
        "less_than_equal": f"must be at most {bounds.get('le')}, got {given!r}",
        "string_too_short": "must not be empty",
        "extra_forbidden": "names no setting of corral serve",
    }
    return words.get(kind, f"is not a valid value: {given!r}")
