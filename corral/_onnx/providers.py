"""Execution providers: what each one allows, and the concurrency policy ``auto`` picks.

This is the one place where corral records what it knows about each provider. The table
is mirrored in ``docs/thread-safety.md``; change both together.

A provider whose row says runs on different sessions of one device crash
(``one_run_per_device``: DirectML, WebGPU) gets a device lane with every policy: one run at a
time across every session on that device (:mod:`corral._onnx.device_lanes`), written ``+device``
after the per-session rule (``exclusive+device``).

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

from corral._base import ModelConfigError, ProviderUnavailable
from corral._onnx import ort
from corral._onnx.device_lanes import DeviceKey

__all__ = [
    "MAX_POOL_SIZE",
    "PROVIDER_TABLE",
    "ConcurrencyPolicy",
    "PolicyKind",
    "ProviderTraits",
    "ResolvedProviders",
    "emulate_on_cpu",
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
    #: Runs on *different* sessions of one device crash when they overlap: every session on
    #: the device then shares one lane, one run at a time (``+device``), whatever its policy.
    one_run_per_device: bool = False
    #: The provider option that names the device (0 when a session's options give none).
    device_option: str = "device_id"


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
        "exclusive",
        False,
        "concurrent Run crashes on one session (#22147) and, since 1.18, on different "
        "sessions of one device (#20713, immich#31469); construction stalls (#20713)",
        one_run_per_device=True,
    ),
    "WebGpuExecutionProvider": ProviderTraits(
        "exclusive",
        False,
        "concurrent Run on two sessions segfaults (#32561)",
        one_run_per_device=True,
        device_option="deviceId",
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
    - ``device``: besides the above, one run at a time across every session on the device
      (a lane per provider and device id, shared by every model); for providers whose runs on
      different sessions crash when they overlap (DirectML, WebGPU). Not with ``pool``: its
      sessions could never run at once, and each would cost a copy of the model.

    Written as ``"shared"``, ``"exclusive"`` or ``"pool:N"``, and ``"shared+device"`` or
    ``"exclusive+device"`` with the device lane.
    """

    kind: PolicyKind
    size: int = 1
    device: bool = False

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
        if self.device and self.kind == "pool":
            raise ValueError(
                f"concurrency 'pool:{self.size}+device' cannot be: the device runs one run at "
                "a time, so the pool's sessions would never run at once and each would hold "
                "a copy of the model; use 'exclusive+device'"
            )

    @property
    def replicas(self) -> int:
        """How many onnxruntime sessions this policy builds."""
        return self.size

    @property
    def runs_at_once(self) -> int:
        """How many runs may be in progress at once; 0: no bound (``shared``).

        A run beyond it waits for a session to be free: the scheduler hands a model's queue
        to no more compute workers than this, so that none waits there. With the device lane,
        one (the lane's other runs are the scheduler's to keep apart: see ``Scheduler``).
        """
        if self.device:
            return 1
        return 0 if self.kind == "shared" else self.size

    def __str__(self) -> str:
        base = f"pool:{self.size}" if self.kind == "pool" else self.kind
        return f"{base}+device" if self.device else base

    @classmethod
    def parse(cls, spec: str | ConcurrencyPolicy) -> ConcurrencyPolicy | None:
        """Read ``"shared"``, ``"exclusive"`` or ``"pool:N"``; ``"auto"`` gives None.

        ``"+device"`` after ``shared`` or ``exclusive`` adds the device lane. Raises
        ValueError naming the accepted forms, or the bound :data:`MAX_POOL_SIZE`.
        """
        if isinstance(spec, ConcurrencyPolicy):
            return spec
        text = spec.strip().lower() if isinstance(spec, str) else None
        if text == "auto":
            return None
        device = text is not None and text.endswith("+device")
        if text is not None and device:
            text = text.removesuffix("+device").strip()
        if text in ("shared", "exclusive"):
            return cls(text, device=device)  # type: ignore[arg-type]  # narrowed just above
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
                    return cls("pool", size, device)
        raise ValueError(
            "concurrency must be 'auto', 'shared', 'exclusive', 'shared+device', "
            f"'exclusive+device' or 'pool:N' with 1 <= N <= {MAX_POOL_SIZE}, got {spec!r}"
        )


