"""Session: loading, signatures, input checks, policies, leases and close."""

from __future__ import annotations

import threading
from pathlib import Path

import numpy as np
import pytest
from onnx import TensorProto, helper

import corral
from corral import ConcurrencyPolicy, SessionState
from corral._onnx import ort as _ort
from corral._onnx.providers import PROVIDER_TABLE, ProviderTraits
from corral.testing import emulate_provider
from tests.helpers import build_reshape, reference_run, wait_until

X = np.random.default_rng(0).standard_normal((5, 4)).astype(np.float32)


# -- loading ---------------------------------------------------------------------------------


def test_outputs_match_onnxruntime(any_model):
    session = corral.Session(any_model)
    outputs = session.run({"X": X})
    assert list(outputs) == ["Y"]
    np.testing.assert_array_equal(outputs["Y"], reference_run(any_model, {"X": X})[0])


def test_loads_from_a_path_and_names_itself_after_it(model_path: Path):
    session = corral.Session(model_path)
    assert session.name == str(model_path)
    assert session.run({"X": X})["Y"].shape == (5, 1)
    assert corral.Session(str(model_path), name="churn").name == "churn"


def test_signature_reports_names_dtypes_and_dynamic_dims(mlp_model):
    session = corral.Session(mlp_model)
    (spec,) = session.inputs
    assert spec.name == "X"
    assert spec.dtype == np.float32
    assert spec.shape == ("N", 4)
    assert spec.describe() == "float32[N, 4]"
    assert [o.name for o in session.outputs] == ["Y"]
    assert session.providers == ("CPUExecutionProvider",)


def test_garbage_bytes_raise_model_load_error():
    with pytest.raises(corral.ModelLoadError, match="could not load 7-byte model"):
        corral.Session(b"garbage")
    assert corral.runtime().stats().sessions_alive == 0


def test_missing_file_raises_model_load_error_naming_it(tmp_path: Path):
    missing = tmp_path / "nope.onnx"
    with pytest.raises(corral.ModelLoadError, match=r"nope\.onnx"):
        corral.Session(missing)


def test_a_model_of_the_wrong_type_is_a_type_error():
    with pytest.raises(TypeError, match="model must be a path or the model's bytes, got int"):
        corral.Session(42)  # type: ignore[arg-type]


def test_an_unavailable_provider_is_refused_not_replaced(mlp_model):
    with pytest.raises(corral.ProviderUnavailable, match="'NoSuchExecutionProvider'"):
        corral.Session(mlp_model, providers=["NoSuchExecutionProvider"])
    with pytest.raises(corral.ProviderUnavailable, match="empty"):
        corral.Session(mlp_model, providers=[])


def test_provider_options_pass_through(mlp_model):
    session = corral.Session(mlp_model, providers=[("CPUExecutionProvider", {})])
    assert session.providers == ("CPUExecutionProvider",)


# -- input checks ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("inputs", "fragment"),
    [
        ({}, r"missing input 'X' \(float32\[N, 4\]\)"),
        ({"X": X, "Z": X}, "unknown input 'Z'; the model's inputs are 'X' float32"),
        ({"X": X[0]}, r"input 'X' must have rank 2 \(float32\[N, 4\]\), got shape \[4\]"),
        ({"X": np.ones((2, 3), np.float32)}, "must have size 4 in dimension 1"),
        ({"X": X.astype(np.float64)}, "must be float32.*float64 cannot be cast"),
        ({"X": [[0.5, 1.0, 2.0]]}, "must have size 4 in dimension 1"),
        ({"X": [[1.0, 2.0], [3.0]]}, "could not be read as an array"),
        ({"X": np.array([["a", "b", "c", "d"]])}, "cannot be cast"),
    ],
)
def test_bad_inputs_raise_invalid_input_naming_the_tensor(mlp_model, inputs, fragment):
    session = corral.Session(mlp_model)
    with pytest.raises(corral.InvalidInput, match=fragment) as info:
        session.run(inputs)
    assert info.value.tensor in ("X", "Z")
    assert session.in_flight == 0


