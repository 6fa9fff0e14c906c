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

The command line is an edge: it alone draws progress bars (with rich, from the ``cli``
extra) and prints; the demo it runs lives in :mod:`corral.demo` and reports progress through
plain callbacks. Progress goes to stderr, results to stdout, so ``--json`` output can be
piped. The benchmarks are scripts in the repository's ``benchmarks/``, not commands.
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib.util
import json
import sys
import typing
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from corral._errors import CorralError
from corral.cli_status import add_status_command, run_status

if TYPE_CHECKING:
    from rich.progress import Progress, TaskID
    from rich.table import Table

    from corral._host import Host
    from corral._problems import Problem
    from corral._status import HostStats, ModelStatus
    from corral.demo import DemoResult, DemoStep

__all__ = [
    "RAY_SERVE_OPTIONS",
    "main",
    "positive_int",
    "progress_bar",
    "ratio",
    "ray_serve_variables",
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
    args = _parser(command).parse_args(given)
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


def _parser(command: str | None = None) -> argparse.ArgumentParser:
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
    serve.set_defaults(handler=_serve)

    ray_serve = commands.add_parser(
        "ray-serve",
        help="serve a model repository on Ray Serve: replicas routed to by model",
        description=(
            "Deploy corral on Ray Serve: a v2 HTTP ingress and REPLICAS model replicas, each "
            "with its own Host and memory budget; Ray routes each model to a replica that has "
            "it. Without --address, starts a local Ray node on 127.0.0.1 (no dashboard, no "
            "usage report). SIGTERM or SIGINT removes the application (and the local node) "
            "and exits 0. The repository must be readable at the same path on every node. "
            "Every option --NAME can also be set with the environment variable CORRAL_NAME "
            "(dashes as underscores), as each option's help says; options given here win."
        ),
    )
    ray_serve.add_argument("repository", type=Path, help="the repository's root folder")
    if command == "ray-serve":  # the flags import Ray and read CORRAL_*: only when asked for
        for name, convert, default, help_text in RAY_SERVE_OPTIONS:
            _add_ray_serve_flag(ray_serve, name, convert, default, help_text)
        _add_config_flags(ray_serve)
    ray_serve.set_defaults(handler=_ray_serve)

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
    demo.set_defaults(handler=_demo)

    models = commands.add_parser(
        "models",
        help="list a model repository's models; --preload loads them first",
        description=(
            "List the models of a Triton-layout repository with their state, versions and "
            "estimated size. With --preload, load them all first (a progress bar shows it) and "
            "report the ones that fail."
        ),
    )
    models.add_argument("repository", type=Path, help="the repository's root folder")
    models.add_argument("--preload", action="store_true", help="load every model first")
    models.add_argument(
        "--memory-budget",
        type=_size,
        metavar="SIZE",
        help="bytes or a size like 512MiB, 2Gi, 2g (default: none)",
    )
    models.add_argument("--json", action="store_true", help="print the statuses as JSON")
    models.set_defaults(handler=_models)

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
    check.add_argument("repository", type=Path, help="the repository's root folder")
    check.add_argument("--load", action="store_true", help="also load every model, one at a time")
    check.add_argument(
        "--memory-budget",
        metavar="SIZE",
        type=_size,
        help="bytes or a size like 512MiB (default: none)",
    )
    check.add_argument("--json", action="store_true", help="print the problems as JSON")
    check.set_defaults(handler=_check)

    return parser


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

        corral 0.1.0 (onnxruntime 1.24.1, numpy 2.3.5, CPython 3.11.14)
    """
    import platform

    import numpy
    import onnxruntime

    python = f"{platform.python_implementation()} {platform.python_version()}"
    return (
        f"corral {_corral_version()} (onnxruntime {onnxruntime.__version__}, "
        f"numpy {numpy.__version__}, {python})"
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
    """An argparse type: bytes from a size (``corral._budget.parse_bytes``' units)."""
    from corral._budget import parse_bytes

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


# -- corral demo ----------------------------------------------------------------------------


# -- corral serve's flags: one per setting -------------------------------------------------
#
# Made here, not by pydantic-settings' own CLI source. Tried (pydantic-settings 2.16):
# CliSettingsSource(ServerSettings, root_parser=<serve's parser>, cli_kebab_case=True,
# cli_implicit_flags=True) makes the same --kebab-case flags, --x/--no-x switches and a
# repeatable --load-model, takes an optional REPOSITORY (CliPositionalArg) and leaves room for
# Triton's spellings beside them. It does not serve for three reasons: (1) its help is the
# field's description followed by "(default: ...)" and a type as metavar ("{int,null}"), with
# no place for the variable, which each flag's help names (tests/test_serve_flags.py); (2)
# `corral ray-serve`'s options are a frozen dataclass, RayServeConfig (Ray Serve config files
# pass it as plain args), whose flags are converted while parsing so that a malformed
# CORRAL_REPLICAS or --memory-budget 2G is exit status 2 naming it
# (tests/test_ray_serve_flags.py): it would keep a generator of its own, and there would be
# two kinds again; (3) flags parsed before the settings are built let Triton's spellings be
# compared with corral's and refused when they disagree. So one small generator per command,
# both reading the same declarations (corral._declare), is the one place.


def _add_setting_flags(parser: argparse.ArgumentParser) -> None:
    """One flag per ServerSettings field, ``--<field>``, whose help names ``CORRAL_<FIELD>``."""
    try:
        from corral.server.settings import ServerSettings
    except ImportError:
        # _serve says which extra to install, whatever the arguments.
        parser.add_argument("arguments", nargs=argparse.REMAINDER, help=argparse.SUPPRESS)
        return
    for name, field in ServerSettings.model_fields.items():
        variable = ServerSettings.variable(name)
        default = "" if field.default is None else f"; default {field.default}"
        if name == "repository":
            parser.add_argument(
                name, nargs="?", metavar="REPOSITORY", help=f"{field.description} ({variable})"
            )
            continue
        flag = "--" + name.replace("_", "-")
        help_text = f"{field.description} ({variable}{default})"
        if field.annotation is bool:
            parser.add_argument(flag, action=argparse.BooleanOptionalAction, help=help_text)
        elif name == "load_model":  # repeatable, as Triton's
            parser.add_argument(flag, action="append", metavar="NAME", help=help_text)
        else:
            # Values go to ServerSettings as text: it converts and checks them, as it does
            # the environment's.
            parser.add_argument(flag, metavar=name.upper(), help=help_text)
    for spelling, setting in TRITON_SPELLINGS.items():
        parser.add_argument(
            "--" + spelling.replace("_", "-"),
            dest=spelling,
            metavar=setting.upper(),
            help=f"Triton's spelling of {_spelled(setting)}",
        )


#: Triton's spellings of corral serve's options: ``{Triton's option: corral's setting}``.
TRITON_SPELLINGS = {
    "model_repository": "repository",
    "repository_poll_secs": "poll_interval_s",
    "exit_timeout_secs": "drain_timeout_s",
    "allow_client_shm": "system_shared_memory",
}


def _spelled(setting: str) -> str:
    return "REPOSITORY" if setting == "repository" else "--" + setting.replace("_", "-")


def _triton_spellings(args: argparse.Namespace, given: dict[str, Any]) -> str | None:
    """Fold Triton's spellings into ``given``; a problem if both spellings differ."""
    for spelling, setting in TRITON_SPELLINGS.items():
        value = getattr(args, spelling, None)
        if value is None:
            continue
        other = given.get(setting)
        if other is not None and not _same_setting(setting, value, other):
            return (
                f"--{spelling.replace('_', '-')} {value} and {_spelled(setting)} {other} "
                "name the same setting with different values: give one"
            )
        given[setting] = value
    return None


def _same_setting(setting: str, one: str, other: str | bool) -> bool:
    if setting == "repository":
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


def _serve(args: argparse.Namespace) -> int:
    needed = {"uvicorn": "server", "orjson": "server", "prometheus_client": "server"}
    needed |= {"pydantic_settings": "server", "grpc": "grpc"}
    missing = sorted({extra for module, extra in needed.items() if not _installed(module)})
    if missing:
        raise SystemExit(f"corral serve needs: pip install 'corral[{','.join(missing)}]'")
    import logging
    import os

    from pydantic import ValidationError

    from corral.server.app import run
    from corral.server.logs import configure_logging
    from corral.server.settings import ServerSettings, unknown_variables

    given = {name: getattr(args, name, None) for name in ServerSettings.model_fields}
    conflict = _triton_spellings(args, given)
    if conflict is not None:
        print(f"corral serve: error: {conflict}", file=sys.stderr)
        return 2
    try:
        settings = ServerSettings(**{k: v for k, v in given.items() if v is not None})
    except ValidationError as exc:
        print(f"corral serve: error: {_settings_problems(exc)}", file=sys.stderr)
        return 2
    from corral.server.tracing import TracingUnavailable, check_tracing

    try:
        check_tracing(settings.trace_exporter)  # imports OpenTelemetry only when asked for
    except TracingUnavailable as exc:
        print(f"corral serve: error: {exc}", file=sys.stderr)
        return 2
    configure_logging(
        level=settings.log_level,
        log_format=settings.log_format,
        grpc_level=settings.grpc_log_level,
        access_log=settings.access_log,
    )
    for line in unknown_variables(os.environ):
        logging.getLogger("corral.cli").warning("corral serve: %s", line)
    return run(settings)


def _settings_problems(error: Any) -> str:
    """A ValidationError's problems, each named by its flag and its environment variable."""
    problems = []
    for problem in error.errors():
        cause = problem.get("ctx", {}).get("error")
        field = problem["loc"][0] if problem["loc"] else getattr(cause, "option", None)
        message = str(cause) if isinstance(cause, CorralError) else problem["msg"]
        if field is None:
            problems.append(message)
        else:
            flag = "--" + str(field).replace("_", "-")
            problems.append(f"{flag} (CORRAL_{str(field).upper()}): {message}")
    return "; ".join(problems)


def _before_importing_ray(given: list[str]) -> None:
    """Without --address, set what Ray reads at import for a local node (LOCAL_ENVIRONMENT)."""
    probe = argparse.ArgumentParser(add_help=False)
    probe.add_argument("--address")
    if probe.parse_known_args(given)[0].address is None:
        import os

        # corral.ray._launch.LOCAL_ENVIRONMENT, which cannot be imported before Ray is.
        os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")
        os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")


#: ``corral ray-serve``'s options that are not RayServeConfig fields: (name, how its text
#: becomes a value, default, help).
RAY_SERVE_OPTIONS: tuple[tuple[str, Callable[[str], object], object, str], ...] = (
    ("address", str, None, "Ray cluster to join: auto, HOST:PORT or ray://... (default: local)"),
    ("host", str, "127.0.0.1", "HTTP address"),
    ("port", int, 8000, "HTTP port"),
    ("log_level", str, "info", "error, warning, info, debug"),
)


def _add_ray_serve_flag(
    parser: argparse.ArgumentParser,
    name: str,
    convert: Callable[[str], object],
    default: object,
    help_text: str,
) -> None:
    """``--<name>``, defaulting to ``CORRAL_<NAME>`` when set (checked here), else ``default``."""
    import os

    variable = "CORRAL_" + name.upper()
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


def ray_serve_variables() -> list[str]:
    """The ``CORRAL_*`` variables ``corral ray-serve`` reads (needs the ray extra)."""
    from corral.ray._config import RayServeConfig

    names = [option[0] for option in RAY_SERVE_OPTIONS]
    names += [field.name for field in dataclasses.fields(RayServeConfig)]
    return ["CORRAL_" + name.upper() for name in names]


def _add_config_flags(parser: argparse.ArgumentParser) -> None:
    """One flag per RayServeConfig field, ``--<field>``, with the field's help and type."""
    try:
        from corral.ray._config import RayServeConfig
    except ImportError:
        # _ray_serve says which extra to install, whatever the arguments.
        parser.add_argument("arguments", nargs=argparse.REMAINDER, help=argparse.SUPPRESS)
        return

    hints = typing.get_type_hints(RayServeConfig)
    for field in dataclasses.fields(RayServeConfig):
        convert = _size if field.name == "memory_budget" else _text_to(hints[field.name])
        _add_ray_serve_flag(parser, field.name, convert, field.default, field.metadata["help"])


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


def _ray_serve(args: argparse.Namespace) -> int:
    if not (_installed("ray") and _installed("uvicorn") and _installed("orjson")):
        raise SystemExit("corral ray-serve needs: pip install 'corral[ray,server]'")
    import logging

    from corral.ray import RayServeConfig, serve_on_ray

    config = RayServeConfig(
        **{field.name: getattr(args, field.name) for field in dataclasses.fields(RayServeConfig)}
    )
    repository = args.repository.resolve()
    if not repository.is_dir():
        raise ValueError(f"{args.repository} is not a folder")
    logging.basicConfig(
        level=args.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    import difflib
    import os

    known = ray_serve_variables()
    for variable in sorted(v for v in os.environ if v.startswith("CORRAL_") and v not in known):
        # Reported, not refused: Kubernetes sets <SERVICE>_PORT-style variables of its own.
        nearest = difflib.get_close_matches(variable, known, n=1)
        logging.getLogger("corral.cli").warning(
            "corral ray-serve: %s names no option of corral ray-serve and is not used%s",
            variable,
            f"; did you mean {nearest[0]}?" if nearest else "",
        )

    def started(url: str) -> None:
        print(f"corral ray-serve: serving {repository} at {url}", flush=True)

    return serve_on_ray(
        str(repository),
        config,
        address=args.address,
        host=args.host,
        port=args.port,
        started=started,
    )


def _installed(module: str) -> bool:
    return importlib.util.find_spec(module) is not None


def _demo(args: argparse.Namespace) -> int:
    _require_rich()
    from rich.console import Console

    from corral.demo import IDLE_WINDOW_S, WorkerFailed, run_demo

    # corral.demo's ImportErrors (a missing extra) already say what to install.
    try:
        with progress_bar() as progress:
            display = _DemoDisplay(progress, args.models)
            result = run_demo(
                args.models,
                args.threads,
                args.requests,
                folder=args.keep,
                progress=display,
                idle_window_s=args.idle_window_s or IDLE_WINDOW_S,
            )
    except ImportError as exc:
        raise SystemExit(str(exc)) from exc
    except WorkerFailed as exc:
        # Not a CorralError: the demo's own measuring process broke, not a request to corral.
        print(f"corral demo: error: {exc}", file=sys.stderr)
        return 1
    if args.json:
        print(json.dumps(result.to_dict(), indent=2))
    else:
        Console().print(_demo_table(result))
    if args.keep is not None:
        print(f"models kept in {args.keep}", file=sys.stderr)
    return 0


class _DemoDisplay:
    """Draws run_demo's progress: a bar while building, then a line per worker."""

    def __init__(self, progress: Progress, count: int) -> None:
        self._progress = progress
        self._build = progress.add_task(f"building {count} models", total=count)
        self._workers: dict[str, TaskID] = {}

    def __call__(self, step: DemoStep, done: int, total: int) -> None:
        if step == "build":
            self._progress.update(self._build, completed=done)
        elif step not in self._workers:
            # No total: the bar pulses, as the worker reports nothing until it ends.
            self._workers[step] = self._progress.add_task(
                f"{step}: loading and serving in a worker process", total=None
            )
        else:
            self._progress.update(self._workers[step], total=total, completed=done)


def _demo_table(result: DemoResult) -> Table:
    from rich.table import Table

    ours, theirs = result.corral, result.onnxruntime
    table = Table(
        title=(
            f"{result.models:,} models, {result.threads} threads, "
            f"{result.requests:,} batch-1 requests"
        ),
        caption=(
            "corral: every session on onnxruntime's global pools; onnxruntime defaults: "
            f"a thread pool per session. Threads before loading: {ours.threads_before} "
            f"and {theirs.threads_before}.\nonnxruntime's per-session pools spin, which keeps "
            "the cores awake for the Python threads' hand-offs: that buys throughput with many "
            "caller threads, and burns the idle CPU shown in the table."
        ),
    )
    table.add_column("")
    table.add_column("corral", justify="right")
    table.add_column("onnxruntime defaults", justify="right")
    table.add_column("corral / onnxruntime", justify="right")
    rows: list[tuple[str, float, float, str]] = [
        ("threads (after load)", ours.threads_after_load, theirs.threads_after_load, "{:,.0f}"),
        (
            "RSS per session (KiB)",
            ours.rss_per_session / 1024,
            theirs.rss_per_session / 1024,
            "{:,.1f}",
        ),
        ("load time (s)", ours.load_seconds, theirs.load_seconds, "{:,.2f}"),
        ("throughput (runs/s)", ours.throughput, theirs.throughput, "{:,.0f}"),
        ("idle CPU (%)", ours.idle_cpu_percent, theirs.idle_cpu_percent, "{:,.1f}"),
    ]
    for label, corral_value, onnxruntime_value, number in rows:
        table.add_row(
            label,
            number.format(corral_value),
            number.format(onnxruntime_value),
            ratio(corral_value, onnxruntime_value),
        )
    return table


def ratio(numerator: float, denominator: float) -> str:
    """``numerator / denominator`` as ``1.23x``; ``-`` when the denominator is 0.

    >>> ratio(3, 1003)
    '0.003x'
    """
    if denominator == 0:
        return "-"
    value = numerator / denominator
    if value >= 10:
        return f"{value:,.0f}x"
    if value == 0 or value >= 0.1:
        return f"{value:.2f}x"
    # Two significant digits, so that 3 threads against 1,003 does not read as 0.00x.
    return f"{value:.2g}x"


# -- corral models -------------------------------------------------------------------------


def _models(args: argparse.Namespace) -> int:
    _require_rich()
    from rich.console import Console

    import corral

    budget = args.memory_budget
    with corral.Host(args.repository, memory_budget=budget) as host:
        failures: dict[str, corral.CorralError] = {}
        if args.preload:
            names = host.repository.names()
            with progress_bar() as progress:
                task = progress.add_task(f"loading {len(names)} models", total=len(names))

                def on_loaded(done: int, total: int, name: str) -> None:
                    progress.update(task, completed=done, description=f"loaded {name}")

                failures = host.preload(names, progress=on_loaded)
        statuses = host.models()
        stats = host.stats()
    if args.json:
        print(json.dumps([_status_dict(status) for status in statuses], indent=2))
    else:
        Console().print(_models_table(statuses, stats))
    for name, error in sorted(failures.items()):
        print(f"corral models: {name}: {error}", file=sys.stderr)
    return 1 if failures else 0


def _status_dict(status: ModelStatus) -> dict[str, object]:
    return {
        "name": status.name,
        "state": status.state.value,
        "failure": status.failure,
        "versions": [
            {
                "version": v.version,
                "state": v.state.value,
                "size_bytes": v.size_bytes,
                "runs": v.runs,
                "failure": v.failure,
                "batching": v.batching,
            }
            for v in status.versions
        ],
    }


def _models_table(statuses: list[ModelStatus], stats: HostStats) -> Table:
    from rich.table import Table

    budget = "no budget" if stats.memory_budget is None else f"{stats.memory_budget:,} bytes"
    table = Table(
        title=f"{len(statuses):,} models",
        caption=(
            f"{stats.loaded_versions:,} versions loaded, {stats.bytes_used:,} bytes of {budget}"
        ),
    )
    table.add_column("model")
    table.add_column("state")
    table.add_column("versions", justify="right")
    table.add_column("size (KiB)", justify="right")
    table.add_column("why it failed")
    for status in statuses:
        size = sum(v.size_bytes for v in status.versions)
        versions = ", ".join(f"{v.version} {v.state.value}" for v in status.versions) or "-"
        failure = status.failure or next((v.failure for v in status.versions if v.failure), "")
        table.add_row(
            status.name,
            status.state.value,
            versions,
            f"{size / 1024:,.0f}" if size else "-",
            failure or "",
        )
    return table


# -- corral check --------------------------------------------------------------------------


def _status(args: argparse.Namespace) -> int:
    _require_rich()
    return run_status(args)


def _check(args: argparse.Namespace) -> int:
    import corral
    from corral._check import find_problems

    with corral.Host(args.repository, memory_budget=args.memory_budget) as host:
        # find_problems, not Host.check: the problems are printed here, not logged.
        problems, _ = find_problems(
            host.repository,
            memory_budget=host.options.budget_bytes,
            pool_size=host.runtime.options.compute_workers,
            read_model_files=True,
        )
        loaded: list[dict[str, object]] = []
        if args.load:
            _require_rich()
            problems += _load_each(host, problems, loaded)
    if args.json:
        print(json.dumps({"problems": [_problem_dict(p) for p in problems], "loaded": loaded}))
    else:
        for problem in problems:
            print(
                f"{problem.kind.value}: {problem.path}\n  {problem.message}\n  fix: {problem.fix}"
            )
        for row in loaded:
            print(
                f"loaded {row['model']} version {row['version']}: {row['size_bytes']:,} bytes "
                f"(estimated), {row['load_seconds']:.3f} s"
            )
        count = len(problems)
        verdict = "no problems" if not count else f"{count} problem{'s' * (count != 1)}"
        print(f"corral check: {args.repository}: {verdict}", file=sys.stderr)
    return 1 if problems else 0


def _load_each(
    host: Host, problems: list[Problem], loaded: list[dict[str, object]]
) -> list[Problem]:
    """Load every model the check found no blocker in, one at a time, each then unloaded.

    Appends each load's version, estimated size and time to ``loaded``; returns the failures.
    """
    import time

    from corral._problems import Problem, ProblemKind

    blocked = {p.model for p in problems if p.kind is not ProblemKind.NO_MODEL_FILE}
    names = [name for name in host.repository.names() if name not in blocked]
    failures: list[Problem] = []
    with progress_bar() as progress:
        task = progress.add_task(f"loading {len(names)} models", total=len(names))
        for name in names:
            progress.update(task, description=f"loading {name}")
            began = time.perf_counter()
            try:
                host.load(name)
            except CorralError as exc:
                failures.append(
                    Problem(
                        ProblemKind.LOAD_FAILED,
                        name,
                        str(host.repository.root / name),
                        f"model {name!r} failed to load: {exc}",
                        "fix what the error names (the model file, or what its settings declare)",
                    )
                )
            else:
                seconds = time.perf_counter() - began
                for version in host.status(name).versions:
                    if version.size_bytes:
                        loaded.append(
                            {
                                "model": name,
                                "version": version.version,
                                "size_bytes": version.size_bytes,
                                "load_seconds": round(seconds, 6),
                            }
                        )
                host.unload(name)  # one model's memory at a time
            progress.advance(task)
    return failures


def _problem_dict(problem: Problem) -> dict[str, object]:
    return {
        "kind": problem.kind.value,
        "model": problem.model,
        "path": problem.path,
        "message": problem.message,
        "fix": problem.fix,
    }


# -- shared ---------------------------------------------------------------------------------


def _require_rich() -> None:
    if importlib.util.find_spec("rich") is None:
        raise SystemExit("corral's command line needs rich: pip install 'corral[cli]'")


def progress_bar() -> Progress:
    """A rich progress display on stderr, so that stdout carries only the results."""
    from rich.console import Console
    from rich.progress import (
        BarColumn,
        Progress,
        SpinnerColumn,
        TaskProgressColumn,
        TextColumn,
        TimeElapsedColumn,
    )

    return Progress(
        SpinnerColumn(finished_text="[green]done"),
        TextColumn("{task.description}"),
        BarColumn(),
        TaskProgressColumn(),
        TimeElapsedColumn(),
        console=Console(stderr=True),
    )


if __name__ == "__main__":
    sys.exit(main())
