"""The server's wiring, ``corral.server.app.serve``: its started callback and a failed startup.

In-process on 127.0.0.1 (ports the OS picks), and once as ``corral serve`` in a subprocess for
what a user sees when the HTTP port is taken.
"""

from __future__ import annotations

import asyncio
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

import corral
from corral.server import app, ports
from corral.server.app import EXIT_CLEAN, Addresses, serve
from corral.server.settings import ServerSettings


@pytest.fixture
def taken_port() -> Iterator[int]:
    """A port on 127.0.0.1 that another socket is listening on."""
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        yield holder.getsockname()[1]


async def _get(port: int, path: str) -> bytes:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(f"GET {path} HTTP/1.1\r\nhost: corral\r\nconnection: close\r\n\r\n".encode())
    answer = await reader.read()
    writer.close()
    await writer.wait_closed()
    return answer


@pytest.mark.timeout(60)
def test_started_gets_the_bound_addresses_and_a_stop_right_after_drains_cleanly(repo: Path):
    settings = ServerSettings(repository=str(repo), http_port=0, grpc_port=-1)
    seen: list[Addresses] = []
    answers: list[bytes] = []
    asking: list[asyncio.Task[None]] = []  # held: the loop keeps only a weak reference

    async def scenario() -> int:
        stop = asyncio.Event()

        async def ask_then_stop(port: int) -> None:
            answers.append(await _get(port, "/v2/health/live"))
            stop.set()

        def started(addresses: Addresses) -> None:
            seen.append(addresses)
            asking.append(
                asyncio.get_running_loop().create_task(ask_then_stop(addresses.http_port))
            )

        return await serve(settings, stop, started=started)

    assert asyncio.run(scenario()) == EXIT_CLEAN
    (addresses,) = seen
    assert (addresses.host, addresses.grpc_port) == ("127.0.0.1", None)
    assert addresses.http_port > 0
    (answer,) = answers
    assert answer.startswith(b"HTTP/1.1 200 ")
    assert answer.endswith(b'{"live":true}')


@pytest.mark.timeout(60)
def test_a_port_taken_after_the_check_raises_an_os_error_naming_it_and_closes_the_host(
    repo: Path, taken_port: int, monkeypatch: pytest.MonkeyPatch
):
    # Taken between check_ports_free and the bind: the servers' own error, and a clean stop.
    monkeypatch.setattr(ports, "in_use", lambda host, port: False)
    settings = ServerSettings(repository=str(repo), http_port=taken_port, grpc_port=0)
    started: list[Addresses] = []

    async def scenario() -> int:
        return await serve(settings, asyncio.Event(), started=started.append)

    with pytest.raises(OSError, match=f"could not start on 127.0.0.1:{taken_port}"):
        asyncio.run(scenario())
    assert started == []
    # The Host was closed and gRPC stopped: no thread is left (the autouse check), no session.
    assert corral.runtime().stats().sessions_alive == 0


@pytest.mark.timeout(60)
def test_corral_serve_on_a_taken_port_exits_1_saying_so(repo: Path, taken_port: int):
    # uvicorn's own exit status for a failed startup is 3, corral's for a drain that ran out.
    command = [
        sys.executable,
        "-c",
        "import sys; from corral.cli import main; sys.exit(main())",
        "serve",
        str(repo),
        "--http-port",
        str(taken_port),
        "--grpc-port",
        "0",
    ]
    done = subprocess.run(command, capture_output=True, timeout=50, check=False)
    log = done.stderr.decode()
    assert done.returncode == 1, log
    assert (
        f"corral serve: error: port {taken_port} (--http-port) on 127.0.0.1 is in use by "
        "another process: stop it, or give other ports (0 picks a free one)"
    ) in log
    assert "Traceback" not in log
    assert "Task was destroyed" not in log


@pytest.mark.timeout(60)
def test_every_taken_port_is_named_by_its_flag_before_anything_loads(
    repo: Path, taken_port: int, monkeypatch: pytest.MonkeyPatch
):
    with socket.socket() as other:
        other.bind(("127.0.0.1", 0))
        other.listen()
        grpc_port = other.getsockname()[1]
        settings = ServerSettings(
            repository=str(repo), http_port=taken_port, grpc_port=grpc_port, load_model=["*"]
        )
        built: list[object] = []
        monkeypatch.setattr(app, "Host", lambda *a, **k: built.append(a))  # never reached
        with pytest.raises(OSError, match="in use by another process") as refused:
            asyncio.run(serve(settings, asyncio.Event()))
    assert str(refused.value) == (
        f"ports {grpc_port} (--grpc-port) and {taken_port} (--http-port) on 127.0.0.1 are in "
        "use by another process: stop it, or give other ports (0 picks a free one)"
    )
    assert built == []  # nothing was loaded for a server that could not start
