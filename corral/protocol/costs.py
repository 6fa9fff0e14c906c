"""What a request costs once decoded, charged before its tensors are built.

A request's wire size understates what it costs in memory when it carries BYTES tensors of
many short elements: each element becomes a Python ``bytes`` object in an ``object`` array.
Measured on CPython 3.11 (2,000,000 one-byte elements, RSS before and after): decoding a
BYTES tensor grows the process by 63.3 bytes an element, and orjson's parse of a JSON array
of one-character strings by 63.5 bytes a string. The object's header is
``sys.getsizeof(b"")``, 33 bytes, which pymalloc rounds up to 48 for elements of up to 14
bytes; the ``object`` array holds an 8-byte pointer to it and the decoder's list another
8. So :data:`BYTES_ELEMENT_COST` is 64 bytes an element (plus its own bytes when known), and
:data:`JSON_STRING_COST` 64 bytes a string of a JSON document, charged before it is parsed.
A 1-byte element costs 5 bytes on the wire (its 4-byte length and the byte): decoded, 13
times that, where the wire count saw 1.

A transport makes one :class:`DecodeAllowance` per request, holding what the request has
cost so far (its wire or inflated size), its limit (``max_request_bytes``) and the body
budget's reservation; the codecs :meth:`~DecodeAllowance.charge` it before they build what
costs more than the wire bytes: BYTES tensors, the strings of a JSON document, inputs
copied out of shared memory. Past the limit, :class:`RequestTooLarge` names the tensor
(HTTP 413, gRPC ``RESOURCE_EXHAUSTED``); past the body budget, the reservation's own
:class:`~corral.server.bodies.BodyBudgetExceeded` (503 / ``RESOURCE_EXHAUSTED``).

Example::

    allowance = DecodeAllowance(64 * 1024 * 1024, len(body), held.grow)
    allowance.charge_bytes("text", count=1_000_000, payload=1_000_000)
"""

from __future__ import annotations

from collections.abc import Callable

from corral._base import InvalidInput

__all__ = ["BYTES_ELEMENT_COST", "JSON_STRING_COST", "DecodeAllowance", "RequestTooLarge"]

#: Bytes a decoded BYTES element costs beyond its own bytes (see the module's docstring).
BYTES_ELEMENT_COST = 64
#: Bytes a string of a JSON document costs once parsed, beyond its own characters.
JSON_STRING_COST = 64


class RequestTooLarge(InvalidInput):
    """A request whose decoded form would pass ``max_request_bytes``; ``tensor`` names the input.

    The transports answer it as they answer a body over the limit: HTTP 413, gRPC
    ``RESOURCE_EXHAUSTED``.
    """


class DecodeAllowance:
    """What one request may still cost decoded: ``limit`` bytes in all, ``spent`` so far.

    ``grow``, when given, holds each charge in the server's body budget too (a
    :class:`~corral.server.bodies.BodyReservation`'s ``grow``) and raises when it does not
    fit. Not thread-safe: one request decodes on one thread at a time.
    """

    __slots__ = ("_grow", "_limit", "_spent")

    def __init__(self, limit: int, spent: int, grow: Callable[[int], None] | None = None) -> None:
        self._limit = limit
        self._spent = spent
        self._grow = grow

    @property
    def limit(self) -> int:
        """The most bytes the request may cost decoded."""
        return self._limit

    @property
    def spent(self) -> int:
        """The bytes charged so far, the wire (or inflated) bytes included."""
        return self._spent

    def fits(self, cost: int) -> bool:
        """True if ``cost`` more bytes stay within the limit (nothing is charged)."""
        return self._spent + cost <= self._limit

    def charge(self, cost: int, *, tensor: str | None, what: str) -> None:
        """Charge ``cost`` bytes for ``what``; :class:`RequestTooLarge` past the limit.

        ``what`` says what costs them, for the message (``"its 2000000 BYTES elements"``);
        ``tensor`` names the input, None when no one input is at fault.
        """
        if cost <= 0:
            return
        if self._spent + cost > self._limit:
            owner = "the request" if tensor is None else f"input {tensor!r}"
            raise RequestTooLarge(
                f"{owner} is too large decoded: {what} cost {cost} bytes in memory, which with "
                f"the {self._spent} bytes of the rest pass the request limit of {self._limit} "
                "bytes (max_request_bytes counts BYTES tensors and shared-memory inputs as "
                f"decoded: {BYTES_ELEMENT_COST} bytes an element beyond its own bytes); send "
                "fewer or longer elements, or split the request",
                tensor=tensor,
            )
        if self._grow is not None:
            self._grow(cost)
        self._spent += cost

    def charge_bytes(self, tensor: str, count: int, payload: int) -> None:
        """Charge a BYTES tensor of ``count`` elements holding ``payload`` bytes in all."""
        self.charge(
            count * BYTES_ELEMENT_COST + payload,
            tensor=tensor,
            what=f"its {count} BYTES elements",
        )
