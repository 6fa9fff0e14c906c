"""``corral status URL``: a running server's status in the terminal, from ``/v2/corral/status``.

The same document as the server's status page, drawn with rich (the ``cli`` extra): the
server's figures, the memory budget as a bar, the models busiest first, the recent events.
``--watch`` redraws it every few seconds until interrupted; ``--json`` prints the document.
Only the standard library talks to the server (urllib), so nothing else is needed.

Example::

    corral status http://127.0.0.1:8000 --token "$CORRAL_AUTH_TOKEN" --watch
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import ssl
import time
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from rich.console import Group

__all__ = [
    "StatusUnavailable",
    "add_status_command",
    "client_tls",
    "fetch_status",
    "render_status",
    "run_status",
]

#: Seconds between two redraws with ``--watch``.
WATCH_S = 2.0
#: Where `corral status` finds its token when --token is not given.
TOKEN_VARIABLE = "CORRAL_STATUS_TOKEN"
#: How long one request to the server may take, in seconds.
TIMEOUT_S = 10.0


class StatusUnavailable(OSError):
    """The server could not be reached, refused the token, or answered an error."""


def add_status_command(commands: Any, handler_for: Any) -> None:
    """Add ``status`` to the ``corral`` command's subparsers (``commands``)."""
    status = commands.add_parser(
        "status",
        help="show a running corral serve's status: models by rate, budget, recent events",
        description=(
            "Read GET /v2/corral/status from a running corral serve and show it: the server's "
            "figures, memory against the budget, the busiest models, the recent events."
        ),
    )
    status.add_argument(
        "url",
        help="the server's HTTP address: host:port (http:// is assumed), or a URL, e.g. "
        "https://models.example:8000",
    )
    status.add_argument(
        "--token",
        default=os.environ.get(TOKEN_VARIABLE),
        help="a token of the server's statistics scope: its --statistics-tokens, else its "
        f"--auth-token ({TOKEN_VARIABLE}, which keeps it off the command line)",
    )
    status.add_argument(
        "--ca-file",
        type=Path,
        help="for https://: the PEM bundle of the CA that signed the server's certificate "
        "(default: the system's)",
    )
    status.add_argument(
        "--cert-file",
        type=Path,
        help="for a server with --tls-client-ca-file (mTLS): this client's PEM certificate",
    )
    status.add_argument(
        "--key-file", type=Path, help="the PEM key of --cert-file (default: in that file)"
    )
    status.add_argument("--watch", action="store_true", help=f"redraw every {WATCH_S:g} s")
    status.add_argument(
        "--top", type=int, default=20, metavar="N", help="models shown (default: 20, at most 500)"
    )
    status.add_argument("--json", action="store_true", help="print the status document as JSON")
    status.set_defaults(handler=handler_for)


def fetch_status(
    url: str, token: str | None, top: int, tls: ssl.SSLContext | None = None
) -> dict[str, Any]:
    """The server's status document, its ``top`` busiest models on the page.

    ``tls``: how an ``https://`` server is verified (and this client shown, for mTLS);
    None: the system's CAs. An address without a scheme (``localhost:8000``) is http://.
    """
    if "://" not in url:
        url = f"http://{url}"
    if not url.startswith(("http://", "https://")):
        raise StatusUnavailable(f"{url!r} is not an http:// or https:// address")
    query = urllib.parse.urlencode(
        {"sort": "requests_per_s", "order": "desc", "page_size": str(top)}
    )
    request = urllib.request.Request(f"{url.rstrip('/')}/v2/corral/status?{query}")
    if token is not None:
        request.add_header("Authorization", f"Bearer {token}")
    try:
        with urllib.request.urlopen(request, timeout=TIMEOUT_S, context=tls) as answer:
            document: dict[str, Any] = json.loads(answer.read())
            return document
    except urllib.error.HTTPError as exc:
        if exc.code == 401:
            raise StatusUnavailable(
                f"{url} needs a token: pass a token of its statistics scope (its "
                f"--statistics-tokens, else its --auth-token) as --token or {TOKEN_VARIABLE}"
                if token is None
                else f"{url} refused the token given with --token"
            ) from None
        raise StatusUnavailable(f"{url} answered {exc.code}: {_error_text(exc)}") from None
    except urllib.error.URLError as exc:
        raise StatusUnavailable(f"cannot reach {url}: {exc.reason}") from None
    except (http.client.HTTPException, OSError) as exc:
        # A TLS 1.3 server that wants a client certificate says so by closing the connection
        # after the handshake: the request then finds it closed.
        hint = " (an mTLS server needs --cert-file)" if url.startswith("https://") else ""
        raise StatusUnavailable(f"cannot reach {url}: {exc}{hint}") from None


def _error_text(exc: urllib.error.HTTPError) -> str:
    try:
        return str(json.loads(exc.read())["error"])
    except (ValueError, KeyError, TypeError):
        return exc.reason or "no reason given"


