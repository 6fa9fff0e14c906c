"""The native Host allow-list against corral's ``host_name`` and ``SitePolicy.allows``."""

from __future__ import annotations

import random

import corral_edge
from corral_api import SitePolicy, host_name

_PIECES = [
    "localhost", "LocalHost", "127.0.0.1", "::1", "[::1]", "[::1]:8000", "example.com",
    "a.example.com", "EXAMPLE.COM", "evil.com", ":", "::", "[", "]", "[]", "[::1]x", "[::1]:",
    ":80", ":8x", ":٣", "80", " ", "\t", "\x0b", "\x1c", "\x85", "\xa0", "@", "/", "\\", "?", "#",
    "é", "É", "ß", "\x7f", "\x00", "*", "*.", "*.example.com", "x", "-", ".", "1", "0",
]
_ALLOW_LISTS = [
    None, [], ["*"], ["localhost"], ["localhost", "127.0.0.1", "::1"], ["*.example.com"],
    ["[::1]"], ["Example.COM"], [" localhost "], ["*.EXAMPLE.com", "10.0.0.5"], ["é.fr"],
    ["localhost:8000"], ["*.", "a"],
]


def _value(rng: random.Random) -> str:
    return "".join(rng.choice(_PIECES) for _ in range(rng.choice([1, 1, 2, 3, 4])))


def test_host_name_agrees() -> None:
    rng = random.Random(11)
    for _ in range(20000):
        value = _value(rng)
        assert corral_edge._host_name(value) == host_name(value), repr(value)


def test_allows_agrees() -> None:
    rng = random.Random(12)
    policies = []
    for allowed in _ALLOW_LISTS:
        try:
            policies.append((allowed, SitePolicy(allowed)))
        except ValueError:
            continue
    for _ in range(20000):
        raw = _value(rng).encode("latin-1", "replace")
        for allowed, policy in policies:
            assert corral_edge._allows(allowed, raw) == policy.allows(raw.decode("latin-1")), (allowed, raw)


def test_bad_entries_are_refused_alike() -> None:
    for entry in ["a b", "[::1", "x:y", "", "/"]:
        refused_python = refused_native = False
        try:
            SitePolicy([entry])
        except ValueError:
            refused_python = True
        try:
            corral_edge._allows([entry], b"x")
        except ValueError:
            refused_native = True
        assert refused_native == refused_python, entry