def test_inputs_must_be_a_mapping(mlp_model):
    session = corral.Session(mlp_model)
    with pytest.raises(corral.InvalidInput, match="mapping"):
        session.run([X])  # type: ignore[arg-type]


def test_safe_casts_lists_and_non_contiguous_arrays_are_accepted(mlp_model):
    session = corral.Session(mlp_model)
    expected = session.run({"X": X})["Y"]
    np.testing.assert_array_equal(session.run({"X": X.tolist()})["Y"], expected)
    wide = np.repeat(X, 2, axis=1)[:, ::2]
    assert not wide.flags.c_contiguous
    np.testing.assert_array_equal(session.run({"X": wide})["Y"], expected)
    ints = np.arange(8, dtype=np.int16).reshape(2, 4)
    np.testing.assert_array_equal(
        session.run({"X": ints})["Y"], session.run({"X": ints.astype(np.float32)})["Y"]
    )


def _string_identity() -> bytes:
    graph = helper.make_graph(
        [helper.make_node("Identity", ["S"], ["T"])],
        "strings",
        [helper.make_tensor_value_info("S", TensorProto.STRING, ["N"])],
        [helper.make_tensor_value_info("T", TensorProto.STRING, ["N"])],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model.SerializeToString()


def test_string_inputs_take_str_and_utf8_bytes_alike():
    # onnxruntime reads object elements with str(): bytes would arrive as "b'...'".
    session = corral.Session(_string_identity())
    as_bytes = np.array([b"ab", "\u00e9".encode(), b""], dtype=object)
    as_text = np.array(["ab", "\u00e9", ""], dtype=object)
    for given in (as_bytes, as_text, np.array(["ab", "\u00e9", ""]), np.array([b"ab"], "S")):
        out = session.run({"S": given})["T"]
        assert out.tolist() == [v.decode() if isinstance(v, bytes) else v for v in given.tolist()]
    with pytest.raises(corral.InvalidInput, match="'S' holds bytes that are not UTF-8"):
        session.run({"S": np.array([b"\xff"], dtype=object)})
    with pytest.raises(corral.InvalidInput, match="element 1 is a int"):
        session.run({"S": np.array(["a", 3], dtype=object)})


def test_outputs_selects_and_checks_names(mlp_model):
    session = corral.Session(mlp_model)
    assert list(session.run({"X": X}, outputs=["Y"])) == ["Y"]
    with pytest.raises(corral.InvalidInput, match="unknown output 'P'"):
        session.run({"X": X}, outputs=["P"])
    with pytest.raises(corral.InvalidInput, match="sequence of names"):
        session.run({"X": X}, outputs="Y")


def test_errors_onnxruntime_finds_at_run_time_are_translated():
    session = corral.Session(build_reshape(), name="reshaper")
    # Valid for corral's checks (dtypes and ranks match), impossible for Reshape.
    feed = {"X": np.ones(5, np.float32), "S": np.array([7], np.int64)}
    with pytest.raises(
        corral.InferenceError, match="model 'reshaper' failed while running"
    ) as info:
        session.run(feed)
    assert "ONNXRuntimeError" not in str(info.value)
    assert info.value.__cause__ is not None
    assert session.in_flight == 0
    ok = session.run({"X": np.ones(6, np.float32), "S": np.array([6], np.int64)})
    assert ok["Y"].shape == (6,)


# -- policies --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("spec", "kind", "size"),
    [("shared", "shared", 1), ("exclusive", "exclusive", 1), ("pool:3", "pool", 3)],
)
def test_policies_parse_and_build_their_replicas(mlp_model, spec, kind, size):
    session = corral.Session(mlp_model, concurrency=spec)
    assert session.policy == ConcurrencyPolicy(kind, size)
    assert str(session.policy) == spec
    assert session.replicas == size
    np.testing.assert_array_equal(session.run({"X": X})["Y"], reference_run(mlp_model, {"X": X})[0])


