"""A tiny PromQL evaluator, for the docs' alert expressions over two scrapes of a real server.

It reads the subset the alerts in docs/operations.md and the autoscaling queries in
deploy/kubernetes/autoscaling.yaml use: numbers, ``rate(name{l="v"}[5m])``, an instant
``name{l="v"}`` (its value at the second scrape), label matchers ``=`` and ``=~`` (a regular
expression matching the whole value), ``sum [by (labels)] (...)``, ``+ - * /``, the
comparisons ``> < >= <= == !=`` (filtering, as Prometheus' without ``bool``) and parentheses;
anything else is a ``SyntaxError`` naming it.

What it does not do, and says so: ``rate`` is the increase between the two scrapes divided by
the seconds between them (Prometheus extrapolates over its range from the samples inside it;
with two samples that is the same slope), the range is not checked against the interval, and
an alert's ``for:`` is not waited out. Every sample gets the target labels Prometheus adds
(``instance``, ``job``). Vectors on both sides of an operator match on their whole label sets,
as they do after a ``sum by``.

Example::

    before = Scrape.parse(first_text, at=0.0)
    after = Scrape.parse(second_text, at=2.0)
    result = evaluate("sum by (instance) (rate(x[5m])) > 0", before, after)
"""

from __future__ import annotations

import math
import operator
import re
from collections.abc import Callable
from dataclasses import dataclass

#: A sample's labels, as a hashable set of pairs.
Labels = frozenset[tuple[str, str]]
Vector = dict[Labels, float]
Value = Vector | float

_TOKEN = re.compile(
    r"\s*(?:(?P<number>\d+(?:\.\d+)?(?:e[+-]?\d+)?)|(?P<range>\[\w+\])"
    r"|(?P<name>[A-Za-z_:][\w:]*)|(?P<string>\"(?:[^\"\\]|\\.)*\")"
    r"|(?P<op>>=|<=|==|!=|=~|[-+*/><(){},=]))"
)
_SAMPLE = re.compile(r"(?P<name>[A-Za-z_:][\w:]*)(?:\{(?P<labels>.*)\})? (?P<value>\S+)")
_LABEL = re.compile(r'(\w+)="((?:[^"\\]|\\.)*)"')


def _unescape(value: str) -> str:
    return re.sub(r"\\(.)", lambda m: "\n" if m[1] == "n" else m[1], value)


_ARITHMETIC: dict[str, Callable[[float, float], float]] = {
    "+": operator.add,
    "-": operator.sub,
    "*": operator.mul,
    "/": lambda a, b: a / b if b else (math.nan if a == 0 else math.copysign(math.inf, a)),
}
_COMPARISON: dict[str, Callable[[float, float], bool]] = {
    ">": operator.gt,
    "<": operator.lt,
    ">=": operator.ge,
    "<=": operator.le,
    "==": operator.eq,
    "!=": operator.ne,
}


@dataclass(frozen=True)
class Scrape:
    """One scrape of a ``/metrics`` page: its samples by name, and when it was taken."""

    at: float
    samples: dict[str, Vector]

    @classmethod
    def parse(cls, text: str, *, at: float, target: dict[str, str] | None = None) -> Scrape:
        """Read the text exposition ``text``, taken at ``at`` seconds, with ``target`` labels.

        Each sample under the name it is written with, as Prometheus stores it (a counter
        written without ``_total`` keeps its name; prometheus-client's parser would add it).
        """
        extra = target or {"instance": "corral", "job": "corral"}
        samples: dict[str, Vector] = {}
        for line in text.splitlines():
            if not line or line.startswith("#"):
                continue
            match = _SAMPLE.fullmatch(line)
            if match is None:
                raise ValueError(f"not a sample line: {line!r}")
            labels = {k: _unescape(v) for k, v in _LABEL.findall(match["labels"] or "")}
            pairs = frozenset({**labels, **extra}.items())
            samples.setdefault(match["name"], {})[pairs] = float(match["value"])
        return cls(at, samples)


def evaluate(expression: str, before: Scrape, after: Scrape) -> Value:
    """The value of ``expression`` at ``after``, its rates taken from ``before`` to ``after``."""
    parser = _Parser(_tokens(expression), before, after)
    value = parser.comparison()
    if parser.position != len(parser.tokens):
        raise SyntaxError(f"unexpected {parser.tokens[parser.position][1]!r} in {expression!r}")
    return value


def _tokens(expression: str) -> list[tuple[str, str]]:
    tokens = []
    position = 0
    text = expression.strip()
    while position < len(text):
        match = _TOKEN.match(text, position)
        if match is None or match.end() == position:
            raise SyntaxError(f"cannot read {text[position : position + 20]!r} in {expression!r}")
        kind = match.lastgroup
        assert kind is not None
        tokens.append((kind, match.group(kind)))
        position = match.end()
        while position < len(text) and text[position].isspace():
            position += 1
    return tokens


