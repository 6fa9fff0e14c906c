"""Sizes in bytes as people write them: ``"512MiB"``, ``"2GB"``, ``"2Gi"``, ``"2g"``.

One reading for every size corral takes (the memory budget, a model's declared size, the
server's limits), so that ``64MiB`` means the same wherever it is written.
"""

from __future__ import annotations

import re
from fractions import Fraction

from corral._base.errors import InvalidOption

__all__ = ["parse_bytes"]

# Units spelt with two letters or more are read in any case ("2 kib", "2GB"). Single
# letters are read as Docker does: lowercase k, m, g are binary (``--memory 2g``: 2 GiB).
_UNITS = {
    "": 1,
    "b": 1,
    "kb": 10**3,
    "mb": 10**6,
    "gb": 10**9,
    "tb": 10**12,
    "kib": 2**10,
    "mib": 2**20,
    "gib": 2**30,
    "tib": 2**40,
    # Kubernetes' binary suffixes (its quantities: "2Gi").
    "ki": 2**10,
    "mi": 2**20,
    "gi": 2**30,
    "ti": 2**40,
}
_DOCKER_UNITS = {"k": 2**10, "m": 2**20, "g": 2**30}
# Kubernetes reads 2G as 2 x 10^9 bytes, Docker as 2 GiB: either reading could be wrong.
_AMBIGUOUS_UNITS = frozenset("KMGT")
_BYTES_PATTERN = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([a-zA-Z]*)\s*$")


def parse_bytes(value: int | str, *, option: str = "memory_budget") -> int:
    """Bytes from an int or a string like ``"512MiB"``, ``"2GB"``, ``"2Gi"``, ``"2g"``, ``"4096"``.

    Units: ``B``; decimal ``KB``, ``MB``, ``GB``, ``TB`` (10^3 ...); binary ``KiB``, ``MiB``,
    ``GiB``, ``TiB`` and Kubernetes' ``Ki``, ``Mi``, ``Gi``, ``Ti`` (2^10 ...), in any case;
    Docker's ``k``, ``m``, ``g``, lowercase only, binary as Docker reads them. The single
    capitals ``K``, ``M``, ``G``, ``T`` are refused: Kubernetes reads ``2G`` as 2 x 10^9
    bytes and Docker as 2 GiB, and a budget read the wrong way is worse than an error. A
    fraction is allowed where the bytes come out whole (``"1.5GiB"``).

    Raises :class:`InvalidOption` naming ``option`` (callers pass the flag, setting or key the
    value came from) for anything else, or a size below 1.

    >>> parse_bytes("2KiB")
    2048
    >>> parse_bytes("2g")
    2147483648
    """
    if isinstance(value, bool) or not isinstance(value, int | str):
        raise InvalidOption(
            f"{option} must be bytes or a string like '2GiB', got {value!r}", option=option
        )
    number = value if isinstance(value, int) else _bytes_in(value, option)
    if number < 1:
        raise InvalidOption(f"{option} must be positive, got {value!r}", option=option)
    return number


def _bytes_in(text: str, option: str) -> int:
    match = _BYTES_PATTERN.match(text)
    if match is None:
        raise InvalidOption(f"{option} {text!r} is not a size: {_SPELLINGS}", option=option)
    amount, unit = match.groups()
    if unit in _AMBIGUOUS_UNITS:
        power = "KMGT".index(unit) + 1
        raise InvalidOption(
            f"{option} {text!r} is ambiguous: {unit} means 10^{3 * power} bytes to some tools "
            f"(Kubernetes reads 2G as 2 x 10^9) and 2^{10 * power} to others (Docker reads 2G "
            f"as 2 GiB); write {amount}{unit}B for 10^{3 * power} or {amount}{unit}iB "
            f"(or {amount}{unit}i) for 2^{10 * power}",
            option=option,
        )
    factor = _DOCKER_UNITS.get(unit) or _UNITS.get(unit.lower())
    if factor is None:
        raise InvalidOption(f"{option} {text!r} is not a size: {_SPELLINGS}", option=option)
    number = Fraction(amount) * factor
    if number.denominator != 1:
        raise InvalidOption(
            f"{option} {text!r} is not a whole number of bytes ({float(number)})", option=option
        )
    return int(number)


_SPELLINGS = (
    "use bytes or a number with one of B, KB, MB, GB, TB (powers of 10), KiB, MiB, GiB, TiB, "
    "Ki, Mi, Gi, Ti or Docker's k, m, g (powers of 2)"
)