def test_instrument_wraps_every_replica_and_is_refused_while_a_pool_session_is_held(mlp_model):
    session = corral.Session(mlp_model, concurrency="pool:2")
    seen: list[int] = []

    class Counted:
        def __init__(self, inner):
            self.inner = inner

        def run(self, names, feed, options):
            seen.append(id(self))
            return self.inner.run(names, feed, options)

    session.instrument(Counted)
    assert session.replicas == 2
    for _ in range(4):
        session.run({"X": X})
    assert len(seen) == 4  # every run went through a wrapper
    with session.acquire():  # a lease holds no replica: still allowed
        session.instrument(lambda replica: replica)
    held = threading.Event()
    release = threading.Event()

    class Holding(Counted):
        def run(self, names, feed, options):
            held.set()
            assert release.wait(10)
            return self.inner.run(names, feed, options)

    session.instrument(Holding)
    runner = threading.Thread(target=session.run, args=({"X": X},))
    runner.start()
    try:
        assert held.wait(10)
        with pytest.raises(RuntimeError, match="while no run holds"):
            session.instrument(Counted)
    finally:
        release.set()
        runner.join(timeout=10)
    assert session.waiting_runs == 0
    session.close()
    assert session.replicas == 0


@pytest.mark.parametrize("spec", ["pool:0", "pool:x", "pool", "many", ""])
def test_bad_policies_are_refused(mlp_model, spec):
    with pytest.raises(ValueError, match="concurrency must be"):
        corral.Session(mlp_model, concurrency=spec)


def test_policy_objects_check_their_own_fields():
    with pytest.raises(ValueError, match="cannot have size 2"):
        ConcurrencyPolicy("shared", 2)
    with pytest.raises(ValueError, match="unknown concurrency policy kind"):
        ConcurrencyPolicy("wild")  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("provider", "expected"),
    [
        ("CPUExecutionProvider", "shared"),
        ("CUDAExecutionProvider", "shared"),
        ("DmlExecutionProvider", "exclusive+device"),
        ("WebGpuExecutionProvider", "exclusive+device"),
        ("SomeFutureExecutionProvider", "exclusive"),
    ],
)
def test_auto_policy_follows_the_provider_table(mlp_model, provider, expected):
    with emulate_provider(provider):
        session = corral.Session(mlp_model, providers=[provider])
    assert str(session.policy) == expected
    assert session.run({"X": X})["Y"].shape == (5, 1)


def test_auto_pools_as_many_sessions_as_compute_workers(mlp_model, monkeypatch):
    # No provider of the table pools today (DirectML did until its runs on different
    # sessions were found to crash, #20713): a row that does still gets its pool.
    row = ProviderTraits("pool", True, "a provider whose sessions each run one at a time")
    monkeypatch.setitem(PROVIDER_TABLE, "PooledExecutionProvider", row)
    with emulate_provider("PooledExecutionProvider"):
        session = corral.Session(mlp_model, providers=["PooledExecutionProvider"])
    assert str(session.policy) == f"pool:{corral.runtime().options.compute_workers}"


def test_auto_takes_the_strictest_of_several_providers(mlp_model):
    with emulate_provider("DmlExecutionProvider"):
        session = corral.Session(
            mlp_model, providers=["DmlExecutionProvider", "CPUExecutionProvider"]
        )
    assert str(session.policy) == "exclusive+device"
    assert session.devices == (("DmlExecutionProvider", 0),)


def test_an_explicit_policy_overrides_the_table_but_not_its_device_lane(mlp_model):
    with emulate_provider("DmlExecutionProvider"):
        session = corral.Session(
            mlp_model, providers=["DmlExecutionProvider"], concurrency="shared"
        )
    assert str(session.policy) == "shared+device"


class _CountingLock:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.entered = 0

    def __enter__(self) -> None:
        self._lock.acquire()
        self.entered += 1

    def __exit__(self, *exc: object) -> None:
        self._lock.release()


