"""The ``corral`` command line.

::

    corral demo [--models N] [--threads T] [--requests R] [--idle-window-s S] [--keep DIR] [--json]
    corral --version
    corral models REPOSITORY [--preload] [--memory-budget SIZE] [--json]
    corral check REPOSITORY [--load] [--memory-budget SIZE] [--json]
    corral serve REPOSITORY [--host H] [--http-port P] [--grpc-port P] [--memory-budget SIZE]
                            [--compute-workers N] [--max-request-bytes N] [--auth-token T] ...
    corral ray-serve REPOSITORY [--address A] [--replicas N] [--memory-budget SIZE]
                                [--host H] [--port P] [--max-models-per-replica N] ...

This module is the command's argument parsing: ``main`` and the parser, whose ``serve`` and
``ray-serve`` flags are made from their settings' fields. Each command runs in a module of its
own in this folder: ``serve``, ``ray_serve``, ``demo``, ``models``, ``check``, ``status``.

The command line is an edge: it alone draws progress bars (with rich, from the ``cli``
extra, ``progress``) and prints; the demo it runs lives in :mod:`corral.demo` and reports
progress through plain callbacks. Progress goes to stderr, results to stdout, so ``--json``
output can be piped. The benchmarks are scripts in the repository's ``benchmarks/``, not
commands.
"""

from __future__ import annotations

import argparse
import dataclasses
import difflib
import os
import sys
import textwrap
import typing
from collections.abc import Callable
from pathlib import Path

from corral._base import ENV_PREFIX, CorralError
from corral._models import is_store_url
from corral.cli.check import run_check
from corral.cli.demo import run_demo
from corral.cli.models import run_models
from corral.cli.progress import require_rich
from corral.cli.ray_serve import RAY_SERVE_OPTIONS, run_ray_serve
from corral.cli.serve import (
    REPEATED_SPELLINGS,
    TRITON_SPELLINGS,
    TRITON_TLS_OPTIONS,
    run_serve,
    spelled,
)
from corral.cli.status import add_status_command, run_status
from corral.cli.triton_flags import add_triton_flags, switch_value

__all__ = [
    "SERVE_GROUPS",
    "command_parser",
    "main",
    "positive_int",
    "positive_seconds",
    "version_line",
]

Handler = Callable[[argparse.Namespace], int]


