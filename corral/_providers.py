"""Execution providers: what each one allows, and the concurrency policy ``auto`` picks.

This is the one place where corral records what it knows about each provider. The table
is mirrored in ``docs/thread-safety.md``; change both together.

A provider that is not in the table gets the safe side: ``exclusive`` runs and serialized
construction. Tests exercise every policy on the CPU provider through
:func:`corral.testing.emulate_provider`, which makes a provider name run on the CPU provider
while keeping that provider's row of the table.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Literal

from corral import _ort
from corral._errors import ProviderUnavailable

__all__ = [
    "MAX_POOL_SIZE",
    "PROVIDER_TABLE",
    "ConcurrencyPolicy",
    "PolicyKind",
    "ProviderTraits",
    "ResolvedProviders",
    "emulate",
    "resolve_policy",
    "resolve_providers",
]

PolicyKind = Literal["shared", "exclusive", "pool"]

#: The largest ``pool:N``. Each session of a pool holds its own copy of the model, and no
#: more of them can run at once than there are threads running models (compute workers plus
#: callers of the blocking ``Host.infer``); a fixed bound, not one from the core count, so that
#: a model.toml valid on one machine is valid on all.
MAX_POOL_SIZE = 64

# Most restrictive last: a session on several providers takes the strictest of their policies.
_STRICTNESS: dict[PolicyKind, int] = {"shared": 0, "pool": 1, "exclusive": 2}


@dataclass(frozen=True)
class ProviderTraits:
    """What corral relies on for one execution provider."""

    #: The policy ``auto`` picks: ``shared`` if concurrent Run on one session is safe.
    run_policy: PolicyKind
    #: Whether sessions on this provider may be constructed from several threads at once.
    parallel_construction: bool
    #: Where the row comes from.
    reason: str


#: The provider table. Keep ``docs/thread-safety.md`` in step with it.
PROVIDER_TABLE: dict[str, ProviderTraits] = {
    "CPUExecutionProvider": ProviderTraits(
        "shared", True, "onnxruntime documents concurrent Run on one session as safe"
    ),
    "CUDAExecutionProvider": ProviderTraits(
        "shared", True, "onnxruntime documents concurrent Run on one session as safe"
    ),
    "TensorrtExecutionProvider": ProviderTraits(
        "shared", False, "plugin custom-op domains race while constructing (#20089, #22663)"
    ),
    "DmlExecutionProvider": ProviderTraits(
        "pool",
        False,
        "concurrent Run on one session crashes (#22147); construction stalls (#20713)",
    ),
    "XnnpackExecutionProvider": ProviderTraits(
        "shared", False, "first sessions race on a lazily created allocator (#32461)"
    ),
}

#: The traits of a provider the table does not know: the safe side.
UNKNOWN_PROVIDER = ProviderTraits("exclusive", False, "not in corral's table: assumed unsafe")

# Guards _emulated: provider names that tests make run on the CPU provider.
_EMULATION_LOCK = threading.Lock()
_emulated: dict[str, int] = {}


@dataclass(frozen=True)
class ConcurrencyPolicy:
    """How one Session lets threads run its model.

    - ``shared``: one onnxruntime session, any number of concurrent runs.
    - ``exclusive``: one onnxruntime session, one run at a time; others wait their turn.
    - ``pool`` of ``size``: ``size`` onnxruntime sessions; a run borrows an idle one.

    Written as ``"shared"``, ``"exclusive"`` or ``"pool:N"``.
    """

    kind: PolicyKind
    size: int = 1

    def __post_init__(self) -> None:
        if self.kind not in _STRICTNESS:
            raise ValueError(f"unknown concurrency policy kind {self.kind!r}")
        if self.size < 1 or (self.kind != "pool" and self.size != 1):
            raise ValueError(f"concurrency policy {self.kind!r} cannot have size {self.size}")
        if self.size > MAX_POOL_SIZE:
            raise ValueError(
                f"concurrency 'pool:{self.size}' is larger than the maximum, "
                f"pool:{MAX_POOL_SIZE} (corral's MAX_POOL_SIZE)"
            )

    @property
    def replicas(self) -> int:
        """How many onnxruntime sessions this policy builds."""
        return self.size

    @property
    def runs_at_once(self) -> int:
        """How many runs may be in progress at once; 0: no bound (``shared``).

        A run beyond it waits for a session to be free: the scheduler hands a model's queue
        to no more compute workers than this, so that none waits there.
        """
        return 0 if self.kind == "shared" else self.size

    def __str__(self) -> str:
        return f"pool:{self.size}" if self.kind == "pool" else self.kind

    @classmethod
    def parse(cls, spec: str | ConcurrencyPolicy) -> ConcurrencyPolicy | None:
        """Read ``"shared"``, ``"exclusive"`` or ``"pool:N"``; ``"auto"`` gives None.

        Raises ValueError naming the accepted forms, or the bound :data:`MAX_POOL_SIZE`.
        """
        if isinstance(spec, ConcurrencyPolicy):
            return spec
        text = spec.strip().lower() if isinstance(spec, str) else None
        if text == "auto":
            return None
        if text in ("shared", "exclusive"):
            return cls(text)  # type: ignore[arg-type]  # narrowed by the membership test
        if text is not None and text.startswith("pool:"):
            count = text.removeprefix("pool:")
            if count.isascii() and count.isdigit():
                # A 5,000-digit N is past the bound too, without int() refusing its length.
                size = int(count) if len(count) <= 4 else MAX_POOL_SIZE + 1
                if size >= 1:
                    if size > MAX_POOL_SIZE:
                        shown = text if len(text) <= 12 else f"{text[:12]}... ({len(count)} digits)"
                        raise ValueError(
                            f"concurrency {shown!r} is larger than the maximum, "
                            f"pool:{MAX_POOL_SIZE} (corral's MAX_POOL_SIZE)"
                        )
                    return cls("pool", size)
        raise ValueError(
            "concurrency must be 'auto', 'shared', 'exclusive' or 'pool:N' with "
            f"1 <= N <= {MAX_POOL_SIZE}, got {spec!r}"
        )


@dataclass(frozen=True)
class ResolvedProviders:
    """Providers as onnxruntime gets them, and what the table says of them together."""

    #: What to pass to onnxruntime (emulated names replaced by the CPU provider).
    ort_providers: tuple[_ort.ProviderArg, ...]
    #: The names as the caller asked for them.
    requested: tuple[str, ...]
    #: The strictest policy of all the providers.
    run_policy: PolicyKind
    #: True only if every provider allows parallel construction.
    parallel_construction: bool
    #: The option names asked of each provider given with options (not emulated ones):
    #: each must be among what the session reports it took (``_ort.check_provider_options``).
    options_asked: tuple[tuple[str, tuple[str, ...]], ...] = ()


def resolve_providers(providers: Sequence[_ort.ProviderArg] | None) -> ResolvedProviders:
    """Check the providers exist in this build and combine their rows of the table.

    ``None`` means the CPU provider. A provider is a name, or ``(name, options)`` with the
    options a mapping or ``(key, value)`` pairs (values passed to onnxruntime as text).
    Raises :class:`ProviderUnavailable` for a provider this onnxruntime build does not have:
    corral never falls back silently. The options of an emulated provider (tests) are dropped.
    """
    asked: list[_ort.ProviderArg] = (
        ["CPUExecutionProvider"] if providers is None else list(providers)
    )
    if not asked:
        raise ProviderUnavailable("providers is empty: name at least one execution provider")
    with _EMULATION_LOCK:
        emulated = set(_emulated)
    available = set(_ort.available_providers())
    ort_providers: list[_ort.ProviderArg] = []
    names: list[str] = []
    traits: list[ProviderTraits] = []
    options_asked: list[tuple[str, tuple[str, ...]]] = []
    for provider in asked:
        name = provider[0] if isinstance(provider, tuple) else provider
        if not isinstance(name, str) or (isinstance(provider, tuple) and len(provider) != 2):
            raise ProviderUnavailable(
                f"a provider must be a name or (name, options), got {provider!r}"
            )
        if isinstance(provider, tuple):
            provider = (name, _option_texts(name, provider[1]))
        names.append(name)
        traits.append(PROVIDER_TABLE.get(name, UNKNOWN_PROVIDER))
        if name in emulated:
            provider = name = "CPUExecutionProvider"
        elif name not in available:
            raise ProviderUnavailable(
                f"execution provider {name!r} is not in this onnxruntime build; "
                f"available: {', '.join(sorted(available))}"
            )
        # onnxruntime warns about a repeated provider and drops it; do that quietly here.
        if all((p[0] if isinstance(p, tuple) else p) != name for p in ort_providers):
            ort_providers.append(provider)
            if isinstance(provider, tuple) and provider[1]:
                options_asked.append((name, tuple(sorted(provider[1]))))
    strictest = max((t.run_policy for t in traits), key=_STRICTNESS.__getitem__)
    return ResolvedProviders(
        ort_providers=tuple(ort_providers),
        requested=tuple(names),
        run_policy=strictest,
        parallel_construction=all(t.parallel_construction for t in traits),
        options_asked=tuple(options_asked),
    )


def _option_texts(name: str, options: object) -> dict[str, str]:
    """A provider's options as onnxruntime takes them: text keys and values, booleans 1/0."""
    try:
        pairs = dict(options)  # type: ignore[call-overload]  # checked by the except below
    except (TypeError, ValueError):
        raise ProviderUnavailable(
            f"the options of {name} must be a mapping or (key, value) pairs, got {options!r}"
        ) from None
    return {
        str(key): ("1" if value else "0") if isinstance(value, bool) else str(value)
        for key, value in pairs.items()
    }