def test_construction_is_serialized_only_for_providers_that_race(mlp_model, monkeypatch):
    lock = _CountingLock()
    monkeypatch.setattr(_ort, "CONSTRUCTION_LOCK", lock)
    corral.Session(mlp_model, concurrency="pool:2")
    assert lock.entered == 0
    with emulate_provider("TensorrtExecutionProvider"):
        corral.Session(mlp_model, providers=["TensorrtExecutionProvider"], concurrency="pool:2")
    assert lock.entered == 2


def test_emulation_ends_with_its_block(mlp_model):
    with emulate_provider("DmlExecutionProvider"), emulate_provider("DmlExecutionProvider"):
        pass
    with pytest.raises(corral.ProviderUnavailable):
        corral.Session(mlp_model, providers=["DmlExecutionProvider"])


# -- leases and close ------------------------------------------------------------------------


def test_close_is_idempotent_and_runs_after_close_fail(mlp_model):
    session = corral.Session(mlp_model)
    session.close()
    session.close()
    assert session.state is SessionState.CLOSED
    with pytest.raises(corral.SessionClosed, match="closed by close"):
        session.run({"X": X})
    with pytest.raises(corral.SessionClosed):
        session.acquire()


def test_context_manager_closes(mlp_model):
    with corral.Session(mlp_model) as session:
        assert session.state is SessionState.READY
    assert session.state is SessionState.CLOSED


def test_close_waits_for_a_lease(mlp_model):
    session = corral.Session(mlp_model)
    lease = session.acquire()
    closer = threading.Thread(target=session.close, kwargs={"timeout": 10})
    closer.start()
    wait_until(lambda: session.state is SessionState.CLOSING)
    # Closing: new work is refused while the lease still holds the session open.
    with pytest.raises(corral.SessionClosed, match="closing"):
        session.run({"X": X})
    assert closer.is_alive()
    lease.release()
    lease.release()  # idempotent
    closer.join(timeout=10)
    assert not closer.is_alive()
    assert session.state is SessionState.CLOSED
    assert session.in_flight == 0


def test_close_times_out_then_releases_when_the_lease_ends(mlp_model):
    session = corral.Session(mlp_model)
    with session.acquire():
        with pytest.raises(corral.DrainTimeout, match="1 run"):
            session.close(timeout=0.01)
        assert session.state is SessionState.CLOSING
    assert session.state is SessionState.CLOSED
    assert session.replicas == 0


def test_cancelling_close_stops_a_run_in_flight(slow_model):
    session = corral.Session(slow_model)
    outcome: list[BaseException] = []

    def endless() -> None:
        try:
            session.run({"M": np.array(10**12, np.int64), "start": np.zeros(1, np.float32)})
        except BaseException as exc:
            outcome.append(exc)

    runner = threading.Thread(target=endless)
    runner.start()
    wait_until(lambda: session.in_flight == 1)
    session.close(timeout=10, cancel=True)
    runner.join(timeout=10)
    assert not runner.is_alive()
    assert len(outcome) == 1
    assert isinstance(outcome[0], corral.RunCancelled)
    assert session.state is SessionState.CLOSED


def test_close_without_cancel_lets_the_run_finish(slow_model):
    session = corral.Session(slow_model)
    results: list[object] = []
    started = threading.Event()

    def bounded() -> None:
        started.set()
        results.append(
            session.run({"M": np.array(20_000, np.int64), "start": np.zeros(1, np.float32)})
        )

    runner = threading.Thread(target=bounded)
    runner.start()
    started.wait(timeout=10)
    session.close(timeout=30)
    runner.join(timeout=10)
    # Either the run got in before close and finished, or close came first and refused it;
    # in both cases close returned with nothing in flight.
    assert session.in_flight == 0
    assert session.state is SessionState.CLOSED
    if results:
        np.testing.assert_array_equal(results[0]["Y"], [20_000.0])  # type: ignore[index]