@dataclass(frozen=True)
class ResolvedProviders:
    """Providers as onnxruntime gets them, and what the table says of them together."""

    #: What to pass to onnxruntime (emulated names replaced by the CPU provider).
    ort_providers: tuple[ort.ProviderArg, ...]
    #: The names as the caller asked for them.
    requested: tuple[str, ...]
    #: The strictest policy of all the providers.
    run_policy: PolicyKind
    #: True only if every provider allows parallel construction.
    parallel_construction: bool
    #: The option names asked of each provider given with options (not emulated ones):
    #: each must be among what the session reports it took (``ort.check_provider_options``).
    options_asked: tuple[tuple[str, tuple[str, ...]], ...] = ()
    #: Each provider asked for and the device its options name (0 by default), in order.
    devices: tuple[DeviceKey, ...] = ()
    #: The devices whose runs must not overlap across sessions (``one_run_per_device``).
    lane_devices: tuple[DeviceKey, ...] = ()

    def lanes_for(self, policy: ConcurrencyPolicy) -> tuple[DeviceKey, ...]:
        """The devices whose lanes a session under ``policy`` runs in, sorted; () for none.

        ``+device`` on providers that need no lane (the CPU, say) takes the first provider's.
        """
        if not policy.device:
            return ()
        return tuple(sorted(set(self.lane_devices or self.devices[:1])))


def resolve_providers(providers: Sequence[ort.ProviderArg] | None) -> ResolvedProviders:
    """Check the providers exist in this build and combine their rows of the table.

    ``None`` means the CPU provider. A provider is a name, or ``(name, options)`` with the
    options a mapping or ``(key, value)`` pairs (values passed to onnxruntime as text).
    Raises :class:`ProviderUnavailable` for a provider this onnxruntime build does not have:
    corral never falls back silently. The options of an emulated provider (tests) are dropped.
    """
    asked: list[ort.ProviderArg] = (
        ["CPUExecutionProvider"] if providers is None else list(providers)
    )
    if not asked:
        raise ProviderUnavailable("providers is empty: name at least one execution provider")
    with _EMULATION_LOCK:
        emulated = set(_emulated)
    available = set(ort.available_providers())
    ort_providers: list[ort.ProviderArg] = []
    names: list[str] = []
    traits: list[ProviderTraits] = []
    options_asked: list[tuple[str, tuple[str, ...]]] = []
    devices: list[DeviceKey] = []
    for provider in asked:
        name = provider[0] if isinstance(provider, tuple) else provider
        if not isinstance(name, str) or (isinstance(provider, tuple) and len(provider) != 2):
            raise ProviderUnavailable(
                f"a provider must be a name or (name, options), got {provider!r}"
            )
        texts: dict[str, str] = {}
        if isinstance(provider, tuple):
            texts = _option_texts(name, provider[1])
            provider = (name, texts)
        names.append(name)
        row = PROVIDER_TABLE.get(name, UNKNOWN_PROVIDER)
        traits.append(row)
        devices.append((name, _device_id(name, row, texts)))
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
        devices=tuple(devices),
        lane_devices=tuple(
            device for device, row in zip(devices, traits, strict=True) if row.one_run_per_device
        ),
    )


def _device_id(name: str, row: ProviderTraits, options: dict[str, str]) -> int:
    """The device a provider's options name (``device_id``, WebGPU's ``deviceId``); else 0."""
    text = options.get(row.device_option)
    if text is None:
        return 0
    digits = text.strip()
    if not (digits.isascii() and digits.isdigit() and len(digits) <= 6):
        raise ProviderUnavailable(
            f"the {row.device_option!r} option of {name} must be a device number, got {text!r}"
        )
    return int(digits)


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
    :data:`MAX_POOL_SIZE`. On a provider whose runs on different sessions of a device crash
    (``one_run_per_device``), every policy gets the device lane (``+device``): one session
    cannot leave the lane without putting the device's other sessions at risk. ``pool:N``
    is refused there (:class:`ModelConfigError`): its sessions could never run at once.
    """
    chosen = ConcurrencyPolicy.parse(spec)
    if chosen is None:
        if providers.run_policy == "pool" and not providers.lane_devices:
            chosen = ConcurrencyPolicy("pool", min(pool_size, MAX_POOL_SIZE))
        else:
            kind = "exclusive" if providers.run_policy == "pool" else providers.run_policy
            chosen = ConcurrencyPolicy(kind)
    if providers.lane_devices and not chosen.device:
        if chosen.kind == "pool":
            crashing = ", ".join(sorted({name for name, _ in providers.lane_devices}))
            raise ModelConfigError(
                f"concurrency {str(chosen)!r} cannot be used on {crashing}: runs on different "
                "sessions of one device crash when they overlap, so its sessions could never "
                "run at once and each would hold a copy of the model on the device; use "
                "'auto' or 'exclusive+device'"
            )
        chosen = ConcurrencyPolicy(chosen.kind, device=True)
    return chosen


@contextmanager
def emulate_on_cpu(name: str) -> Iterator[None]:
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
