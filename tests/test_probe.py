"""The batching decision: declared in model.toml, probed at load, or off; and its reason."""

from __future__ import annotations

import logging
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from onnx import TensorProto

import corral
from corral import Host
from corral._probe import OTHER_DIM_SIZE, PROBE_ROWS, generate_row, plan_batching, probe_rows
from corral._signature import Signature, TensorSpec
from corral.testing import build_linear, build_mlp, build_tree
from tests.helpers import (
    add_model,
    build_identity,
    build_reshape,
    build_row_coupling,
    build_rows_of_five,
    build_slow_loop,
    build_time_major_lstm,
)

F32 = np.dtype(np.float32)
ROWS = Signature(
    (TensorSpec("X", F32, ("N", 4), "tensor(float)"),),
    (TensorSpec("Y", F32, ("N", 4), "tensor(float)"),),
)
FIXED = Signature(
    (TensorSpec("X", F32, (1, 4), "tensor(float)"),),
    (TensorSpec("Y", F32, (1, 4), "tensor(float)"),),
)


def never_run(feed: Mapping[str, np.ndarray]) -> dict[str, Any]:
    raise AssertionError("the probe ran where nothing was to be probed")


def identity(feed: Mapping[str, np.ndarray]) -> dict[str, Any]:
    return {"Y": feed["X"].copy()}


def plan(signature: Signature = ROWS, run: Any = never_run, **kwargs: Any) -> Any:
    options: dict[str, Any] = {"max_batch_size": None, "enabled": True, "default_rows": 64}
    options.update(kwargs)
    return plan_batching(signature, run, label="m:1", **options)


# -- the decision, without a model -----------------------------------------------------------


def test_model_toml_and_the_host_option_decide_without_a_probe():
    declared = plan(max_batch_size=8)
    assert declared.max_rows == 8
    assert declared.reason == "batched (declared): max_batch_size = 8 in model.toml; not probed"
    off = plan(max_batch_size=0)
    assert (off.max_rows, off.reason) == (0, "not batched: max_batch_size = 0 in model.toml")
    host_off = plan(enabled=False)
    assert host_off.max_rows == 0
    assert "batching=False" in host_off.reason


def test_a_signature_that_cannot_batch_is_not_probed_and_says_why():
    decided = plan(FIXED)
    assert decided.max_rows == 0
    assert decided.reason == "not batched: input 'X' has a fixed first dimension (float32[1, 4])"


@pytest.mark.parametrize("enabled", [True, False])
def test_declaring_max_batch_size_for_a_signature_that_cannot_batch_is_an_error(enabled: bool):
    with pytest.raises(corral.ModelConfigError, match="max_batch_size = 8") as info:
        plan(FIXED, max_batch_size=8, enabled=enabled)
    assert "fixed first dimension" in str(info.value)


def test_probed_rows_independent_batch_with_the_default_rows():
    decided = plan(run=identity)
    assert decided.max_rows == 64
    assert decided.reason.startswith("batched (probed): ")


def test_the_probe_compares_each_row_alone_stacked_and_permuted():
    seen: list[tuple[int, ...]] = []

    def position_dependent(feed: Mapping[str, np.ndarray]) -> dict[str, Any]:
        # Row i gains i: equal alone (every row is row 0) only for the first row.
        x = feed["X"]
        seen.append(x.shape)
        return {"Y": x + np.arange(x.shape[0], dtype=np.float32)[:, None]}

    assert probe_rows(ROWS, position_dependent) == (
        "output 'Y' of row 1 differs when stacked with other rows"
    )
    assert seen == [(1, 4)] * PROBE_ROWS + [(PROBE_ROWS, 4)]


def test_a_model_whose_outputs_do_not_have_the_rows_is_not_batched():
    def first_row(feed: Mapping[str, np.ndarray]) -> dict[str, Any]:
        return {"Y": feed["X"][:1]}

    assert probe_rows(ROWS, first_row) == (
        "output 'Y' of shape [1, 4] for 3 input rows: its first dimension is not the rows"
    )


def test_a_cancelled_run_is_raised_not_taken_for_a_finding():
    def cancelled(feed: Mapping[str, np.ndarray]) -> dict[str, Any]:
        raise corral.RunCancelled("stopped by shutdown")

    with pytest.raises(corral.RunCancelled):
        probe_rows(ROWS, cancelled)


def test_any_other_exception_of_a_run_is_raised():
    def broken(feed: Mapping[str, np.ndarray]) -> dict[str, Any]:
        raise MemoryError

    with pytest.raises(MemoryError):
        probe_rows(ROWS, broken)