def render_status(document: dict[str, Any]) -> Group:
    """The status as rich renderables: figures, the budget bar, top models, recent events."""
    from rich.console import Group
    from rich.progress_bar import ProgressBar
    from rich.table import Table
    from rich.text import Text

    server = document["server"]
    models = document["models"]
    head = Text.assemble(
        (f"{server['name']} {server['version']}", "bold"),
        f"  {server['repository']}  edge: {server['edge']}  up {server['uptime_s']:.0f} s  ",
        f"{_number(server['requests_per_s'])} req/s  {_number(server['errors_per_s'])} err/s  ",
        f"p50 {_number(server['p50_ms'], 2)} ms  p99 {_number(server['p99_ms'], 2)} ms  ",
        f"threads {server['threads']}  RSS {_bytes(server['rss_bytes'])}  ",
        f"compute {server['runs_in_flight']}/{server['compute_workers']}  "
        f"queue {server['queue_depth']}",
    )
    used, budget = server["memory_used_bytes"], server["memory_budget_bytes"]
    if budget:
        bar: Any = Table.grid(padding=(0, 1))
        bar.add_row(
            "memory",
            ProgressBar(total=budget, completed=min(used, budget), width=40),
            f"{_bytes(used)} of {_bytes(budget)} ({100 * used / budget:.0f} %)",
        )
    else:
        bar = Text(f"memory {_bytes(used)} used, no budget")
    counts = ", ".join(f"{n} {state}" for state, n in models["by_state"].items())
    table = Table(title=f"models ({models['total']}: {counts}), busiest first")
    columns = ("name", "state", "bytes", "estimated", "measured")
    for column in (*columns, "req/s", "p50 ms", "p99 ms", "batch", "queue"):
        table.add_column(column, justify="left" if column in ("name", "state") else "right")
    table.add_column("last error", overflow="fold")
    for row in models["rows"]:
        table.add_row(
            row["name"],
            row["state"],
            _bytes(row["size_bytes"]),
            _bytes(row["estimated_bytes"]) if row.get("estimated_bytes") else "",
            "" if row.get("measured_bytes") is None else _bytes(row["measured_bytes"]),
            _number(row["requests_per_s"]),
            _number(row["p50_ms"], 2),
            _number(row["p99_ms"], 2),
            _number(row["mean_batch"]),
            str(row["queue"]),
            row["last_error"] or "",
        )
    events = Table(title="recent events", show_header=False, box=None)
    for event in document["events"][:10]:
        size = f" ({_bytes(event['size_bytes'])})" if event["size_bytes"] else ""
        events.add_row(
            time.strftime("%H:%M:%S", time.localtime(event["time"])),
            event["kind"],
            f"{event['model']}:{event['version']} {event['detail']}{size}",
        )
    return Group(head, bar, table, events)


def run_status(args: argparse.Namespace) -> int:
    """``corral status``: print the status once, or redraw it with ``--watch``."""
    from rich.console import Console
    from rich.live import Live

    if not 1 <= args.top <= 500:
        raise ValueError(f"--top must be from 1 to 500, not {args.top}")
    tls = client_tls(args.ca_file, args.cert_file, args.key_file)
    if args.json:
        if args.watch:
            raise ValueError("--json prints the status once: it does not go with --watch")
        print(json.dumps(fetch_status(args.url, args.token, args.top, tls), indent=2))
        return 0
    console = Console()
    if not args.watch:
        console.print(render_status(fetch_status(args.url, args.token, args.top, tls)))
        return 0
    with Live(console=console, auto_refresh=False) as live:
        while True:
            document = fetch_status(args.url, args.token, args.top, tls)
            live.update(render_status(document), refresh=True)
            time.sleep(WATCH_S)


def client_tls(ca: Path | None, cert: Path | None, key: Path | None) -> ssl.SSLContext | None:
    """The TLS context ``--ca-file``, ``--cert-file`` and ``--key-file`` make; None for none.

    Raises :class:`StatusUnavailable` naming the file that cannot be read or used.
    """
    if ca is None and cert is None and key is None:
        return None
    if key is not None and cert is None:
        raise StatusUnavailable("--key-file needs --cert-file")
    try:
        context = ssl.create_default_context(cafile=None if ca is None else str(ca))
    except (OSError, ssl.SSLError) as exc:
        raise StatusUnavailable(f"--ca-file {ca}: {exc}") from None
    if cert is not None:
        try:
            context.load_cert_chain(str(cert), None if key is None else str(key))
        except (OSError, ssl.SSLError) as exc:
            raise StatusUnavailable(f"--cert-file {cert} / --key-file {key}: {exc}") from None
    return context


def _number(value: float | None, digits: int = 1) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def _bytes(value: int | None) -> str:
    if value is None:
        return "-"
    if value < 1024:
        return f"{value} B"
    size = value / 1024
    for unit in ("KiB", "MiB"):
        if size < 1024:
            return f"{size:.1f} {unit}"
        size /= 1024
    return f"{size:.1f} GiB"
