"""Every uvicorn name corral's HTTP edge uses, and what for: the adapter's contract, and its check.

``corral/server/connections/`` is the one folder that touches uvicorn; what it touches of
uvicorn's classes beyond their documented arguments is listed here, one :class:`Internals`
per class or module and kind of name. :func:`check_uvicorn` checks the list against the
installed uvicorn before a server starts, and
``tests/server/connections/test_uvicorn_adapter.py`` checks it (instances' attributes too) in
the test run. uvicorn is imported only by the check, when it runs.

Whether the coupling pays, measured over sockets (``make bench-edge``: wrk, 16 connections, the
tree model, 6 alternating rounds, 2026-12-02): the same ``corral serve`` on uvicorn's plain
httptools protocol answered 0.78x the requests/s of corral's subclass with JSON bodies and
0.82x with binary ones (12.1k and 11.3k against 15.6k and 13.7k); with corral's protocol but
every request through ASGI, 0.77x and 0.79x. So the direct route is what the subclass buys,
about a quarter more requests/s on a tiny model, and the limits themselves cost nothing
measurable.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["UVICORN_INTERNALS", "Internals", "UvicornChanged", "check_uvicorn"]


@dataclass(frozen=True)
class Internals:
    """Names of one class or module of uvicorn's that corral's edge uses, and what for."""

    #: The class or module they belong to, dotted from ``uvicorn``.
    owner: str
    #: ``method`` (looked up on the class), ``attribute`` (set on an instance by uvicorn),
    #: ``parameter`` (of the owner's constructor), ``constant`` (of the module).
    kind: str
    use: str
    names: tuple[str, ...]


_PROTOCOL = "uvicorn.protocols.http.httptools_impl.HttpToolsProtocol"
_CYCLE = "uvicorn.protocols.http.httptools_impl.RequestResponseCycle"
_FLOW = "uvicorn.protocols.http.flow_control.FlowControl"
_SERVER = "uvicorn.server.Server"
_CONFIG = "uvicorn.config.Config"

#: Every uvicorn name corral uses beyond ``uvicorn.Config``'s and ``uvicorn.Server``'s
#: documented arguments; ``tests/server/connections/test_uvicorn_adapter.py`` checks each on the
#: installed uvicorn.
UVICORN_INTERNALS: tuple[Internals, ...] = (
    Internals(
        _PROTOCOL,
        "method",
        "EdgeProtocol extends these callbacks (limits, timers, the direct route)",
        (
            *("__init__", "connection_made", "connection_lost", "data_received", "shutdown"),
            *("on_message_begin", "on_headers_complete", "on_body", "on_message_complete"),
            *("on_response_complete", "timeout_keep_alive_handler"),
            *("_unset_keepalive_if_required", "_get_upgrade"),
        ),
    ),
    Internals(
        _PROTOCOL,
        "attribute",
        "EdgeProtocol reads or sets the connection's state",
        (
            *("app", "loop", "config", "server_state", "connections", "tasks", "parser"),
            *("cycle", "pipeline", "flow", "logger", "access_logger", "timeout_keep_alive"),
            *("timeout_keep_alive_task", "transport", "url", "headers", "scope"),
        ),
    ),
    Internals(
        _CYCLE,
        "parameter",
        "the direct route makes a request's cycle as uvicorn does",
        (
            *("scope", "transport", "flow", "logger", "access_logger", "access_log"),
            *("default_headers", "message_event", "expect_100_continue", "keep_alive"),
            "on_response",
        ),
    ),
    Internals(
        _CYCLE,
        "attribute",
        "the direct route writes a response and ends its cycle as uvicorn's send does",
        (
            *("scope", "flow", "keep_alive", "more_body", "response_started"),
            *("response_complete", "disconnected", "default_headers", "message_event"),
            "on_response",
        ),
    ),
    Internals(
        _FLOW,
        "attribute",
        "a direct response waits for a paused writer; a paused reader stops no body's clock",
        ("write_paused", "read_paused"),
    ),
    Internals(
        _FLOW, "method", "direct responses wait; refusals stop reads", ("drain", "pause_reading")
    ),
    Internals(
        "uvicorn.protocols.http.httptools_impl",
        "constant",
        "the direct route and refusals write uvicorn's status lines",
        ("STATUS_LINE",),
    ),
    Internals(
        "uvicorn.server.ServerState",
        "attribute",
        "the connection cap and the drain walk the open connections and tasks",
        ("connections", "tasks", "default_headers"),
    ),
    Internals(_SERVER, "method", "EdgeServer runs uvicorn's server", ("capture_signals", "serve")),
    Internals(
        _CONFIG,
        "method",
        "EdgeServer loads a Config itself to give it corral's reloaded TLS context",
        ("load",),
    ),
    Internals(
        _CONFIG,
        "attribute",
        "EdgeServer sets the context uvicorn's server listens with (TLS)",
        ("ssl", "loaded"),
    ),
    Internals(
        _SERVER,
        "attribute",
        "EdgeServer waits for its start, reads its port, stops and drains it",
        ("should_exit", "started", "servers", "server_state", "config"),
    ),
)


class UvicornChanged(RuntimeError):
    """The installed uvicorn lacks a name corral's HTTP server uses (:data:`UVICORN_INTERNALS`)."""


def check_uvicorn() -> None:
    """Raise :class:`UvicornChanged` naming what is missing if uvicorn's classes changed.

    Checks what can be seen without an instance (methods, constructor parameters,
    constants); the test checks the instances' attributes too. Cheap: once per server.
    """
    import importlib
    import inspect

    import uvicorn

    missing = []
    for internals in UVICORN_INTERNALS:
        module_name, _, attribute = internals.owner.rpartition(".")
        if internals.kind == "constant":
            owner: object = importlib.import_module(internals.owner)
        else:
            owner = getattr(importlib.import_module(module_name), attribute, None)
        if owner is None:
            missing.append(f"{internals.owner} ({internals.use})")
            continue
        for name in internals.names:
            if internals.kind in ("method", "constant") and not hasattr(owner, name):
                missing.append(f"{internals.owner}.{name} ({internals.use})")
            elif internals.kind == "parameter":
                assert isinstance(owner, type)
                if name not in inspect.signature(owner).parameters:
                    missing.append(f"{internals.owner}({name}=...) ({internals.use})")
    if missing:
        raise UvicornChanged(
            f"uvicorn {uvicorn.__version__} lacks what corral's HTTP server uses: "
            + "; ".join(missing)
            + ". Install the uvicorn version pyproject.toml allows."
        )
