"""Scoped tokens: which bearer tokens open which family of endpoints, on HTTP and gRPC alike.

Triton puts its APIs in groups (``--http-restricted-api``, ``--grpc-restricted-protocol``)
so that, say, the repository and shared-memory APIs need a key the inference clients do not
carry. corral's groups, its :class:`TokenScope` members, are the same cut:

- ``inference``: ``POST .../infer``, ``ModelInfer``, ``ModelStreamInfer``;
- ``metadata``: the server's and a model's metadata, configuration and readiness, gRPC
  reflection, and a model's gRPC health;
- ``model_control``: the repository index, load and unload;
- ``shared_memory``: Triton's system and CUDA shared-memory registrations;
- ``statistics``: the statistics, ``/metrics`` on the HTTP port and the status page's
  document (``corral status``).

The server's liveness and readiness are in no scope: orchestrators probe them without a token.

Each scope is open (no token asked), or opened by a set of tokens, from its own option
(``--inference-tokens`` ...: tokens separated by commas, or ``open``) or, without one, by
``--auth-token``. A request carries ``Authorization: Bearer <token>`` (gRPC: that metadata);
tokens are compared in constant time and appear in no log, no status page and no error.

:class:`TokenPolicy` is immutable once built: every server thread and event loop reads it
without a lock.
"""

from __future__ import annotations

import enum
import hmac
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

__all__ = ["OPEN", "TokenPolicy", "TokenScope", "parse_tokens"]

#: The word that opens a scope to every caller, even when ``--auth-token`` is set.
OPEN = "open"


class TokenScope(enum.Enum):
    """A family of endpoints that shares one set of tokens."""

    #: Inference requests.
    INFERENCE = "inference"
    #: Server and model metadata, model configuration and readiness, reflection.
    METADATA = "metadata"
    #: The repository extension: index, load, unload.
    MODEL_CONTROL = "model_control"
    #: Triton's system and CUDA shared-memory extensions.
    SHARED_MEMORY = "shared_memory"
    #: Statistics, metrics on the HTTP port, the status page's document.
    STATISTICS = "statistics"

    @property
    def option(self) -> str:
        """The settings field that gives this scope its own tokens (``inference_tokens``)."""
        return f"{self.value}_tokens"


def parse_tokens(text: str, option: str) -> tuple[str, ...] | None:
    """The tokens of an option's text: ``open`` is None (open), else tokens split at commas.

    Raises :class:`ValueError` naming ``option`` (never the token) for an empty list, an empty
    token, or one with spaces inside or at either end (HTTP strips those from header values,
    so such a token could never match).
    """
    if text.strip() == OPEN:
        return None
    tokens = tuple(part.strip() for part in text.split(","))
    if not tokens or any(not token for token in tokens):
        raise ValueError(
            f"{option} must be 'open' or tokens separated by commas, none of them empty"
        )
    if any(any(character.isspace() for character in token) for token in tokens):
        raise ValueError(f"{option}: a token may not contain spaces")
    return tokens


@dataclass(frozen=True)
class TokenPolicy:
    """Which ``Authorization`` values open each scope; a scope missing from it is open."""

    #: ``{scope: accepted header values (b"Bearer <token>")}`` for the scopes that need one.
    closed: Mapping[TokenScope, tuple[bytes, ...]]

    @classmethod
    def build(
        cls, auth_token: str | None, scoped: Mapping[TokenScope, tuple[str, ...] | None]
    ) -> TokenPolicy:
        """The policy for ``--auth-token`` and the scopes' own options.

        ``scoped``: the scopes given an option of their own, each its tokens or None for
        ``open``; every other scope takes ``auth_token`` (open without one).
        """
        closed: dict[TokenScope, tuple[bytes, ...]] = {}
        for scope in TokenScope:
            tokens = scoped[scope] if scope in scoped else _one(auth_token)
            if tokens is not None:
                closed[scope] = tuple(f"Bearer {token}".encode() for token in tokens)
        return cls(closed)

    @classmethod
    def open(cls) -> TokenPolicy:
        """A policy that asks no token anywhere."""
        return cls({})

    @property
    def any_closed(self) -> bool:
        """Whether some scope needs a token."""
        return bool(self.closed)

    def accepted(self, scope: TokenScope) -> tuple[bytes, ...] | None:
        """The header values that open ``scope``; None when it is open."""
        return self.closed.get(scope)

    def allows(self, scope: TokenScope, values: Iterable[bytes]) -> bool:
        """Whether one of a request's ``Authorization`` ``values`` opens ``scope``."""
        accepted = self.closed.get(scope)
        if accepted is None:
            return True
        return any(_matches(value, accepted) for value in values)

    def allows_some(self, values: Iterable[bytes]) -> bool:
        """Whether the caller may learn that a path is unknown: some scope is open to it."""
        if len(self.closed) < len(TokenScope):
            return True
        given = list(values)
        closed = self.closed.values()
        return any(_matches(value, accepted) for value in given for accepted in closed)

    def describe(self) -> str:
        """The scopes as the start log shows them: which are closed, never their tokens."""
        if not self.closed:
            return ""
        if len(self.closed) == len(TokenScope) and len(set(self.closed.values())) == 1:
            return "tokens on"
        names = ", ".join(scope.value for scope in TokenScope if scope in self.closed)
        return f"tokens on {names}"


def _one(token: str | None) -> tuple[str, ...] | None:
    return None if token is None else (token,)


def _matches(value: bytes, accepted: tuple[bytes, ...]) -> bool:
    # Every accepted value is compared, so the time taken does not say which one matched.
    found = False
    for candidate in accepted:
        found |= hmac.compare_digest(value, candidate)
    return found
