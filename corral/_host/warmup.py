"""A load's warm-up runs: sized before anything is made, stopped when the load's time is up.

A model's warm-up (model.toml's ``warmup = true``: one run on zeros; a config.pbtxt's
``model_warmup`` samples, each run ``count`` times) runs on the load worker after the session
is built and before the version is published. Two things bound it:

- its arrays' bytes, computed from shapes alone (:func:`check_warmup_room`), against the
  memory budget's room beside the model's own estimate (a config.pbtxt sample was checked
  against :data:`~corral._models.pbtxt.warmup.MAX_WARMUP_BYTES` when its file was read);
- its time: when the load's :class:`~corral._base.load_workers.Claim` expires (the load timeout, or
  the Host closing), the session's runs in flight are stopped at their next graph node
  (``RunOptions.terminate``, through :meth:`Session.close` with ``cancel=True``), so the load
  thread returns instead of running on, abandoned, to the end of the warm-up.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import math

import numpy as np

from corral._base import (
    Claim,
    CorralError,
    DrainTimeout,
    ModelInvalid,
    ModelLoadError,
    ModelTooLarge,
)
from corral._compute import Session
from corral._models import (
    MAX_WARMUP_BYTES,
    ModelConfig,
    WarmupSample,
    triton_type,
    warmup_bytes,
    warmup_feed,
)

__all__ = ["WARMING_UP", "check_warmup_room", "run_warmups"]

logger = logging.getLogger(__name__)

#: What a claim says its load is doing while the warm-up runs (:attr:`Claim.activity`).
WARMING_UP = "running its warm-up"


def check_warmup_room(config: ModelConfig, label: str, room: int | None) -> None:
    """Refuse (:class:`ModelTooLarge`) a warm-up sample whose arrays would pass ``room`` bytes.

    ``room`` is what the memory budget leaves beside the model's own estimate (None: no
    budget). Shapes only: called before the session is built or anything allocated.
    """
    if room is None:
        return
    batched = bool(config.max_batch_size)
    for sample in config.warmup_samples:
        size = warmup_bytes(sample, batched=batched)
        if size > room:
            raise ModelTooLarge(
                f"{label!r}: {_shown(sample)} takes {size:,} bytes once made "
                f"({_sizes(sample, batched)}), past the {max(room, 0):,} bytes the memory "
                "budget leaves beside the model's own estimate"
            )


def run_warmups(session: Session, config: ModelConfig, claim: Claim, room: int | None) -> None:
    """Run the warm-ups ``config`` asks for; stopped if ``claim`` expires meanwhile.

    Raises :class:`ModelLoadError` naming the warm-up that failed or was stopped.
    """
    if not config.warmup and not config.warmup_samples:
        return
    claim.set_activity(WARMING_UP)
    # Registered for the rest of the build: the batching probe's runs are stopped too.
    if not claim.on_expire(functools.partial(_stop_runs, session)):
        raise ModelLoadError(f"{session.name!r}: the load's time ran out before its warm-up")
    if config.warmup:
        _warm_up(session, room)
    for sample in config.warmup_samples:
        doing = f"{WARMING_UP} ({_shown(sample)}, {sample.count} run(s))"
        claim.set_activity(doing)
        # A warm-up may be long: the log says where a load spends its time.
        logger.info("corral: %s: %s", session.name, doing)
        _run_warmup_sample(session, sample, batched=bool(config.max_batch_size))


def _stop_runs(session: Session) -> None:
    """Stop the session's runs at their next node; the load thread then closes the session."""
    # Nothing waits here (timeout 0): this runs on the load workers' watchdog.
    with contextlib.suppress(DrainTimeout):
        session.close(0, cancel=True)


def _warm_up(session: Session, room: int | None) -> None:
    """Run once on zeros (dynamic dims as 1); a failure fails the load."""
    shapes = {}
    for spec in session.inputs:
        if spec.dtype is None:
            raise ModelInvalid(
                f"cannot warm up {session.name!r}: input {spec.name!r} is {spec.onnx_type}"
            )
        shapes[spec.name] = (tuple(d if isinstance(d, int) else 1 for d in spec.shape), spec.dtype)
    size = sum(math.prod(shape) * dtype.itemsize for shape, dtype in shapes.values())
    limit = MAX_WARMUP_BYTES if room is None else min(MAX_WARMUP_BYTES, room)
    if size > limit:
        listed = ", ".join(
            f"{name!r} {list(shape)} ({math.prod(shape) * dtype.itemsize:,} bytes)"
            for name, (shape, dtype) in shapes.items()
        )
        raise ModelTooLarge(
            f"cannot warm up {session.name!r} (model.toml's warmup = true): its inputs of zeros "
            f"take {size:,} bytes ({listed}), past the {limit:,}-byte limit on a warm-up"
        )
    feed = {name: np.zeros(shape, dtype=dtype) for name, (shape, dtype) in shapes.items()}
    try:
        session.run(feed)
    except CorralError as exc:
        raise ModelInvalid(f"warming up {session.name!r} failed: {exc}") from exc


def _run_warmup_sample(session: Session, sample: WarmupSample, *, batched: bool) -> None:
    """Run a config.pbtxt's warm-up sample ``count`` times; a failure fails the load, naming it."""
    shown = _shown(sample)
    specs = {spec.name: spec for spec in session.signature.inputs}
    for item in sample.inputs:
        spec = specs.get(item.name)
        if spec is None:
            raise ModelInvalid(
                f"{session.name!r}: {shown} gives input {item.name!r}, which the model does "
                f"not have; its inputs are {', '.join(repr(name) for name in specs)}"
            )
        # As in Triton, a sample's type is the input's: no cast, even a safe one.
        if triton_type(spec) != item.data_type:
            raise ModelInvalid(
                f"{session.name!r}: {shown} gives input {item.name!r} as {item.data_type}, "
                f"but the model's is {triton_type(spec) or spec.onnx_type} ({spec.describe()})"
            )
    try:
        feed = warmup_feed(sample, batched=batched)
        for _ in range(sample.count):
            session.run(feed)
    except CorralError as exc:
        raise ModelInvalid(f"{session.name!r}: {shown} failed: {exc}") from exc


def _shown(sample: WarmupSample) -> str:
    return f"warm-up sample {sample.name!r}" if sample.name else "a warm-up sample"


def _sizes(sample: WarmupSample, batched: bool) -> str:
    rows = (sample.batch_size,) if batched else ()
    return ", ".join(
        f"input {item.name!r} {item.data_type} {list(rows + item.dims)}: "
        f"{warmup_bytes(WarmupSample('', sample.batch_size, 1, (item,)), batched=batched):,} "
        "bytes"
        for item in sample.inputs
    )