def main(argv: list[str] | None = None) -> int:
    """Run the ``corral`` command with ``argv`` (default: ``sys.argv[1:]``); returns the exit code.

    Bad arguments exit through argparse (status 2) with a message naming the argument.

    Example::

        corral.cli.main(["demo", "--models", "100", "--json"])
    """
    given = sys.argv[1:] if argv is None else argv
    command = next((word for word in given if not word.startswith("-")), None)
    if command == "ray-serve":
        _before_importing_ray(given)
    parser = command_parser(command)
    if command == "serve":
        given = _switch_words(given, parser)
    args, unknown = parser.parse_known_args(given)
    if unknown:
        _refuse_unknown(parser, args.command, unknown)
    handler: Handler = args.handler
    try:
        return handler(args)
    except (CorralError, ValueError, OSError) as exc:
        print(f"corral {args.command}: error: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print(f"corral {args.command}: interrupted", file=sys.stderr)
        return 130


# -- arguments ------------------------------------------------------------------------------


def command_parser(command: str | None = None) -> argparse.ArgumentParser:
    """The ``corral`` command's parser, with ``command``'s subcommand only (None: all of them).

    Each flag of ``serve`` and ``ray-serve`` is made from a settings field; the tests and
    ``docs/`` read the flags from here.
    """
    parser = argparse.ArgumentParser(
        prog="corral", description="Serve thousands of ONNX models from one Python process."
    )
    parser.add_argument(
        "-V",
        "--version",
        action=_PrintVersion,
        help="print corral's version, and onnxruntime's and numpy's, then exit",
    )
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    serve = commands.add_parser(
        "serve",
        help="serve a model repository over the KServe v2 protocol (HTTP and gRPC)",
        usage="corral serve [REPOSITORY] [--http-port P] [--grpc-port P] [--memory-budget SIZE] "
        "[OPTION ...]",
        formatter_class=_FlagsWhole,
        epilog="Every option, and what corral does with each of tritonserver's: "
        "docs/server.md (Settings; Triton's command line).",
        description=(
            "Serve a Triton-layout model repository over the Open Inference Protocol (KServe "
            "v2) on HTTP and gRPC, loading models lazily. Every option --NAME can also be set "
            "with the environment variable CORRAL_NAME (dashes as underscores, e.g. "
            "CORRAL_AUTH_TOKEN), as each option's help says; options given here win. SIGTERM "
            "or SIGINT drains requests in flight and exits 0 (3 if the drain ran out or loads "
            "hung on their storage were abandoned)."
        ),
    )
    if command == "serve":  # the flags need the server extra: built only when asked for
        _add_setting_flags(serve)
    serve.set_defaults(handler=run_serve)

    ray_serve = commands.add_parser(
        "ray-serve",
        help="serve a model repository on Ray Serve: replicas routed to by model",
        description=(
            "Deploy corral on Ray Serve: a v2 HTTP ingress and REPLICAS model replicas, each "
            "with its own Host and memory budget; Ray routes each model to a replica that has "
            "it. Without --address, starts a local Ray node on 127.0.0.1 (no dashboard, no "
            "usage report). SIGTERM or SIGINT removes the application (and the local node) "
            "and exits 0. A repository folder must be readable at the same path on every node; "
            "an s3:// URL is read by each replica into a cache folder of its own. "
            "Every option --NAME can also be set with the environment variable CORRAL_NAME "
            "(dashes as underscores), as each option's help says; options given here win."
        ),
    )
    ray_serve.add_argument(
        "repository",
        type=_folder_or_url,
        help="the repository's root folder, or its s3:// URL (each replica then caches its models)",
    )
    if command == "ray-serve":  # the flags import Ray and read CORRAL_*: only when asked for
        for name, convert, default, help_text in RAY_SERVE_OPTIONS:
            _add_ray_serve_flag(ray_serve, name, convert, default, help_text)
        _add_config_flags(ray_serve)
    ray_serve.set_defaults(handler=run_ray_serve)

    demo = commands.add_parser(
        "demo",
        help="corral against onnxruntime's defaults on many small models",
        description=(
            "Build many tiny models, then load and serve them with corral and with "
            "onnxruntime's default sessions, each in its own process, and compare threads, "
            "memory, load time, throughput and idle CPU."
        ),
    )
    demo.add_argument("--models", type=positive_int, default=1000, help="models (default 1000)")
    demo.add_argument(
        "--threads", type=positive_int, default=8, help="loading and serving threads (default 8)"
    )
    demo.add_argument(
        "--requests", type=positive_int, default=20000, help="runs in all (default 20000)"
    )
    demo.add_argument(
        "--idle-window-s",
        type=positive_seconds,
        metavar="S",
        help="seconds each worker idles while its idle CPU is measured (default 2)",
    )
    demo.add_argument(
        "--keep", type=Path, metavar="DIR", help="build the models into DIR and keep them"
    )
    demo.add_argument("--json", action="store_true", help="print the raw results as JSON")
    demo.set_defaults(handler=run_demo)

    models = commands.add_parser(
        "models",
        help="list a model repository's models; --preload loads them first",
        description=(
            "List the models of a Triton-layout repository with their state, versions and "
            "estimated size. With --preload, load them all first (a progress bar shows it) and "
            "report the ones that fail."
        ),
    )
    models.add_argument(
        "repository", type=_folder_or_url, help="the repository's root folder, or its s3:// URL"
    )
    models.add_argument("--preload", action="store_true", help="load every model first")
    models.add_argument(
        "--memory-budget",
        type=_size,
        metavar="SIZE",
        help="bytes or a size like 512MiB, 2Gi, 2g (default: none)",
    )
    models.add_argument("--json", action="store_true", help="print the statuses as JSON")
    models.set_defaults(handler=run_models)

    add_status_command(commands, _status)

    check = commands.add_parser(
        "check",
        help="find every problem in a model repository, with its fix; --load loads each model",
        description=(
            "Check a Triton-layout repository as corral serve does at start, without loading "
            "a model: names, layout, versions, model.toml and config.pbtxt, execution "
            "providers, model files and, with --memory-budget, models larger than the budget. "
            "Prints each problem with its fix; exit status 1 on any problem, 0 when clean. "
            "--load also loads every model (a progress bar shows it) and prints each one's "
            "estimated size and load time; a failed load is a problem too."
        ),
    )
    check.add_argument(
        "repository", type=_folder_or_url, help="the repository's root folder, or its s3:// URL"
    )
    check.add_argument("--load", action="store_true", help="also load every model, one at a time")
    check.add_argument(
        "--memory-budget",
        metavar="SIZE",
        type=_size,
        help="bytes or a size like 512MiB (default: none)",
    )
    check.add_argument("--json", action="store_true", help="print the problems as JSON")
    check.set_defaults(handler=run_check)

    return parser


class _FlagsWhole(argparse.HelpFormatter):
    """argparse's help, with lines never broken inside a flag's name (at its dashes)."""

    def _split_lines(self, text: str, width: int) -> list[str]:
        return textwrap.wrap(" ".join(text.split()), width, break_on_hyphens=False)

    def _fill_text(self, text: str, width: int, indent: str) -> str:
        return textwrap.fill(
            " ".join(text.split()),
            width,
            initial_indent=indent,
            subsequent_indent=indent,
            break_on_hyphens=False,
        )


class _PrintVersion(argparse.Action):
    """``--version``: one line, built only when asked for (it imports onnxruntime)."""

    def __init__(self, option_strings: list[str], dest: str, help: str | None = None) -> None:
        super().__init__(option_strings, dest, nargs=0, default=argparse.SUPPRESS, help=help)

    def __call__(
        self,
        parser: argparse.ArgumentParser,
        namespace: argparse.Namespace,
        values: object,
        option_string: str | None = None,
    ) -> None:
        print(version_line())  # stdout, as argparse's own version action
        parser.exit()


def version_line() -> str:
    """What ``corral --version`` prints: corral's version and those of what it runs on.

    corral's comes from its source tree's ``pyproject.toml`` when it runs from a checkout
    (the code running is that tree's), else from the installed package's metadata.
    onnxruntime's and numpy's are those of the modules imported, whichever distribution
    (``onnxruntime`` or ``onnxruntime-gpu``) brought them.

    Example::

        corral 0.1.0 (onnxruntime 1.24.1, numpy 2.3.5, CPython 3.11.14, GIL enabled)

    The interpreter's part (:func:`corral._base.interpreter.describe_interpreter`) is read after
    onnxruntime and numpy are imported: on a free-threaded build, an import may re-enable the
    GIL, and the line says what runs, not what started.
    """
    import numpy
    import onnxruntime

    from corral._base import describe_interpreter

    return (
        f"corral {_corral_version()} (onnxruntime {onnxruntime.__version__}, "
        f"numpy {numpy.__version__}, {describe_interpreter()})"
    )


def _corral_version() -> str:
    import importlib.metadata
    import tomllib

    pyproject = Path(__file__).resolve().parent.parent / "pyproject.toml"
    if pyproject.is_file():
        project = tomllib.loads(pyproject.read_text(encoding="utf-8")).get("project", {})
        if project.get("name") == "corral":
            return str(project["version"])
    return importlib.metadata.version("corral")


def _size(text: str) -> int:
    """An argparse type: bytes from a size (``corral._host.budget.parse_bytes``' units)."""
    from corral._base import parse_bytes

    try:
        return parse_bytes(text, option="size")  # argparse puts the flag before the message
    except CorralError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def positive_int(text: str) -> int:
    """An argparse type: a positive integer, or an error that says what was given."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be a positive integer, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be a positive integer, got {value}")
    return value


def positive_seconds(text: str) -> float:
    """An argparse type: a positive number of seconds, or an error that says what was given."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be a positive number, got {text!r}") from None
    if not value > 0:
        raise argparse.ArgumentTypeError(f"must be a positive number, got {value:g}")
    return value


