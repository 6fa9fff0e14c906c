"""Triton's command line: every ``tritonserver`` flag ``corral serve`` takes, and what it does.

A ``tritonserver`` command line carries over to ``corral serve``, flag by flag, in one of
three ways (DESIGN.md: "what Triton accepts, corral accepts"):

- **honoured**: the flag sets the corral setting of the same meaning. Spellings of a setting
  corral has under another name are :data:`corral.cli.serve.TRITON_SPELLINGS`; the flags
  whose value needs converting (milliseconds, Triton's log switches, its addresses, its
  ``--backend-config``) are folded here by :func:`fold_triton_flags`; ``--exit-on-error``,
  ``--strict-readiness``, ``--http-port``, ``--grpc-port`` and ``--metrics-port`` are corral's
  own settings under Triton's names.
- **accepted and named**: a flag that changes nothing here (:data:`NO_EFFECT`, with why) is
  taken, and named once in the log at start, never silently.
- **refused** (exit status 2, before anything starts), saying what to change: only a value
  that would make corral answer differently from Triton (``--allow-http=false``,
  ``--strict-model-config=true``, ``--http-restricted-api`` ...).

The table in docs/server.md ("Triton's command line") lists each flag with its way; a test
reads that table against these ones.
"""

from __future__ import annotations

import argparse
from typing import Any

__all__ = [
    "NO_EFFECT",
    "TRITON_FLAGS",
    "add_triton_flags",
    "fold_triton_flags",
    "switch_value",
]

#: Triton's flags that change nothing in corral: ``{flag: why}``. Accepted (any value, as
#: often as given) and each named once in the log at start.
NO_EFFECT: dict[str, str] = {
    "http_thread_count": "corral's HTTP requests are read by its edge (--edge-threads) and "
    "run by its compute workers (--compute-workers), sized otherwise",
    "grpc_infer_allocation_pool_size": "corral keeps no pool of gRPC request objects",
    "reuse_http_port": "corral binds its ports for itself; --processes N serves one port "
    "from N processes",
    "reuse_grpc_port": "corral binds its ports for itself; --processes N serves one port "
    "from N processes",
    "http_header_forward_pattern": "onnxruntime models read no request parameters, so no "
    "header is forwarded as one",
    "grpc_header_forward_pattern": "onnxruntime models read no request parameters, so no "
    "header is forwarded as one",
    "grpc_infer_response_compression_level": "corral compresses a gRPC answer when the "
    "client asks for it (its compression_algorithm)",
    "grpc_keepalive_permit_without_calls": "corral's keepalive pings (--grpc-keepalive-time-s) "
    "go to every connection, calls in flight or not",
    "grpc_http2_max_pings_without_data": "corral's server pings only on --grpc-keepalive-time-s",
    "grpc_http2_max_ping_strikes": "corral sends GOAWAY after two pings closer than "
    "--grpc-min-ping-interval-s (Triton's default is 2 too)",
    "grpc_max_connection_age": "corral closes gRPC connections when idle "
    "(--grpc-idle-timeout-s), not by age",
    "grpc_max_connection_age_grace": "corral closes gRPC connections when idle "
    "(--grpc-idle-timeout-s), not by age",
    "allow_gpu_metrics": "corral reports no GPU metrics",
    "allow_cpu_metrics": "corral's /metrics always has its process's CPU and memory",
    "metrics_interval_ms": "corral's metrics are computed when /metrics is read",
    "metrics_config": "corral's metrics have one form (histograms: --model-latency-histograms)",
    "trace_config": "corral traces with OpenTelemetry: --trace-exporter otlp or console",
    "trace_file": "corral traces with OpenTelemetry: --trace-exporter otlp or console",
    "trace_level": "corral traces with OpenTelemetry: --trace-exporter otlp or console",
    "trace_rate": "corral traces with OpenTelemetry: --trace-exporter otlp or console",
    "trace_count": "corral traces with OpenTelemetry: --trace-exporter otlp or console",
    "trace_log_frequency": "corral traces with OpenTelemetry: --trace-exporter otlp or console",
    "rate_limit": "corral has no rate limiter: its compute workers take requests as they "
    "come (--max-queue-per-model bounds a model's queue)",
    "rate_limit_resource": "corral has no rate limiter",
    "pinned_memory_pool_byte_size": "corral allocates no pinned memory of its own",
    "cuda_memory_pool_byte_size": "corral allocates no CUDA memory of its own (onnxruntime's "
    "providers do, by a model's config)",
    "cuda_virtual_address_size": "corral allocates no CUDA memory of its own",
    "min_supported_compute_capability": "corral leaves devices to onnxruntime's providers",
    "model_load_gpu_limit": "corral bounds models by --memory-budget, not by GPU memory",
    "buffer_manager_thread_count": "corral copies tensors on the thread that decodes them",
    "host_policy": "corral pins no thread to a NUMA node or core",
    "backend_directory": "corral's one backend, onnxruntime, is built in",
    "repoagent_directory": "corral runs no repository agents",
    "model_load_retry_count": "corral does not retry a failed load at once: the model's next "
    "request or load tries again, after a back-off",
    "model_namespacing": "corral serves one repository, whose model names cannot clash",
    # Settings of endpoints corral does not serve (--allow-sagemaker=true and
    # --allow-vertex-ai=true are refused): without the endpoint, Triton does not read them.
    "sagemaker_port": "corral has no SageMaker endpoint",
    "sagemaker_safe_port_range": "corral has no SageMaker endpoint",
    "sagemaker_thread_count": "corral has no SageMaker endpoint",
    "vertex_ai_port": "corral has no Vertex AI endpoint",
    "vertex_ai_thread_count": "corral has no Vertex AI endpoint",
    "vertex_ai_default_model": "corral has no Vertex AI endpoint",
}