def test_close_from_many_threads_at_once(mlp_model):
    session = corral.Session(mlp_model, concurrency="pool:2")
    lease = session.acquire()
    start = threading.Barrier(9)
    errors: list[BaseException] = []

    def close() -> None:
        start.wait(timeout=10)
        try:
            session.close(timeout=30)
        except BaseException as exc:
            errors.append(exc)

    closers = [threading.Thread(target=close) for _ in range(8)]
    for thread in closers:
        thread.start()
    start.wait(timeout=10)
    wait_until(lambda: session.state is SessionState.CLOSING)
    lease.release()
    for thread in closers:
        thread.join(timeout=30)
    assert not errors
    assert session.state is SessionState.CLOSED


def test_a_lease_may_be_released_from_another_thread(mlp_model):
    session = corral.Session(mlp_model)
    lease = session.acquire()
    assert lease.session is session
    releaser = threading.Thread(target=lease.release)
    releaser.start()
    releaser.join(timeout=10)
    assert session.in_flight == 0
    session.close(timeout=1)
    assert session.state is SessionState.CLOSED


def test_close_when_idle_returns_at_once_and_releases_with_the_last_lease(mlp_model):
    session = corral.Session(mlp_model)
    lease = session.acquire()
    session.close_when_idle()
    assert session.state is SessionState.CLOSING
    with pytest.raises(corral.SessionClosed, match="retired"):
        session.run({"X": X})
    lease.release()
    assert session.state is SessionState.CLOSED
    session.close_when_idle()  # idempotent
    idle = corral.Session(mlp_model)
    idle.close_when_idle()
    assert idle.state is SessionState.CLOSED


def test_a_lease_still_runs_after_close_began(mlp_model):
    session = corral.Session(mlp_model)
    lease = session.acquire()
    session.close_when_idle()
    with pytest.raises(corral.SessionClosed):
        session.run({"X": X})  # new work is refused...
    outputs = lease.run({"X": X})  # ...but the holder of a lease finishes its request
    np.testing.assert_array_equal(outputs["Y"], reference_run(mlp_model, {"X": X})[0])
    lease.release()
    assert session.state is SessionState.CLOSED
    with pytest.raises(corral.SessionClosed, match="released"):
        lease.run({"X": X})


def test_admissions_hold_the_session_open_until_dismissed(mlp_model):
    # A scheduler's queued requests hold admissions: close waits for them as for leases,
    # an admitted run goes ahead through CLOSING, and each admission ends exactly once.
    session = corral.Session(mlp_model)
    session.admit()
    session.admit()
    assert (session.in_flight, session.uses) == (2, 2)
    session.close_when_idle()
    with pytest.raises(corral.SessionClosed, match="retired"):
        session.admit()  # no new admission once closing
    feed = session.signature.prepare_inputs({"X": X})
    outputs = session.run_admitted(feed, session.signature.output_names(None))
    np.testing.assert_array_equal(outputs["Y"], reference_run(mlp_model, {"X": X})[0])
    assert session.state is SessionState.CLOSING  # the run did not end its admission
    session.dismiss(2)
    assert session.state is SessionState.CLOSED
    assert session.in_flight == 0


def test_a_lease_handed_over_holds_the_session_until_its_request_is_dismissed(mlp_model):
    session = corral.Session(mlp_model)
    lease = session.acquire()
    uses = session.uses
    session.close_when_idle()
    lease.hand_over()  # through CLOSING, as admit(): the lease's hold passes to one request
    assert session.uses == uses + 1  # the request made under it, as admit() counts it
    lease.release()  # does nothing: the hold is the request's now
    assert session.state is SessionState.CLOSING
    with pytest.raises(corral.SessionClosed, match="released"):
        lease.hand_over()
    with pytest.raises(corral.SessionClosed, match="released"):
        lease.admit()
    session.dismiss()  # the request answered: the last hold ends
    assert session.state is SessionState.CLOSED


def test_a_lease_admits_through_closing_until_it_is_released(mlp_model):
    session = corral.Session(mlp_model)
    lease = session.acquire()
    session.close_when_idle()
    lease.admit()  # the lease holds the session open: a request under it may still queue
    lease.release()
    assert session.state is SessionState.CLOSING  # the admission still holds it
    with pytest.raises(corral.SessionClosed, match="released"):
        lease.admit()
    session.dismiss()
    assert session.state is SessionState.CLOSED