def _status(args: argparse.Namespace) -> int:
    require_rich("corral status")
    return run_status(args)


# -- corral serve's flags: one per setting -------------------------------------------------
#
# Made here, not by pydantic-settings' own CLI source. Tried (pydantic-settings 2.16):
# CliSettingsSource(ServerSettings, root_parser=<serve's parser>, cli_kebab_case=True,
# cli_implicit_flags=True) makes the same --kebab-case flags, --x/--no-x switches, a
# repeatable --load-model and an optional REPOSITORY (CliPositionalArg), and tolerates
# Triton's spellings added beside them. It does not serve for two reasons. (1) Its help is the
# field's description, then "(default: ...)", with the type as metavar ("{int,null}"): the
# variable each flag's help names (tests/server/test_serve_flags.py) would have to be written into
# every description. (2) corral ray-serve's options are a frozen dataclass, RayServeConfig
# (Ray Serve config files pass it plain args), whose flags are converted while parsing, so
# that a malformed CORRAL_REPLICAS or --memory-budget 2G is exit status 2 naming it
# (tests/ray/test_ray_serve_flags.py): pydantic's source cannot make those, so ray-serve would
# keep a generator of its own beside it. Two generators of ours, each a walk over its class's
# fields, both made from the same declarations (corral._base.declare), are the simpler pair.