#: Triton's switches read here (``--flag=true|false``, also 1, 0, on, off, as Triton reads
#: them); ``--exit-on-error`` and ``--strict-readiness`` are corral's own settings.
_SWITCHES = (
    "strict_model_config",
    "allow_http",
    "allow_grpc",
    "allow_metrics",
    "allow_sagemaker",
    "allow_vertex_ai",
    "log_info",
    "log_warning",
    "log_error",
)

#: Triton's flags in milliseconds and corral's settings in seconds they set.
_MILLISECONDS = {
    "grpc_keepalive_time": "grpc_keepalive_time_s",
    "grpc_keepalive_timeout": "grpc_keepalive_timeout_s",
    "grpc_http2_min_recv_ping_interval_without_data": "grpc_min_ping_interval_s",
}

#: Triton's flags refused whatever their value, and what to do instead.
_REFUSED = {
    "http_restricted_api": "corral restricts its APIs by token, not by a header: give each "
    "scope its tokens (--model-control-tokens, --shared-memory-tokens, --statistics-tokens "
    "...; docs/server.md, Scoped tokens)",
    "grpc_restricted_protocol": "corral restricts its APIs by token, not by a header: give "
    "each scope its tokens (--model-control-tokens, --shared-memory-tokens, "
    "--statistics-tokens ...; docs/server.md, Scoped tokens)",
}

#: Triton's other flags read here, each taking a value.
_VALUES = ("log_verbose", "grpc_address", "metrics_address", *_MILLISECONDS)

#: Every flag this module adds to ``corral serve``'s parser (their ``dest``).
TRITON_FLAGS = frozenset(
    {*NO_EFFECT, *_SWITCHES, *_REFUSED, *_VALUES, "disable_auto_complete_config", "backend_config"}
)

_TRUE = ("true", "on", "1")
_FALSE = ("false", "off", "0")


def switch_value(text: str) -> bool | None:
    """A Triton switch's value: True, False, or None for a word Triton does not take."""
    word = text.strip().lower()
    return True if word in _TRUE else False if word in _FALSE else None


