"""GrpcLimits: the gRPC server's connection limits, as grpc core's server options.

The HTTP side holds its connections to a cap, an idle timeout and a header timeout
(:mod:`corral.server.connections.edge`); these are the gRPC side's, enforced by grpc core itself:

- ``max_connections``: connections open at once (``grpc.max_allowed_incoming_connections``).
  Past it grpc accepts a new connection and closes it at once, before reading a byte: a client
  sees the connection reset and retries. Unlike HTTP's cap, an idle connection is not closed
  to make room (grpc.aio gives no handle on one connection); ``idle_timeout_s`` frees the
  places held by idle ones. The native edge, which owns the port when installed, does close
  the oldest idle one (``edge/src/grpc.rs``, ``make_room``).
- ``idle_timeout_s``: a connection with no call in progress for this long is sent GOAWAY and
  closed (``grpc.max_connection_idle_ms``); a client's channel reconnects on its next call.
- ``handshake_timeout_s``: a connection must send HTTP/2's preface and SETTINGS within this
  long of being accepted (``grpc.server_handshake_timeout_ms``; grpc's default is 120 s).
- ``keepalive_time_s``, ``keepalive_timeout_s``: the server pings a connection after this
  long without traffic, and closes it if the ping is not answered in time (a peer gone
  without a reset) (``grpc.keepalive_time_ms``, ``grpc.keepalive_timeout_ms``).
- ``min_ping_interval_s``: clients may ping this often, with or without calls in progress;
  a client that pings more often is sent GOAWAY ``ENHANCE_YOUR_CALM`` after two strikes
  (``grpc.http2.min_ping_interval_without_data_ms``, ``grpc.http2.max_ping_strikes``).
- ``max_concurrent_streams``: calls one connection may have open at once, announced in the
  server's SETTINGS (``grpc.max_concurrent_streams``); None (the default, as Triton and grpc
  have it): no cap. A cap is refused to streams a client opens before it has read the
  server's SETTINGS, with ``RST_STREAM`` (``REFUSED_STREAM``, which tritonclient does not
  retry): a burst of 500 calls on a new channel lost up to 155 of them at a cap of 100. What
  the calls hold is bounded elsewhere: their messages by the body budget, their work by the
  model queues' bounds.

Example::

    server = grpc.aio.server(options=GrpcLimits(max_connections=192).server_options())
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["GrpcLimits"]
# Pings faster than the policy allows before the connection is sent GOAWAY (grpc's default).
_MAX_PING_STRIKES = 2


def _ms(seconds: float) -> int:
    return max(1, round(seconds * 1000))


@dataclass(frozen=True)
class GrpcLimits:
    """The gRPC server's connection limits (the module's docstring says what each does).

    ``max_connections`` None: no cap (grpc's own default), for a server embedded in another
    process; ``corral serve`` always sets one, from the open-file limit.
    """

    max_connections: int | None = None
    idle_timeout_s: float = 60.0
    handshake_timeout_s: float = 10.0
    keepalive_time_s: float = 60.0
    keepalive_timeout_s: float = 20.0
    min_ping_interval_s: float = 10.0
    max_concurrent_streams: int | None = None

    def server_options(self) -> list[tuple[str, int]]:
        """These limits as ``grpc.aio.server(options=...)`` takes them."""
        options = [
            ("grpc.max_connection_idle_ms", _ms(self.idle_timeout_s)),
            ("grpc.server_handshake_timeout_ms", _ms(self.handshake_timeout_s)),
            ("grpc.keepalive_time_ms", _ms(self.keepalive_time_s)),
            ("grpc.keepalive_timeout_ms", _ms(self.keepalive_timeout_s)),
            # Without it grpc holds a client's pings on a connection with no call to one per
            # two hours, whatever the interval below: a channel's keep-alive would be refused.
            ("grpc.keepalive_permit_without_calls", 1),
            ("grpc.http2.min_ping_interval_without_data_ms", _ms(self.min_ping_interval_s)),
            ("grpc.http2.max_ping_strikes", _MAX_PING_STRIKES),
        ]
        if self.max_concurrent_streams is not None:
            options.append(("grpc.max_concurrent_streams", self.max_concurrent_streams))
        if self.max_connections is not None:
            options.append(("grpc.max_allowed_incoming_connections", self.max_connections))
        return options
