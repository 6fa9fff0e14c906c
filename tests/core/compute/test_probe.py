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
from corral._compute.probe import (
    OTHER_DIM_SIZE,
    PROBE_ROWS,
    TOLERANCE_ULPS,
    generate_row,
    plan_batching,
    probe_rows,
    tolerance,
)
from corral._onnx.signature import Signature, TensorSpec
from corral.testing import build_layer_norm_cnn, build_linear, build_mlp, build_tree
from tests.helpers import (
    add_model,
    build_identity,
    build_reshape,
    build_row_coupling,
    build_rows_of_five,
    build_slow_loop,
    build_softmax_over_rows,
    build_time_major_lstm,
    load_benchmark,
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


def test_the_probe_runs_rows_alone_stacked_reordered_and_among_copies():
    seen: list[tuple[int, ...]] = []

    def position_dependent(feed: Mapping[str, np.ndarray]) -> dict[str, Any]:
        # Row i gains i: the same row at another position comes back otherwise.
        x = feed["X"]
        seen.append(x.shape)
        return {"Y": x + np.arange(x.shape[0], dtype=np.float32)[:, None]}

    assert probe_rows(ROWS, position_dependent) == (
        "output 'Y' of row 2 differs when stacked in another order and count: by 2, more "
        "than rounding allows (3.66e-05)"
    )
    # Alone, stacked, among copies of row 1, then rows 2 and 0.
    assert seen == [(1, 4)] * PROBE_ROWS + [(PROBE_ROWS, 4), (PROBE_ROWS, 4), (2, 4)]


def batch_mean_coupling(weight: float) -> Any:
    """``Y = X + weight * mean of the batch's rows``: coupled, by as little as ``weight``."""

    def run(feed: Mapping[str, np.ndarray]) -> dict[str, Any]:
        x = feed["X"]
        return {"Y": x + np.float32(weight) * x.mean(axis=0, keepdims=True)}

    return run


@pytest.mark.parametrize("weight", [1.0, 1e-3, 1e-6])
def test_a_coupling_however_small_is_refused(weight: float):
    # 1e-3 of the batch's mean moves a row by ~1e-4 of its values, ten times the rounding
    # allowed (7.6e-6 of them); 1e-6 moves it by less than that rounding. Both are another
    # row's content reaching this one, which the run among copies shows bit for bit.
    assert probe_rows(ROWS, batch_mean_coupling(weight)) == (
        "output 'Y' of row 1 changes with the other rows of its run (same shape, same "
        "position, other rows' contents)"
    )


def rounding_noise(ulps: int) -> Any:
    """Row-independent, but every run of 2 rows rounds its rows ``ulps`` ULPs up."""

    def run(feed: Mapping[str, np.ndarray]) -> dict[str, Any]:
        x = feed["X"].copy()
        if x.shape[0] == 2:
            for _ in range(ulps):
                x = np.nextafter(x, np.float32(np.inf))
        return {"Y": x}

    return run


def test_rounding_within_the_tolerance_passes_and_beyond_it_is_a_finding():
    assert TOLERANCE_ULPS == 64
    assert tolerance(np.dtype(np.float32)) == pytest.approx(64 * 2.0**-23)
    assert tolerance(np.dtype(np.float64)) == pytest.approx(64 * 2.0**-52)
    assert tolerance(np.dtype(np.int64)) == tolerance(np.dtype(np.bool_)) == 0.0
    assert probe_rows(ROWS, rounding_noise(8)) is None
    found = probe_rows(ROWS, rounding_noise(4096))
    assert found is not None
    assert found.startswith("output 'Y' of row 2 differs when stacked in another order and count")


def test_integer_and_bool_outputs_compare_exactly():
    signature = Signature(
        (TensorSpec("X", F32, ("N", 4), "tensor(float)"),),
        (
            TensorSpec("label", np.dtype(np.int64), ("N",), "tensor(int64)"),
            TensorSpec("flag", np.dtype(np.bool_), ("N",), "tensor(bool)"),
        ),
    )

    def labels(shift_alone: int, flip_reordered: bool) -> Any:
        def run(feed: Mapping[str, np.ndarray]) -> dict[str, Any]:
            x = feed["X"]
            label = np.argmax(x, axis=1).astype(np.int64)
            flag = x[:, 0] > 0
            if x.shape[0] == 1:
                label = label + shift_alone
            if x.shape[0] == 2 and flip_reordered:
                flag = ~flag
            return {"label": label, "flag": flag}

        return run

    assert probe_rows(signature, labels(0, False)) is None
    assert probe_rows(signature, labels(1, False)) == (
        "output 'label' of row 0 differs when stacked with other rows"
    )
    assert probe_rows(signature, labels(0, True)) == (
        "output 'flag' of row 2 differs when stacked in another order and count"
    )


def test_nan_and_infinities_must_stay_where_they_are():
    def infinite_when_reordered(feed: Mapping[str, np.ndarray]) -> dict[str, Any]:
        x = feed["X"].copy()
        x[:, 0] = np.nan
        if x.shape[0] == 2:
            x[:, 1] = np.inf
        return {"Y": x}

    def nan_everywhere(feed: Mapping[str, np.ndarray]) -> dict[str, Any]:
        return {"Y": np.full(feed["X"].shape, np.nan, np.float32)}

    assert probe_rows(ROWS, infinite_when_reordered) == (
        "output 'Y' of row 2 differs when stacked in another order and count"
    )
    assert probe_rows(ROWS, nan_everywhere) is None


def test_an_output_of_another_dtype_when_stacked_is_a_finding():
    def wider_when_stacked(feed: Mapping[str, np.ndarray]) -> dict[str, Any]:
        x = feed["X"]
        return {"Y": x if x.shape[0] == 1 else x.astype(np.float64)}

    assert probe_rows(ROWS, wider_when_stacked) == (
        "output 'Y' of row 0 is float64 when stacked with other rows, float32 alone"
    )


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
    add_model(tmp_path, "softmax", build_softmax_over_rows())
    add_model(tmp_path, "layer_norm", build_layer_norm_cnn())
    add_model(tmp_path, "five", build_rows_of_five())
    add_model(tmp_path, "reshape", build_reshape())
    add_model(tmp_path, "loop", build_slow_loop())
    add_model(tmp_path, "lstm_declared", build_time_major_lstm(), toml="max_batch_size = 16\n")
    add_model(tmp_path, "mlp_off", build_mlp(seed=3), toml="max_batch_size = 0\n")
    caplog.set_level(logging.INFO, logger="corral._host.loader")
    with Host(tmp_path) as host:
        for name in ("tree", "linear", "mlp", "int8", "layer_norm"):
            rows, reason = batching_of(host, name)
            assert rows == 64, (name, reason)
            assert reason.startswith("batched (probed): "), (name, reason)
        coupled = (
            "not batched: the probe found output 'Y' of row 1 changes with the other rows of "
            "its run (same shape, same position, other rows' contents)"
        )
        assert batching_of(host, "lstm") == (0, coupled)
        assert batching_of(host, "coupled") == (0, coupled)
        assert batching_of(host, "softmax") == (0, coupled)
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
    assert len(logged) == 13  # one line per load
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


def test_the_layer_norm_cnn_differs_alone_by_rounding_only(tmp_path: Path):
    # The stand-in for magika: its rows are independent, yet a row alone comes back
    # otherwise than in a batch (onnxruntime sums one row in another order), which the exact
    # probe took for a coupling.
    add_model(tmp_path, "cnn", build_layer_norm_cnn())
    with Host(tmp_path, batching=False) as host:
        host.load("cnn")
        rows = np.random.default_rng(5).standard_normal((3, 64, 16)).astype(np.float32)
        alone = np.concatenate([host.infer("cnn", {"X": rows[i : i + 1]})["Y"] for i in range(3)])
        together = host.infer("cnn", {"X": rows})["Y"]
    assert not np.array_equal(alone, together)
    np.testing.assert_allclose(together, alone, rtol=0, atol=1e-6)


@pytest.mark.timeout(120)
def test_magika_from_its_wheel_is_batched(tmp_path: Path):
    real_models = load_benchmark("real_models.py")
    try:
        files, _ = real_models.fetch_models(["magika"])
    except real_models.ModelsUnavailable as exc:
        pytest.skip(f"the magika wheel could not be fetched: {exc}")
    (tmp_path / "magika" / "1").mkdir(parents=True)
    (tmp_path / "magika" / "1" / "model.onnx").write_bytes(files["magika"].read_bytes())
    with Host(tmp_path) as host:
        rows, reason = batching_of(host, "magika")
    assert rows == 64, reason
    assert reason.startswith("batched (probed): "), reason