def add_triton_flags(group: argparse._ArgumentGroup) -> None:
    """Add this module's flags (:data:`TRITON_FLAGS`) to ``corral serve``'s parser.

    Those without effect are named together in the group's description, not one by one.
    """
    names = ", ".join("--" + name.replace("_", "-") for name in sorted(NO_EFFECT))
    group.description = (
        f"{group.description}. Accepted, and each named once in the log as having no effect "
        f"here: {names}"
    )
    for name in sorted(TRITON_FLAGS):
        flag = "--" + name.replace("_", "-")
        if name == "disable_auto_complete_config":
            group.add_argument(flag, action="store_true", help="Triton's; refused (as below)")
        elif name == "backend_config":  # repeatable, in Triton's form
            group.add_argument(
                flag,
                action="append",
                metavar="BACKEND,SETTING=VALUE",
                help="Triton's backend settings: onnxruntime's enable-global-threadpool "
                "(--thread-pools global or per_session), intra_op_thread_count and "
                "inter_op_thread_count (with it: --intra-op-threads, --inter-op-threads), "
                "default-max-batch-size (--default-max-batch-size); any other is named once "
                "in the log as having no effect",
            )
        elif name in NO_EFFECT:
            # Repeatable: Triton's --metrics-config, --host-policy ... are. Listed together
            # below rather than one by one, so that --help stays readable.
            group.add_argument(flag, action="append", help=argparse.SUPPRESS)
        elif name in _SWITCHES:
            group.add_argument(flag, metavar="true|false", help=_SWITCH_HELP[name])
        elif name in _REFUSED:
            group.add_argument(flag, metavar="VALUE", help=f"refused: {_REFUSED[name]}")
        else:
            group.add_argument(flag, metavar="VALUE", help=_VALUE_HELP[name])


_SWITCH_HELP = {
    "strict_model_config": "false: honoured (corral completes every model's configuration "
    "from its file); true: refused",
    "allow_http": "true: honoured; false: refused (corral always serves HTTP)",
    "allow_grpc": "false: --grpc-port -1",
    "allow_metrics": "false: no metrics port; true: /metrics (--metrics-port for a port "
    "of its own)",
    "allow_sagemaker": "false: honoured; true: refused (corral has no SageMaker endpoint)",
    "allow_vertex_ai": "false: honoured; true: refused (corral has no Vertex AI endpoint)",
    "log_info": "false: --log-level warning",
    "log_warning": "false (with --log-info=false): --log-level error",
    "log_error": "false (with the others false): --log-level critical",
}

_VALUE_HELP = {
    "log_verbose": "1 or more: --log-level debug; 0: no change",
    "grpc_address": "the same address as --host (--http-address), or refused",
    "metrics_address": "the same address as --host (--http-address), or refused",
    "grpc_keepalive_time": "milliseconds: --grpc-keepalive-time-s",
    "grpc_keepalive_timeout": "milliseconds: --grpc-keepalive-timeout-s",
    "grpc_http2_min_recv_ping_interval_without_data": "milliseconds: --grpc-min-ping-interval-s",
}


def fold_triton_flags(
    args: argparse.Namespace, given: dict[str, Any]
) -> tuple[str | None, list[str]]:
    """Fold this module's flags (and ``--backend-config``) into ``given``, corral's settings.

    Returns a problem (the command line is refused, exit status 2) or None, and the lines
    to log once at start: each flag accepted without effect, named. ``given`` holds the
    settings from corral's own flags, Triton's spellings already folded in.
    """
    notes: list[str] = []
    switches: dict[str, bool] = {}
    for name in _SWITCHES:
        text = getattr(args, name, None)
        if text is None:
            continue
        value = switch_value(text)
        if value is None:
            return f"{_flag(name)}={text}: give true or false (or 1, 0, on, off)", []
        switches[name] = value
    for name, why in _REFUSED.items():
        if getattr(args, name, None) is not None:
            return f"{_flag(name)} is not taken: {why}", []
    for name, why in NO_EFFECT.items():
        for value in getattr(args, name, None) or ():
            notes.append(f"Triton's {_flag(name)}={value} has no effect here: {why}")
    steps = (_model_config, _endpoints, _logging, _addresses, _milliseconds, _backend_config)
    for step in steps:
        problem = step(args, switches, given, notes)
        if problem is not None:
            return problem, []
    return None, notes


def _model_config(
    args: argparse.Namespace, switches: dict[str, bool], given: dict[str, Any], notes: list[str]
) -> str | None:
    # Triton refuses a model without a complete config.pbtxt under these; corral would serve
    # it, completed from its file: an answer Triton would not give.
    refused = (
        "--disable-auto-complete-config"
        if getattr(args, "disable_auto_complete_config", False)
        else "--strict-model-config=true"
        if switches.get("strict_model_config")
        else None
    )
    if refused is None:
        return None
    return (
        f"{refused} is refused: it would refuse models whose config.pbtxt is missing or "
        "incomplete, and corral completes every model's configuration from its model file, "
        "as Triton with --strict-model-config=false; leave it out"
    )


