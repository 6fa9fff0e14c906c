"""The ports' checks and binds (corral.server.ports), as the servers and native edge use them."""

from __future__ import annotations

import socket

import pytest

from corral.server.ports import in_use, listening


def test_listening_binds_and_listens_and_a_taken_port_raises():
    with listening("127.0.0.1", 0) as sock:
        port = sock.getsockname()[1]
        assert in_use("127.0.0.1", port)
        with socket.create_connection(("127.0.0.1", port), timeout=10):
            pass  # it listens: the connection is taken into its backlog
        with pytest.raises(OSError, match="in use"):
            listening("127.0.0.1", port)
    assert not in_use("127.0.0.1", port)


def test_an_address_that_does_not_resolve_is_left_to_the_servers_own_bind():
    assert in_use("no-such-host.invalid", 8000) is False
