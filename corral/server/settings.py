"""The server's settings: one typed class, read from arguments and ``CORRAL_*`` variables.

Every field is an option of ``corral serve``: its flag is ``--<field>`` with dashes and its
environment variable ``CORRAL_<FIELD>``, both generated from the field (``corral.cli.commands``), so
that a flag, its variable and its help cannot drift apart.

The Host's and the Runtime's options are not written here: their fields are made from their
one declaration, :class:`corral.HostOptions`' and :class:`corral.RuntimeOptions`' fields
(:func:`corral._host.options.edge_options`: name, type, default, help), and checked by those
classes. The server reads them as those objects: :meth:`ServerSettings.host_options` and
:meth:`ServerSettings.runtime_options`.

Nothing here is read at import: :class:`ServerSettings` reads the environment when it is built
(``corral serve`` builds it from its arguments, which take precedence over the environment).
"""

from __future__ import annotations

import difflib
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, Literal

from pydantic import (
    Field,
    SecretStr,
    ValidationInfo,
    create_model,
    field_validator,
    model_validator,
)
from pydantic_settings import BaseSettings, NoDecode, SettingsConfigDict

from corral._base import ENV_PREFIX, declared, parse_bytes
from corral._compute import RuntimeOptions
from corral._host import HostOptions, edge_options
from corral._models import is_store_url
from corral.protocol.shm import DEFAULT_MAX_REGIONS
from corral.server.http.origins import SitePolicy
from corral.server.tokens import TokenPolicy, TokenScope, parse_tokens

__all__ = [
    "HOST_OPTIONS_NOT_SERVED",
    "SERVER_DEFAULTS",
    "SIZE_FIELDS",
    "TRITON_POLL_SECS",
    "ServerSettings",
    "unknown_variables",
]

#: HostOptions fields the server keeps at their defaults, and why (from their declaration).
HOST_OPTIONS_NOT_SERVED = {
    option.name: option.not_offered for option in declared(HostOptions) if option.not_offered
}

#: The settings that are sizes: bytes, or text like 64MiB, 2Gi, 2g (``corral._host.budget``'s rules;
#: ``memory_budget`` is checked by HostOptions with the same ones).
SIZE_FIELDS = ("max_request_bytes", "max_body_bytes_in_flight", "max_url_bytes", "max_header_bytes")

#: The seconds between polls under ``--model-control-mode poll`` when none is given: Triton's.
TRITON_POLL_SECS = 15.0

#: Where the server's default differs from the library's: a server follows the machine's
#: memory (a budget of half its cgroup's limit, the memory in use read every second, each
#: model charged what it was measured to cost), where a library Host, inside someone else's
#: program, takes no budget, reads nothing and starts no process unless asked.
SERVER_DEFAULTS: dict[str, object] = {
    "memory_budget": "auto",
    "memory_watch_s": 1.0,
    "measure_charges": True,
}

if TYPE_CHECKING:
    # Made below from the declaration, which a type checker cannot read: the server reads
    # these options through host_options() and runtime_options(), which are typed.
    _HostAndRuntimeOptions = BaseSettings
else:
    _HostAndRuntimeOptions = create_model(
        "_HostAndRuntimeOptions",
        __base__=BaseSettings,
        __module__=__name__,
        **{
            option.name: (
                option.annotation,
                Field(
                    SERVER_DEFAULTS.get(option.name, option.default),
                    description=option.described(),
                ),
            )
            for option in edge_options()
            if option.not_offered is None
        },
    )