def _endpoints(
    args: argparse.Namespace, switches: dict[str, bool], given: dict[str, Any], notes: list[str]
) -> str | None:
    if switches.get("allow_http") is False:
        return (
            "--allow-http=false is refused: corral always serves HTTP (health, the repository "
            "API and the status page live there); leave it out, and keep the port local with "
            "--host 127.0.0.1 if it must not be reached"
        )
    for endpoint, words in (("allow_sagemaker", "SageMaker"), ("allow_vertex_ai", "Vertex AI")):
        if switches.get(endpoint):
            return f"{_flag(endpoint)}=true is refused: corral has no {words} endpoint"
    if switches.get("allow_grpc") is False:
        given["grpc_port"] = -1  # corral's spelling of "no gRPC server"
    metrics = switches.get("allow_metrics")
    if metrics is False and given.get("metrics_port") is not None:
        return "--allow-metrics=false and --metrics-port are both given: give one"
    if metrics is False:
        notes.append(
            "Triton's --allow-metrics=false: corral serves no metrics port (none without "
            "--metrics-port); GET /metrics on the HTTP port stays, behind --statistics-tokens"
        )
    elif metrics and given.get("metrics_port") is None:
        notes.append(
            "Triton's --allow-metrics=true: corral serves /metrics on the HTTP port; give "
            "--metrics-port 8002 for a port of its own, as Triton's"
        )
    return None


def _logging(
    args: argparse.Namespace, switches: dict[str, bool], given: dict[str, Any], notes: list[str]
) -> str | None:
    level: str | None = None
    text = getattr(args, "log_verbose", None)
    if text is not None:
        verbose = switch_value(text) if text.strip().lower() in ("true", "false") else None
        try:
            count = int(verbose) if verbose is not None else int(text)
        except ValueError:
            return f"--log-verbose {text!r}: give a whole number (0: off, 1 or more: debug)"
        level = "debug" if count > 0 else None
    toggles = [switches.get(name) for name in ("log_info", "log_warning", "log_error")]
    if any(value is False for value in toggles):
        on = [value is not False for value in toggles]
        if on != sorted(on):  # one level, and those above it: what a log level is
            return (
                "--log-info, --log-warning and --log-error turn on a level but not the ones "
                "above it, which corral's one --log-level cannot: turn off the lower ones only"
            )
        level = level or ("info", "warning", "error", "critical")[on.count(False)]
    if level is not None:
        other = given.get("log_level")
        if other is not None and other.lower() != level:
            return f"Triton's log flags mean --log-level {level}, but --log-level {other} is given"
        given["log_level"] = level
    form = given.get("log_format")
    if form in ("default", "ISO8601"):
        # Triton's words for its line formats; corral's lines are its own.
        given["log_format"] = "text"
        notes.append(
            f"Triton's --log-format {form}: corral writes its own text lines (timestamps as "
            "ISO 8601); --log-format json writes JSON"
        )
    return None


def _addresses(
    args: argparse.Namespace, switches: dict[str, bool], given: dict[str, Any], notes: list[str]
) -> str | None:
    host = given.get("host") or "127.0.0.1"
    for name in ("grpc_address", "metrics_address"):
        address = getattr(args, name, None)
        if address is not None and address != host:
            return (
                f"{_flag(name)} {address} differs from --host {host}: corral binds HTTP, gRPC "
                "and metrics to one address (--host, Triton's --http-address); give the same"
            )
    return None


def _milliseconds(
    args: argparse.Namespace, switches: dict[str, bool], given: dict[str, Any], notes: list[str]
) -> str | None:
    for name, setting in _MILLISECONDS.items():
        text = getattr(args, name, None)
        if text is None:
            continue
        try:
            seconds = int(text) / 1000
        except ValueError:
            return f"{_flag(name)} {text!r}: give a whole number of milliseconds"
        other = given.get(setting)
        if other is not None and float(other) != seconds:
            return (
                f"{_flag(name)} {text} ms and {_flag(setting)} {other} s name the same "
                "setting with different values: give one"
            )
        given[setting] = seconds
    return None