class _Parser:
    def __init__(self, tokens: list[tuple[str, str]], before: Scrape, after: Scrape) -> None:
        self.tokens = tokens
        self.position = 0
        self.before = before
        self.after = after

    def peek(self) -> tuple[str, str] | None:
        return self.tokens[self.position] if self.position < len(self.tokens) else None

    def take(self, expected: str | None = None) -> tuple[str, str]:
        token = self.peek()
        if token is None or (expected is not None and token[1] != expected):
            raise SyntaxError(f"expected {expected or 'more'}, got {token}")
        self.position += 1
        return token

    def comparison(self) -> Value:
        left = self.additive()
        token = self.peek()
        if token is not None and token[1] in _COMPARISON:
            self.take()
            right = self.additive()
            return _compare(left, right, _COMPARISON[token[1]])
        return left

    def additive(self) -> Value:
        value = self.multiplicative()
        while (token := self.peek()) is not None and token[1] in ("+", "-"):
            self.take()
            value = _combine(value, self.multiplicative(), _ARITHMETIC[token[1]])
        return value

    def multiplicative(self) -> Value:
        value = self.primary()
        while (token := self.peek()) is not None and token[1] in ("*", "/"):
            self.take()
            value = _combine(value, self.primary(), _ARITHMETIC[token[1]])
        return value

    def primary(self) -> Value:
        kind, text = self.take()
        if kind == "number":
            return float(text)
        if text == "(":
            value = self.comparison()
            self.take(")")
            return value
        if text == "sum":
            return self.sum()
        if text == "rate":
            self.take("(")
            name, matchers = self.selector()
            self.take()  # the range: two scrapes are what there is
            self.take(")")
            return self.rate(name, matchers)
        if kind == "name" and text not in ("by", "histogram_quantile", "increase"):
            self.position -= 1
            name, matchers = self.selector()
            return {
                _without_name(labels): value
                for labels, value in self.after.samples.get(name, {}).items()
                if _matches(labels, matchers)
            }
        raise SyntaxError(f"{text!r} is not in the subset this evaluator reads")

    def sum(self) -> Vector:
        keep: tuple[str, ...] = ()
        if self.peek() == ("name", "by"):
            self.take()
            self.take("(")
            names = []
            while self.peek() != ("op", ")"):
                names.append(self.take()[1])
                if self.peek() == ("op", ","):
                    self.take()
            self.take(")")
            keep = tuple(names)
        self.take("(")
        inner = self.comparison()
        self.take(")")
        if not isinstance(inner, dict):
            raise SyntaxError("sum of a scalar")
        summed: Vector = {}
        for labels, value in inner.items():
            group = frozenset((k, v) for k, v in labels if k in keep)
            summed[group] = summed.get(group, 0.0) + value
        return summed

    def selector(self) -> tuple[str, dict[str, tuple[str, str]]]:
        name = self.take()[1]
        matchers: dict[str, tuple[str, str]] = {}
        if self.peek() == ("op", "{"):
            self.take()
            while self.peek() != ("op", "}"):
                label = self.take()[1]
                kind = self.take()[1]
                if kind not in ("=", "=~"):
                    raise SyntaxError(f"the matcher {kind!r} is not in the subset")
                matchers[label] = (kind, self.take()[1][1:-1])
                if self.peek() == ("op", ","):
                    self.take()
            self.take("}")
        return name, matchers

    def rate(self, name: str, matchers: dict[str, tuple[str, str]]) -> Vector:
        seconds = self.after.at - self.before.at
        earlier = self.before.samples.get(name, {})
        rates: Vector = {}
        for labels, value in self.after.samples.get(name, {}).items():
            if not _matches(labels, matchers):
                continue
            if labels not in earlier:
                continue  # a series needs two samples for a rate, as in Prometheus
            increase = value - earlier[labels]
            if increase < 0:
                increase = value  # a counter reset
            rates[_without_name(labels)] = increase / seconds
        return rates


def _matches(labels: Labels, matchers: dict[str, tuple[str, str]]) -> bool:
    """Whether a series' labels pass every matcher: ``=`` equal, ``=~`` a whole-value regex."""
    values = dict(labels)
    for label, (kind, wanted) in matchers.items():
        value = values.get(label, "")
        if kind == "=" and value != wanted:
            return False
        if kind == "=~" and re.fullmatch(wanted, value) is None:
            return False
    return True


def _without_name(labels: Labels) -> Labels:
    return frozenset((k, v) for k, v in labels if k != "__name__")


def _combine(left: Value, right: Value, apply: Callable[[float, float], float]) -> Value:
    if isinstance(left, dict) and isinstance(right, dict):
        return {
            labels: apply(value, right[labels]) for labels, value in left.items() if labels in right
        }
    if isinstance(left, dict):
        assert isinstance(right, float)
        return {labels: apply(value, right) for labels, value in left.items()}
    if isinstance(right, dict):
        return {labels: apply(left, value) for labels, value in right.items()}
    return apply(left, right)


def _compare(left: Value, right: Value, test: Callable[[float, float], bool]) -> Value:
    if isinstance(left, dict) and isinstance(right, float):
        return {labels: value for labels, value in left.items() if test(value, right)}
    if isinstance(left, dict) and isinstance(right, dict):
        return {
            labels: value
            for labels, value in left.items()
            if labels in right and test(value, right[labels])
        }
    raise SyntaxError("a comparison of a scalar on the left is not in the subset")