def test_generated_rows_are_seeded_typed_and_sized():
    signature = Signature(
        (
            TensorSpec("f", np.dtype(np.float16), ("N", "T", 3), "tensor(float16)"),
            TensorSpec("i", np.dtype(np.int64), (None, "T"), "tensor(int64)"),
            TensorSpec("b", np.dtype(np.bool_), ("N",), "tensor(bool)"),
        ),
        (),
    )
    first = generate_row(signature, np.random.default_rng(1))
    again = generate_row(signature, np.random.default_rng(1))
    assert {name: a.shape for name, a in first.items()} == {
        "f": (1, OTHER_DIM_SIZE, 3),
        "i": (1, OTHER_DIM_SIZE),
        "b": (1,),
    }
    assert {name: a.dtype for name, a in first.items()} == {
        "f": np.float16,
        "i": np.int64,
        "b": np.bool_,
    }
    assert set(np.unique(first["i"])) <= {0, 1}
    for name, array in first.items():
        np.testing.assert_array_equal(array, again[name])


# -- real models, loaded by a Host -----------------------------------------------------------


def batching_of(host: Host, name: str) -> tuple[int, str]:
    host.load(name)
    (status,) = host.status(name).versions
    with host.acquire(name) as lease:
        assert lease.batching == status.batching
        assert status.batching is not None
        return lease.max_batch_size, status.batching


@pytest.mark.timeout(60)
def test_real_models_are_batched_only_where_rows_are_independent(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
):
    add_model(tmp_path, "tree", build_tree(seed=1))
    add_model(tmp_path, "linear", build_linear(seed=2))
    add_model(tmp_path, "mlp", build_mlp(seed=3))
    add_model(tmp_path, "int8", build_identity(TensorProto.INT8))
    add_model(tmp_path, "lstm", build_time_major_lstm())
    add_model(tmp_path, "coupled", build_row_coupling())
    add_model(tmp_path, "five", build_rows_of_five())
    add_model(tmp_path, "reshape", build_reshape())
    add_model(tmp_path, "loop", build_slow_loop())
    add_model(tmp_path, "lstm_declared", build_time_major_lstm(), toml="max_batch_size = 16\n")
    add_model(tmp_path, "mlp_off", build_mlp(seed=3), toml="max_batch_size = 0\n")
    caplog.set_level(logging.INFO, logger="corral._loader")
    with Host(tmp_path) as host:
        for name in ("tree", "linear", "mlp", "int8"):
            rows, reason = batching_of(host, name)
            assert rows == 64, (name, reason)
            assert reason.startswith("batched (probed): "), (name, reason)
        assert batching_of(host, "lstm") == (
            0,
            "not batched: the probe found output 'Y' of row 1 differs when stacked with other rows",
        )
        assert batching_of(host, "coupled") == (
            0,
            "not batched: the probe found output 'Y' of row 0 differs when stacked with other rows",
        )
        rows, reason = batching_of(host, "five")
        assert rows == 0
        assert reason.startswith(
            "not batched: the probe found the model failing on its generated inputs: "
            "model 'five:1' failed"
        )
        assert "\n" not in reason
        # It serves what its users send all the same, one request per run.
        x = np.arange(10, dtype=np.float32).reshape(2, 5)
        np.testing.assert_array_equal(host.infer("five", {"X": x})["Y"], x)
        assert batching_of(host, "reshape") == (
            0,
            "not batched: input 'S' has a fixed first dimension (int64[1])",
        )
        assert batching_of(host, "loop")[1].startswith("not batched: input 'M' has no declared")
        # model.toml wins over the probe either way: the user knows the model.
        assert batching_of(host, "lstm_declared") == (
            16,
            "batched (declared): max_batch_size = 16 in model.toml; not probed",
        )
        assert batching_of(host, "mlp_off") == (
            0,
            "not batched: max_batch_size = 0 in model.toml",
        )
    logged = [r.getMessage() for r in caplog.records if "batched" in r.getMessage()]
    assert len(logged) == 11  # one line per load
    assert "corral: lstm version 1 not batched: the probe found output 'Y'" in "\n".join(logged)


@pytest.mark.timeout(60)
def test_a_declared_max_batch_size_the_model_cannot_take_fails_the_load(tmp_path: Path):
    add_model(tmp_path, "loop", build_slow_loop(), toml="max_batch_size = 8\n")
    with Host(tmp_path) as host:
        with pytest.raises(corral.ModelConfigError, match="max_batch_size = 8") as info:
            host.load("loop")
        assert "input 'M' has no declared first dimension" in str(info.value)
        (status,) = host.status("loop").versions
        assert status.state is corral.ModelState.FAILED
        assert status.failure is not None
        assert "max_batch_size" in status.failure


@pytest.mark.timeout(60)
def test_batching_off_for_the_host_probes_nothing(tmp_path: Path):
    add_model(tmp_path, "mlp", build_mlp(seed=3))
    with Host(tmp_path, batching=False) as host:
        assert batching_of(host, "mlp") == (
            0,
            "not batched: batching is off for this Host (batching=False)",
        )