def _add_setting_flags(parser: argparse.ArgumentParser) -> None:
    """One flag per ServerSettings field, ``--<field>``, whose help names ``CORRAL_<FIELD>``.

    Shown in groups (:data:`SERVE_GROUPS`): first the few a newcomer needs, then by concern,
    then Triton's spellings.
    """
    try:
        from corral.server.settings import ServerSettings
    except ImportError:
        # run_serve says which extra to install, whatever the arguments.
        parser.add_argument("arguments", nargs=argparse.REMAINDER, help=argparse.SUPPRESS)
        return
    groups = {title: parser.add_argument_group(title) for title in SERVE_GROUPS}
    other = parser.add_argument_group("other settings")
    group_of = {name: groups[title] for title, names in SERVE_GROUPS.items() for name in names}
    shown = [name for names in SERVE_GROUPS.values() for name in names]
    fields = sorted(  # in the groups' order, so that --help reads as SERVE_GROUPS does
        ServerSettings.model_fields.items(),
        key=lambda item: shown.index(item[0]) if item[0] in shown else len(shown),
    )
    for name, field in fields:
        group = group_of.get(name, other)
        variable = ServerSettings.variable(name)
        default = "" if field.default in (None, {}) else f"; default {field.default}"
        if name == "repository":
            group.add_argument(
                name, nargs="?", metavar="REPOSITORY", help=f"{field.description} ({variable})"
            )
            continue
        flag = "--" + name.replace("_", "-")
        help_text = f"{field.description} ({variable}{default})"
        if field.annotation is bool:
            # Triton's --flag=true|false and --flag false too: _switch_words makes them these.
            group.add_argument(
                flag,
                action=argparse.BooleanOptionalAction,
                help=f"{help_text}; also {flag}=true|false",
            )
        elif name in ("load_model", "allowed_hosts"):  # repeatable (load_model: as Triton's)
            group.add_argument(flag, action="append", metavar="NAME", help=help_text)
        else:
            # Values go to ServerSettings as text: it converts and checks them, as it does
            # the environment's.
            group.add_argument(flag, metavar=name.upper(), help=help_text)
    triton = parser.add_argument_group(
        "Triton's spellings",
        "tritonserver's flags: each honoured, accepted and named once in the log as having no "
        "effect here, or refused saying what to change (docs/server.md, Triton's command line)",
    )
    for spelling, setting in TRITON_SPELLINGS.items():
        triton.add_argument(
            "--" + spelling.replace("_", "-"),
            dest=spelling,
            metavar=setting.upper(),
            action="append" if spelling in REPEATED_SPELLINGS else "store",
            help=f"Triton's spelling of {spelled(setting)}",
        )
    for spelling, help_text in TRITON_TLS_OPTIONS.items():
        triton.add_argument("--" + spelling.replace("_", "-"), dest=spelling, help=help_text)
    add_triton_flags(triton)