def resolve_policy(
    spec: str | ConcurrencyPolicy, providers: ResolvedProviders, *, pool_size: int
) -> ConcurrencyPolicy:
    """The policy a session uses: the one asked for, or for ``auto`` the providers' choice.

    ``auto`` on a provider whose policy is ``pool`` builds ``pool_size`` sessions (the
    Runtime's compute workers: more copies than workers would never all be busy), at most
    :data:`MAX_POOL_SIZE`.
    """
    chosen = ConcurrencyPolicy.parse(spec)
    if chosen is not None:
        return chosen
    if providers.run_policy == "pool":
        return ConcurrencyPolicy("pool", min(pool_size, MAX_POOL_SIZE))
    return ConcurrencyPolicy(providers.run_policy)


@contextmanager
def emulate(name: str) -> Iterator[None]:
    """Make sessions asking for provider ``name`` run on the CPU provider (tests only).

    The provider's row of the table still decides the policy and construction rules.
    Nests and is safe from several threads; the emulation ends when the last user leaves.
    """
    with _EMULATION_LOCK:
        _emulated[name] = _emulated.get(name, 0) + 1
    try:
        yield
    finally:
        with _EMULATION_LOCK:
            _emulated[name] -= 1
            if not _emulated[name]:
                del _emulated[name]