class ServerSettings(_HostAndRuntimeOptions):
    """How ``corral serve`` runs; every field also reads ``CORRAL_<FIELD>`` from the environment.

    Example::

        ServerSettings(repository="models/", http_port=8080)   # CORRAL_AUTH_TOKEN also read
    """

    model_config = SettingsConfigDict(env_prefix=ENV_PREFIX, extra="forbid", frozen=True)

    # The Host's and the Runtime's options are _HostAndRuntimeOptions' fields, made from their
    # declaration; these are the server's own.
    repository: Path | str = Field(
        description="the model repository's folder (<name>/<version>/model.onnx or "
        "<name>.onnx), or its URL in object storage: s3://bucket/prefix"
    )
    host: str = Field("127.0.0.1", description="the address both servers bind")
    http_port: int = Field(8000, ge=0, le=65535, description="the HTTP port; 0: any free port")
    grpc_port: int = Field(
        8001, ge=-1, le=65535, description="the gRPC port; 0: any free port; -1: no gRPC server"
    )
    processes: int = Field(
        1,
        ge=1,
        le=64,
        description="server processes behind the HTTP and gRPC ports (SO_REUSEPORT: the "
        "kernel spreads connections over them), each with its own event loop, Host and share "
        "of the memory budget, compute workers, connection caps and body budget; for tiny "
        "models, whose requests one event loop cannot feed to every core. With more than one: "
        "no --system-shared-memory, no explicit model control or --cache-dir, the repository "
        "API's load and unload answer 501, and /metrics is served per process on "
        "--metrics-port P, P+1, ... only",
    )
    edge: Literal["auto", "native", "python"] = Field(
        "auto",
        description="who owns the sockets: native (corral_edge: HTTP and gRPC parsed in "
        "Rust, plain inference requests handed to Python in groups, the rest forwarded to the "
        "Python edge in this process), python (uvicorn and grpc.aio alone), or auto: native "
        "when corral_edge is installed",
    )
    edge_threads: int = Field(
        1,
        ge=1,
        le=64,
        description="the native edge's threads (sockets, parsing, encoding); Python's own "
        "threads run the models",
    )
    metrics_port: int | None = Field(
        None,
        ge=0,
        le=65535,
        description="serve GET /metrics on this port of its own, without the token, and not "
        "on the HTTP port (Triton's 8002); 0: any free port; none: /metrics on the HTTP port",
    )
    # -- TLS (corral.server.tls) ----------------------------------------------------------
    tls_cert_file: Path | None = Field(
        None,
        description="serve HTTP, gRPC and the metrics port over TLS with this PEM certificate "
        "(its chain after it), with tls_key_file; SIGHUP reads both again (Triton's "
        "--grpc-server-cert; TLS is served by the Python edge)",
    )
    tls_key_file: Path | None = Field(
        None,
        description="the unencrypted PEM private key of tls_cert_file (Triton's --grpc-server-key)",
    )
    tls_client_ca_file: Path | None = Field(
        None,
        description="mTLS: clients must present a certificate signed by a CA of this PEM "
        "bundle, on every port (Triton's --grpc-root-cert with --grpc-use-ssl-mutual)",
    )
    # -- requests, tokens, the drain and the logs --------------------------------------------
    max_request_bytes: int = Field(
        64 * 1024 * 1024,
        gt=0,
        description="largest request body or message: bytes or a size like 64MiB; larger ones "
        "get 413, as do those whose BYTES tensors or shared-memory inputs would pass it decoded",
    )
    max_body_bytes_in_flight: int | None = Field(
        None,
        gt=0,
        description="request bytes read, decoded and run at once, HTTP and gRPC together, as "
        "bytes or a size like 256MiB "
        "(default: 4 x max_request_bytes), held as a body's bytes arrive; a request past it "
        "gets 503 / RESOURCE_EXHAUSTED, at once when its declared length does not fit",
    )
    allowed_hosts: Annotated[tuple[str, ...] | None, NoDecode] = Field(
        None,
        description="the names HTTP requests may call the server by (their Host header, any "
        "port): names or addresses, *.example.com for a domain, * for any; another gets 421, "
        "so that a web page rebound to the server's address cannot read it; repeat the flag "
        "or separate with commas (default: localhost, 127.0.0.1 and [::1] when --host is "
        "loopback, else any name; the health checks answer any name)",
    )
    auth_token: SecretStr | None = Field(
        None,
        description="require Authorization: Bearer <token> on all but the server's health "
        "checks, in every scope not given tokens of its own (--inference-tokens ...)",
    )
    inference_tokens: SecretStr | None = Field(
        None,
        description="the tokens that open inference, separated by commas, or open "
        "(default: --auth-token)",
    )
    metadata_tokens: SecretStr | None = Field(
        None,
        description="the tokens that open server and model metadata, configuration and "
        "readiness, separated by commas, or open (default: --auth-token)",
    )
    model_control_tokens: SecretStr | None = Field(
        None,
        description="the tokens that open the repository index, load and unload, separated "
        "by commas, or open (default: --auth-token)",
    )
    shared_memory_tokens: SecretStr | None = Field(
        None,
        description="the tokens that open the shared-memory registrations, separated by "
        "commas, or open (default: --auth-token)",
    )
    statistics_tokens: SecretStr | None = Field(
        None,
        description="the tokens that open statistics, /metrics on the HTTP port and the "
        "status page's document, separated by commas, or open (default: --auth-token)",
    )
    drain_timeout_s: float = Field(
        30.0, ge=0, description="seconds SIGTERM waits for requests in flight before closing"
    )
    drain_notice_s: float = Field(
        0.0,
        ge=0,
        description="seconds after SIGTERM during which the server still serves every "
        "request but reports itself not ready (HTTP /v2/health/ready 503, gRPC ServerReady "
        "false and health NOT_SERVING), so that load balancers stop sending before the drain "
        "closes connections; the drain timeout follows it",
    )
    log_level: str = Field(
        "info", description="corral's log level: critical, error, warning, info or debug"
    )
    grpc_log_level: str = Field(
        "warning",
        description="the level of grpc's own loggers (its internal chatter stays out of "
        "--log-level debug): critical, error, warning, info or debug",
    )
    log_format: Literal["text", "json"] = Field(
        "text",
        description="how log lines are written: text, or json (one JSON object per line)",
    )
    log_file: str | None = Field(
        None,
        min_length=1,
        description="append the log to this file instead of standard error (Triton's "
        "--log-file); every process of --processes appends to it, a line at a time",
    )
    access_log: bool = Field(
        False,
        description="log one line per HTTP request and gRPC call on the logger corral.access "
        "(method, path, model, version, status, bytes, duration, request id, client)",
    )
    ready_load_timeout_s: float = Field(
        30.0,
        gt=0,
        description="seconds a model readiness request waits for the load it starts of a "
        "model not loaded; past it the answer is not ready and the load goes on",
    )
    server_name: str = Field(
        "corral",
        min_length=1,
        description="the name server metadata reports (GET /v2, ServerMetadata); Triton's "
        "clients that check they talk to Triton expect 'triton'",
    )
    strict: bool = Field(
        False,
        description="refuse to start (exit status 2, before binding any port) when the "
        "repository check finds a problem, any that corral check reports (the model files are "
        "read for it); each problem is logged with its fix",
    )
    # -- Triton's model control ------------------------------------------------------------
    model_control_mode: Literal["none", "poll", "explicit"] | None = Field(
        None,
        description="Triton's model control: none (load on first use, no polling), poll "
        "(also poll every poll_interval_s, default 15) or explicit (serve only the models "
        "loaded through the repository API or load_model)",
    )
    load_model: Annotated[tuple[str, ...], NoDecode] = Field(
        (),
        description="models to load at start, before /v2/health/ready answers ready; "
        "repeat the flag (or separate with commas) for more; * loads every model",
    )
    exit_on_error: bool = Field(
        True,
        description="stop the server (exit status 1) when a model of load_model fails to "
        "load at start, as Triton's --exit-on-error; with false, serve the models that "
        "loaded and log each failure",
    )
    strict_readiness: bool = Field(
        True,
        description="as Triton's --strict-readiness: /v2/health/ready answers ready only "
        "while every model of load_model is loaded (one that failed keeps it 503 until a "
        "load through the repository API succeeds); with false, ready once the loads at "
        "start are done, failed or not",
    )
    # -- the HTTP server's connections (corral.server.connections.edge) ---------------------
    max_url_bytes: int = Field(
        8192,
        gt=0,
        description="longest request URL (path and query): bytes or a size like 8KiB; longer: 414",
    )
    max_header_bytes: int = Field(
        65536,
        gt=0,
        description="longest request head (request line and headers): bytes or a size like "
        "64KiB; longer: 431",
    )
    header_timeout_s: float = Field(
        10.0,
        gt=0,
        description="seconds a request's headers may take to arrive from its first byte; "
        "slower: 408 and the connection closed",
    )
    body_timeout_s: float = Field(
        30.0,
        gt=0,
        description="seconds a request's body may go without a byte arriving; slower: 408, "
        "the connection closed and the bytes it held of the body budget given back",
    )
    body_min_rate_bytes_s: int = Field(
        1024,
        ge=0,
        description="bytes per second a request's body must keep, measured over each "
        "body_timeout_s from its head (as Apache's mod_reqtimeout MinRate); slower: 408 and "
        "its bytes given back, so a trickled body holds the body budget at most two "
        "body_timeout_s; 0: only silence is cut",
    )
    idle_timeout_s: float = Field(
        5.0,
        gt=0,
        description="seconds an HTTP connection with no request in progress stays open, "
        "a new one included",
    )
    max_connections: int | None = Field(
        None,
        gt=0,
        description="HTTP connections open at once; at the cap an idle one is closed, or "
        "the new one gets 503 (default: the open-file limit less 256 and less the gRPC "
        "connections' cap, at least 64)",
    )
    # -- the gRPC server's connections (corral.server.grpc.limits) --------------------
    grpc_max_connections: int | None = Field(
        None,
        gt=0,
        description="gRPC connections open at once; at the cap the native edge closes the "
        "oldest idle one (GOAWAY) to make room, else (every one busy, or the Python edge) the "
        "new one is closed at once (default: a quarter of the open-file limit less 256, at "
        "least 16)",
    )
    grpc_idle_timeout_s: float = Field(
        60.0,
        gt=0,
        description="seconds a gRPC connection with no call in progress stays open; then "
        "GOAWAY, and a client's channel reconnects on its next call",
    )
    grpc_handshake_timeout_s: float = Field(
        10.0,
        gt=0,
        description="seconds a new gRPC connection may take to send HTTP/2's preface and "
        "settings; slower: closed",
    )
    grpc_keepalive_time_s: float = Field(
        60.0,
        gt=0,
        description="seconds without traffic after which the server pings a gRPC connection",
    )
    grpc_keepalive_timeout_s: float = Field(
        20.0,
        gt=0,
        description="seconds a gRPC client has to answer the server's ping; then the "
        "connection is closed",
    )
    grpc_min_ping_interval_s: float = Field(
        10.0,
        gt=0,
        description="the shortest interval between a gRPC client's pings; a client pinging "
        "more often is sent GOAWAY (ENHANCE_YOUR_CALM) after two",
    )
    grpc_max_concurrent_streams: int | None = Field(
        None,
        gt=0,
        description="gRPC calls one connection may have open at once (default: no cap, as "
        "Triton; a cap refuses the streams of a burst sent before the client read it)",
    )
    grpc_max_health_watches: int = Field(
        1000,
        gt=0,
        description="gRPC health Watch streams open at once, all connections together; "
        "one more gets RESOURCE_EXHAUSTED",
    )
    # -- Triton's system shared memory extension (corral.protocol.shm) ------------------
    system_shared_memory: bool = Field(
        False,
        description="let clients register POSIX shared-memory regions (/dev/shm) and send "
        "tensors through them (Triton's --allow-client-shm); only for clients trusted with "
        "this user's shared memory",
    )
    max_shared_memory_regions: int = Field(
        DEFAULT_MAX_REGIONS,
        gt=0,
        description="system shared-memory regions registered at once; more are refused",
    )
    # -- Triton's response cache (corral.protocol.response_cache) -------------------------
    cache_config: str | None = Field(
        None,
        description="Triton's response cache: local,size=<bytes> (or a size like 64MiB) keeps "
        "the answers of the models whose config enables it (config.pbtxt's response_cache { "
        "enable: true }, model.toml's response_cache = true) in one cache of that many bytes "
        "(divided among --processes), least recently used dropped first; local is the only "
        "cache. Without it, no answer is cached",
    )
    response_cache_byte_size: int | None = Field(
        None,
        ge=0,
        description="Triton's older spelling of --cache-config local,size=N (0: no cache); "
        "not with --cache-config",
    )
    # -- tracing (corral.server.observe.tracing; the otel extra) ----------------------------------
    trace_exporter: Literal["none", "otlp", "console"] = Field(
        "none",
        description="trace inference requests, model runs and loads with OpenTelemetry "
        "(the otel extra), honouring the caller's W3C traceparent: otlp sends "
        "spans by OTLP over HTTP (OTEL_EXPORTER_OTLP_ENDPOINT, default "
        "http://localhost:4318), console writes them to stdout; none: off",
    )

    @field_validator("auth_token")
    @classmethod
    def _usable_token(cls, value: SecretStr | None) -> SecretStr | None:
        # An empty token would turn auth "on" and let "Authorization: Bearer " in; spaces at
        # either end can never match, since HTTP strips them from header values.
        if value is not None:
            token = value.get_secret_value()
            if not token or token != token.strip():
                raise ValueError(
                    "auth_token must be a non-empty token without spaces at either end; "
                    "leave the option out to serve without a token"
                )
        return value

    @field_validator(*(scope.option for scope in TokenScope))
    @classmethod
    def _usable_tokens(cls, value: SecretStr | None, info: ValidationInfo) -> SecretStr | None:
        if value is not None:
            parse_tokens(value.get_secret_value(), str(info.field_name))
        return value

    def token_policy(self) -> TokenPolicy:
        """Which tokens open which scope (:mod:`corral.server.tokens`)."""
        scoped: dict[TokenScope, tuple[str, ...] | None] = {}
        for scope in TokenScope:
            given: SecretStr | None = getattr(self, scope.option)
            if given is not None:
                scoped[scope] = parse_tokens(given.get_secret_value(), scope.option)
        token = self.auth_token
        return TokenPolicy.build(None if token is None else token.get_secret_value(), scoped)

    @field_validator("repository", mode="before")
    @classmethod
    def _folder_or_url(cls, value: object) -> object:
        # A URL stays text (a Path would fold its "//"); anything else is a folder's path.
        if isinstance(value, str) and is_store_url(value):
            return value
        return Path(value) if isinstance(value, str) else value

    @field_validator(*SIZE_FIELDS, mode="before")
    @classmethod
    def _size(cls, value: object, info: ValidationInfo) -> object:
        # Sizes as memory_budget takes them (2GiB, 2Gi, 2g ...), through the same rules; the
        # error names the field, which the command line turns into its flag and variable.
        if isinstance(value, str | bool):  # a bool is no size, though pydantic reads it as 1
            return parse_bytes(value, option=str(info.field_name))
        return value  # None, or a number the field's own bounds check

    @field_validator("cache_config")
    @classmethod
    def _local_cache(cls, value: str | None) -> str | None:
        # Triton's form, <cache>,<key>=<value>: the local cache and its size only. Kept as
        # local,size=<bytes>, which response_cache_bytes() reads.
        if value is None:
            return None
        cache, _, setting = value.partition(",")
        key, _, size = setting.partition("=")
        if cache.strip() != "local":
            raise ValueError(
                f"cache_config {value!r}: corral's only response cache is local "
                "(local,size=<bytes>); Triton's redis and custom caches are not served"
            )
        if key.strip() != "size" or not size.strip():
            raise ValueError(
                f"cache_config {value!r} must be local,size=<bytes>: size is the local "
                "cache's one setting"
            )
        text = size.strip()
        number = parse_bytes(int(text) if text.isdigit() else text, option="cache_config")
        return f"local,size={number}"

    @field_validator("log_level", "grpc_log_level")
    @classmethod
    def _known_level(cls, value: str, info: ValidationInfo) -> str:
        levels = ("critical", "error", "warning", "info", "debug")
        if value.lower() not in levels:
            raise ValueError(f"{info.field_name} must be one of {', '.join(levels)}, got {value!r}")
        return value.lower()

    @field_validator("load_model", mode="before")
    @classmethod
    def _model_names(cls, value: object) -> object:
        # One name, names separated by commas (the variable), or a list of them (the flags).
        texts = [value] if isinstance(value, str) else value
        if isinstance(texts, (list, tuple)):
            names = [n.strip() for text in texts for n in str(text).split(",") if n.strip()]
            if "*" in names and len(names) > 1:
                raise ValueError("load_model '*' loads every model: name no other with it")
            return tuple(names)
        return value

    @field_validator("allowed_hosts", mode="before")
    @classmethod
    def _host_names(cls, value: object) -> object:
        # As load_model: one name, names separated by commas, or a list of them.
        texts = [value] if isinstance(value, str) else value
        if isinstance(texts, (list, tuple)):
            names = tuple(n.strip() for text in texts for n in str(text).split(",") if n.strip())
            if not names:
                raise ValueError("allowed_hosts names no host: give names, or * for any")
            SitePolicy(names)  # a ValueError naming an entry that is no host name
            return names
        return value

    @model_validator(mode="before")
    @classmethod
    def _poll_mode_polls(cls, given: Any) -> Any:
        # Triton polls every 15 s in poll mode unless told otherwise; the other modes never
        # poll, so a poll interval with them would be a setting not honoured as Triton's.
        if not isinstance(given, dict):
            return given
        mode = given.get("model_control_mode")
        interval = given.get("poll_interval_s")
        if mode == "poll" and interval is None:
            return {**given, "poll_interval_s": TRITON_POLL_SECS}
        if mode in ("none", "explicit") and interval is not None:
            raise ValueError(
                f"model_control_mode {mode} does not poll the repository, but a poll interval "
                f"({interval}) is given: use model_control_mode poll, or leave the interval out"
            )
        return given

    @model_validator(mode="after")
    def _options_hold(self) -> ServerSettings:
        self.host_options()  # each raises InvalidOption naming the option
        self.runtime_options()
        return self

    @model_validator(mode="after")
    def _tls_files_together(self) -> ServerSettings:
        # A key without its certificate (or a CA without either) would serve plain text.
        if (self.tls_cert_file is None) != (self.tls_key_file is None):
            given, missing = (
                ("tls_cert_file", "tls_key_file")
                if self.tls_key_file is None
                else ("tls_key_file", "tls_cert_file")
            )
            raise ValueError(f"{given} is given without {missing}: TLS needs both")
        if self.tls_client_ca_file is not None and self.tls_cert_file is None:
            raise ValueError(
                "tls_client_ca_file is given without tls_cert_file and tls_key_file: "
                "client certificates are checked only over TLS"
            )
        return self

    @model_validator(mode="after")
    def _one_cache_spelling(self) -> ServerSettings:
        # As Triton: the two spellings of the cache's size are incompatible together.
        if self.cache_config is not None and self.response_cache_byte_size is not None:
            raise ValueError(
                "response_cache_byte_size and cache_config are both given: give one "
                "(--cache-config local,size=N is the current spelling)"
            )
        return self

    def response_cache_bytes(self) -> int:
        """The response cache's size in bytes (``cache_config``'s, or Triton's older flag's).

        0: the server has no response cache.
        """
        if self.cache_config is not None:
            return int(self.cache_config.rpartition("=")[2])
        return self.response_cache_byte_size or 0

    @model_validator(mode="after")
    def _metrics_port_is_its_own(self) -> ServerSettings:
        # Two servers cannot bind one port: refused here, by name, not as a bind error.
        port = self.metrics_port
        if port and port in (self.http_port, self.grpc_port):
            other = "http_port" if port == self.http_port else "grpc_port"
            raise ValueError(f"metrics_port ({port}) must differ from {other} ({port})")
        return self

    @model_validator(mode="after")
    def _one_process_only(self) -> ServerSettings:
        # What lives in one process and cannot be split over several: refused, by name.
        if self.processes == 1:
            return self
        if not sys.platform.startswith("linux"):
            # Elsewhere (macOS, the BSDs) sockets sharing a port do not share its connections.
            raise ValueError(
                f"--processes {self.processes} needs Linux, whose SO_REUSEPORT spreads the "
                f"connections over the processes; on {sys.platform} one would take them all"
            )
        alone = {
            "--system-shared-memory": (
                self.system_shared_memory,
                "a region registered on one connection would exist in one process only, and "
                "a request on another connection reaching another would not find it",
            ),
            "--model-control-mode explicit": (
                self.model_control_mode == "explicit",
                "a model loaded through the repository API would be loaded in one process "
                "only, and served on some connections and not on others",
            ),
            "--cache-dir": (
                self.host_options().cache_dir is not None,
                "a cache folder belongs to one process (each claims it); leave it out and "
                "each process fetches into a temporary folder of its own",
            ),
        }
        refused = [f"{flag}: {why}" for flag, (given, why) in alone.items() if given]
        if refused:
            raise ValueError(
                f"--processes {self.processes} cannot be given with " + "; ".join(refused)
            )
        # What is divided among the processes must still serve (corral.server.processes).
        given = self.max_body_bytes_in_flight
        if given is not None and given // self.processes < self.max_request_bytes:
            raise ValueError(
                f"--max-body-bytes-in-flight {given} divided among --processes "
                f"{self.processes} is {given // self.processes} bytes a process, less than "
                f"--max-request-bytes {self.max_request_bytes}: the largest request allowed "
                "could never run"
            )
        last = (self.metrics_port or 0) + self.processes - 1
        if self.metrics_port and (
            last > 65535
            or {self.http_port, self.grpc_port} & set(range(self.metrics_port, last + 1))
        ):
            raise ValueError(
                f"--metrics-port {self.metrics_port} with --processes {self.processes} takes "
                f"ports {self.metrics_port} to {last}, which must be below 65536 and not "
                "--http-port or --grpc-port"
            )
        return self

    @model_validator(mode="after")
    def _largest_request_fits_the_body_budget(self) -> ServerSettings:
        budget = self.max_body_bytes_in_flight
        if budget is not None and budget < self.max_request_bytes:
            raise ValueError(
                f"max_body_bytes_in_flight ({budget}) must be at least max_request_bytes "
                f"({self.max_request_bytes}), or the largest request allowed could never run"
            )
        return self

    def body_budget_bytes(self) -> int:
        """The request bytes held at once: ``max_body_bytes_in_flight`` or its default."""
        if self.max_body_bytes_in_flight is not None:
            return self.max_body_bytes_in_flight
        return 4 * self.max_request_bytes

    def site_policy(self) -> SitePolicy:
        """The ``Host`` names the HTTP and metrics ports answer: ``allowed_hosts`` or default."""
        return SitePolicy.for_address(self.host, self.allowed_hosts)

    def host_options(self) -> HostOptions:
        """The options of the server's Host: its fields of the same names."""
        return HostOptions.taken_from(self)

    def runtime_options(self) -> RuntimeOptions:
        """The options of the server's Runtime: its fields of the same names."""
        return RuntimeOptions.taken_from(self)

    def logging_options(self) -> dict[str, Any]:
        """``configure_logging``'s keywords (``corral.server.observe.logs``) as these say."""
        return {
            "level": self.log_level,
            "log_format": self.log_format,
            "grpc_level": self.grpc_log_level,
            "access_log": self.access_log,
            "file": self.log_file,
        }

    @classmethod
    def variable(cls, field: str) -> str:
        """The environment variable that sets ``field``."""
        return f"{ENV_PREFIX}{field.upper()}"


def unknown_variables(environ: Mapping[str, str]) -> list[str]:
    """A line for every ``CORRAL_*`` variable that names no setting, with the nearest one.

    Reported, not refused: Kubernetes sets ``<SERVICE>_PORT``-style variables for every
    service in a namespace, so a service named "corral" brings variables of its own.
    """
    known = [ServerSettings.variable(name) for name in ServerSettings.model_fields]
    lines = []
    for variable in sorted(environ):
        if not variable.startswith(ENV_PREFIX) or variable in known:
            continue
        nearest = difflib.get_close_matches(variable, known, n=1)
        hint = f"; did you mean {nearest[0]}?" if nearest else ""
        lines.append(f"{variable} names no setting of corral serve and is not used{hint}")
    return lines