#: ``corral serve --help``'s groups of settings, in order: ``{title: fields}``. A field in
#: none is shown under "other settings".
SERVE_GROUPS: dict[str, tuple[str, ...]] = {
    "start here": ("repository", "host", "http_port", "grpc_port", "memory_budget"),
    "models and loading": (
        "load_model",
        "model_control_mode",
        "exit_on_error",
        "strict_readiness",
        "strict",
        "max_loaded_models",
        "memory_watch_s",
        "measure_charges",
        "load_concurrency",
        "load_timeout_s",
        "ready_load_timeout_s",
        "poll_interval_s",
        "max_upload_bytes",
        "allow_python_uploads",
        "cache_dir",
        "cache_bytes",
        "optimized_models",
        "cache_config",
        "response_cache_byte_size",
    ),
    "compute": (
        "compute_workers",
        "batching",
        "default_max_batch_size",
        "max_queue_per_model",
        "inline_run_us",
        "intra_op_threads",
        "inter_op_threads",
        "thread_pools",
        "processes",
        "edge",
        "edge_threads",
    ),
    "requests and HTTP connections": (
        "max_request_bytes",
        "max_body_bytes_in_flight",
        "max_url_bytes",
        "max_header_bytes",
        "header_timeout_s",
        "body_timeout_s",
        "body_min_rate_bytes_s",
        "idle_timeout_s",
        "max_connections",
    ),
    "gRPC connections": (
        "grpc_max_connections",
        "grpc_idle_timeout_s",
        "grpc_handshake_timeout_s",
        "grpc_keepalive_time_s",
        "grpc_keepalive_timeout_s",
        "grpc_min_ping_interval_s",
        "grpc_max_concurrent_streams",
        "grpc_max_health_watches",
    ),
    "access: tokens, TLS, names, shared memory": (
        "auth_token",
        "inference_tokens",
        "metadata_tokens",
        "model_control_tokens",
        "shared_memory_tokens",
        "statistics_tokens",
        "allowed_hosts",
        "tls_cert_file",
        "tls_key_file",
        "tls_client_ca_file",
        "system_shared_memory",
        "max_shared_memory_regions",
    ),
    "logs, metrics, traces, shutdown": (
        "log_level",
        "grpc_log_level",
        "log_format",
        "log_file",
        "access_log",
        "metrics_port",
        "model_latency_histograms",
        "trace_exporter",
        "server_name",
        "drain_timeout_s",
        "drain_notice_s",
    ),
}


def _switch_words(given: list[str], parser: argparse.ArgumentParser) -> list[str]:
    """``corral serve``'s switches as Triton writes them, made argparse's ``--x`` / ``--no-x``.

    ``--exit-on-error=false`` and ``--exit-on-error false`` (Triton's forms; true, false, 1,
    0, on, off) become ``--no-exit-on-error``; a word Triton does not take after ``=`` is
    left for argparse to refuse by name.
    """
    serve = _subcommand(parser, "serve")
    actions = serve._actions if serve is not None else []
    options = [option for action in actions for option in action.option_strings]
    switches = {
        option
        for action in actions
        if isinstance(action, argparse.BooleanOptionalAction)
        for option in action.option_strings
        if not option.startswith("--no-")
    }
    words: list[str] = []
    position = 0
    while position < len(given):
        word = given[position]
        flag, equals, text = word.partition("=")
        completed = [option for option in options if option.startswith(flag)]
        if flag.startswith("--") and len(completed) == 1:
            flag = completed[0]  # an unambiguous prefix, as argparse takes it
        following = given[position + 1] if position + 1 < len(given) else None
        bare = flag in switches and not equals and following is not None
        if bare and switch_value(following or "") is not None:  # Triton's "--flag false"
            text, equals, position = following or "", "=", position + 1
        value = switch_value(text) if flag in switches and equals else None
        if flag in switches and equals and value is None and serve is not None:
            serve.error(f"{flag}={text}: give true or false (or 1, 0, on, off)")
        if value is None:
            words.append(word)
        else:
            words.append(flag if value else "--no-" + flag.removeprefix("--"))
        position += 1
    return words