#: Triton's onnxruntime backend's own settings (its backend config, read once at start) and
#: the corral settings they are: the global pools switch, and their sizes under it.
_ONNXRUNTIME_POOLS = {
    "intra_op_thread_count": "intra_op_threads",
    "inter_op_thread_count": "inter_op_threads",
}


def _backend_config(
    args: argparse.Namespace, switches: dict[str, bool], given: dict[str, Any], notes: list[str]
) -> str | None:
    # Triton's form: <backend>,<setting>=<value>, or <setting>=<value> for every backend.
    texts = getattr(args, "backend_config", None)
    if not texts:
        return None
    onnxruntime: dict[str, str] = {}
    for text in texts:
        head, equals, value = text.partition("=")
        backend, comma, setting = head.rpartition(",") if "," in head else ("", "", head)
        if not equals or not setting or not value or (comma and not backend):
            return (
                f"--backend-config {text!r}: Triton's form is <backend>,<setting>=<value> "
                "(or <setting>=<value> for every backend)"
            )
        if setting == "default-max-batch-size" and backend in ("", "onnxruntime"):
            # The rows of a model whose configuration gives none: Host's option of that name.
            other = given.get("default_max_batch_size")
            if other is not None and str(other).strip() != value.strip():
                return (
                    f"--backend-config {text} and --default-max-batch-size {other} name the "
                    "same setting with different values: give one"
                )
            given["default_max_batch_size"] = value
        elif backend == "onnxruntime":
            onnxruntime[setting] = value
        elif not backend:
            notes.append(
                f"Triton's --backend-config {text} (every backend's) has no effect here: "
                "corral reads no global backend setting but default-max-batch-size"
            )
        else:
            notes.append(
                f"Triton's --backend-config {text} has no effect here: corral serves no "
                f"{backend} models (a model of that backend is refused by name at load)"
            )
    return _onnxruntime_settings(onnxruntime, given, notes)


def _onnxruntime_settings(
    settings: dict[str, str], given: dict[str, Any], notes: list[str]
) -> str | None:
    """Triton's onnxruntime backend settings as corral's: the Runtime's pools and their sizes.

    As the backend reads them: ``enable-global-threadpool`` chooses one pool for every
    session or a pool per session, and the two thread counts size the global pool only
    (without it Triton's backend reads neither). Any other setting the backend does not read.
    """
    global_text = settings.pop("enable-global-threadpool", None)
    global_pools = None if global_text is None else switch_value(global_text)
    if global_text is not None:
        if global_pools is None:
            return (
                f"--backend-config onnxruntime,enable-global-threadpool={global_text}: give "
                "true or false (or 1, 0, on, off)"
            )
        wanted = "global" if global_pools else "per_session"
        other = given.get("thread_pools")
        if other is not None and str(other).strip() != wanted:
            return (
                f"--backend-config onnxruntime,enable-global-threadpool={global_text} and "
                f"--thread-pools {other} disagree: give one"
            )
        given["thread_pools"] = wanted
    for setting, name in _ONNXRUNTIME_POOLS.items():
        value = settings.pop(setting, None)
        if value is None:
            continue
        if not global_pools:
            notes.append(
                f"Triton's --backend-config onnxruntime,{setting}={value} has no effect here: "
                "Triton's backend reads it only with enable-global-threadpool=1 (a model's "
                "own thread counts are its config.pbtxt parameters)"
            )
            continue
        if value.strip() == "0":
            continue  # Triton's 0: the cores, corral's default
        other = given.get(name)
        if other is not None and str(other).strip() != value.strip():
            return (
                f"--backend-config onnxruntime,{setting}={value} and {_flag(name)} {other} "
                "name the same setting with different values: give one"
            )
        given[name] = value
    for setting, value in settings.items():
        notes.append(
            f"Triton's --backend-config onnxruntime,{setting}={value} has no effect here: "
            "Triton's onnxruntime backend reads no such setting at start (a model's session "
            "settings are its config.pbtxt parameters, or its model.toml)"
        )
    return None


def _flag(name: str) -> str:
    return "--" + name.replace("_", "-")