def _subcommand(parser: argparse.ArgumentParser, name: str) -> argparse.ArgumentParser | None:
    for action in parser._actions:  # argparse keeps its subparsers here, and nowhere public
        if isinstance(action, argparse._SubParsersAction):
            found: argparse.ArgumentParser | None = action.choices.get(name)
            return found
    return None


def _refuse_unknown(parser: argparse.ArgumentParser, command: str, unknown: list[str]) -> None:
    """Exit 2 naming each argument not taken, with the nearest flag, in the command's usage."""
    sub = _subcommand(parser, command) or parser
    flags = [option for action in sub._actions for option in action.option_strings]
    lines = []
    for word in unknown:
        nearest = difflib.get_close_matches(word.partition("=")[0], flags, n=1, cutoff=0.75)
        hint = f" (did you mean {nearest[0]}?)" if nearest else ""
        lines.append(f"{word}{hint}")
    where = " and docs/server.md" if command == "serve" else ""
    sub.error(
        f"unrecognized arguments: {', '.join(lines)}; every option: corral {command} --help{where}"
    )


# -- corral ray-serve's flags: one per option, each defaulting to its variable ---------------


def _before_importing_ray(given: list[str]) -> None:
    """Without --address, set what Ray reads at import for a local node (LOCAL_ENVIRONMENT)."""
    probe = argparse.ArgumentParser(add_help=False)
    probe.add_argument("--address")
    if probe.parse_known_args(given)[0].address is None:
        # corral.ray._launch.LOCAL_ENVIRONMENT, which cannot be imported before Ray is.
        os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")
        os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")


def _add_ray_serve_flag(
    parser: argparse.ArgumentParser,
    name: str,
    convert: Callable[[str], object],
    default: object,
    help_text: str,
) -> None:
    """``--<name>``, defaulting to ``CORRAL_<NAME>`` when set (checked here), else ``default``."""
    variable = ENV_PREFIX + name.upper()
    text = os.environ.get(variable)
    if text is not None:
        try:
            default = convert(text)
        except (argparse.ArgumentTypeError, ValueError) as exc:
            parser.error(f"{variable}={text!r}: {exc}")
    shown = "" if default is None else f"; default {default}"
    parser.add_argument(
        "--" + name.replace("_", "-"),
        type=convert,
        default=default,
        metavar=name.upper(),
        help=f"{help_text} ({variable}{shown})",
    )


def _add_config_flags(parser: argparse.ArgumentParser) -> None:
    """One flag per RayServeConfig field, ``--<field>``, with the field's help and type."""
    try:
        from corral.ray._config import RayServeConfig
    except ImportError:
        # run_ray_serve says which extra to install, whatever the arguments.
        parser.add_argument("arguments", nargs=argparse.REMAINDER, help=argparse.SUPPRESS)
        return

    hints = typing.get_type_hints(RayServeConfig)
    for field in dataclasses.fields(RayServeConfig):
        sized = field.name in ("memory_budget", "max_upload_bytes", "cache_bytes")
        convert = _size if sized else _text_to(hints[field.name])
        _add_ray_serve_flag(parser, field.name, convert, field.default, field.metadata["help"])


def _folder_or_url(text: str) -> Path | str:
    """A repository argument: a URL in object storage as it is, else a folder's path."""
    return text if is_store_url(text) else Path(text)


def _text_to(annotation: object) -> Callable[[str], object]:
    """How a flag's text becomes a value of ``annotation`` (bool, int, float, or text)."""
    kinds = set(typing.get_args(annotation)) or {annotation}
    if bool in kinds:
        return _switch
    if int in kinds and str not in kinds:
        return _whole_number
    if float in kinds:
        return float
    return str


def _whole_number(text: str) -> int:
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be a whole number, got {text!r}") from None


def _switch(text: str) -> bool:
    # The words pydantic reads for corral serve's switches from their variables.
    word = text.strip().lower()
    if word in ("true", "t", "yes", "y", "on", "1"):
        return True
    if word in ("false", "f", "no", "n", "off", "0"):
        return False
    raise argparse.ArgumentTypeError(f"must be true or false, got {text!r}")
