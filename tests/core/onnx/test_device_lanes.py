"""One run at a time per device, for providers whose runs on different sessions crash.

Since onnxruntime 1.18, concurrent runs on *different* DirectML sessions of one device crash
(onnxruntime #20713, immich#31469), and WebGPU's do too (#32561). corral gives every session on
such a device one lane (``+device``): these tests emulate the providers on the CPU and prove,
with a gate that holds the first run, that no second run on the device starts meanwhile,
across sessions and models, from several threads and through a Host's compute workers,
while CPU sessions and other devices still run beside it.

"No second run starts" is checked by waiting a bounded half second for one: on a build
without the lanes the second run starts at once, so the check fails within microseconds.
"""

from __future__ import annotations

import os
import signal
import threading
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest

import corral
from corral import Host
from corral._onnx.providers import PROVIDER_TABLE, ConcurrencyPolicy
from corral.testing import build_linear, build_mlp, emulate_provider
from tests.gates import DeviceRuns, served_version
from tests.helpers import add_model, reference_run, wait_until

#: The providers whose table row says runs on different sessions of a device crash.
ONE_RUN_PER_DEVICE = ["DmlExecutionProvider", "WebGpuExecutionProvider"]
#: How long a test waits for a run that must not start.
NOT_STARTED_S = 0.5


@pytest.fixture(scope="module")
def two_models() -> tuple[bytes, bytes]:
    return build_mlp(seed=3), build_linear(seed=4)


@pytest.fixture(params=ONE_RUN_PER_DEVICE)
def provider(request: pytest.FixtureRequest) -> Iterator[str]:
    with emulate_provider(request.param):
        yield request.param


def _feed(value: float, features: int = 4) -> dict[str, np.ndarray]:
    return {"X": np.full((2, features), value, np.float32)}


def test_the_table_gives_crashing_providers_a_device_lane_and_no_pool():
    for name in ONE_RUN_PER_DEVICE:
        row = PROVIDER_TABLE[name]
        assert row.one_run_per_device
        assert row.run_policy != "pool"
        assert not row.parallel_construction  # construction stays serialized
    assert not any(
        row.one_run_per_device
        for name, row in PROVIDER_TABLE.items()
        if name not in ONE_RUN_PER_DEVICE
    )


def test_runs_on_one_device_never_overlap_across_sessions_and_models(provider, two_models):
    """Two models, two sessions each, eight threads: one run inside onnxruntime at a time."""
    sessions = [
        corral.Session(model, providers=[provider], name=f"{index}-{copy}")
        for index, model in enumerate(two_models)
        for copy in range(2)
    ]
    assert {str(session.policy) for session in sessions} == {"exclusive+device"}
    assert {session.devices for session in sessions} == {((provider, 0),)}
    cpu = corral.Session(two_models[0], name="cpu")
    watch = DeviceRuns(*sessions, hold_first=True)
    expected = [reference_run(two_models[index // 2], _feed(1.0))[0] for index in range(4)]
    with ThreadPoolExecutor(8) as threads, watch:
        first = threads.submit(sessions[0].run, _feed(1.0))
        assert watch.started.acquire(timeout=10)
        others = [
            threads.submit(lambda s=sessions[(turn % 3) + 1]: [s.run(_feed(1.0)) for _ in range(5)])
            for turn in range(7)
        ]
        # While the device's first run is held, no run of another session or model starts,
        assert not watch.started.acquire(timeout=NOT_STARTED_S), "a second run started"
        # and a CPU session of the same model runs beside it.
        np.testing.assert_allclose(cpu.run(_feed(1.0))["Y"], expected[0], rtol=1e-5)
        assert watch.active == 1
        watch.open.set()
        np.testing.assert_allclose(first.result(timeout=30)["Y"], expected[0], rtol=1e-5)
        for turn, other in enumerate(others):
            index = (turn % 3) + 1
            for outputs in other.result(timeout=30):
                np.testing.assert_allclose(outputs["Y"], expected[index], rtol=1e-5)
    assert watch.runs == 1 + 7 * 5
    assert watch.most == 1


def test_cpu_sessions_still_overlap(two_models):
    sessions = [corral.Session(model) for model in two_models]
    assert all(session.devices == () for session in sessions)
    watch = DeviceRuns(*sessions, hold_first=True)
    with ThreadPoolExecutor(2) as threads, watch:
        held = threads.submit(sessions[0].run, _feed(1.0))
        assert watch.started.acquire(timeout=10)
        beside = threads.submit(sessions[1].run, _feed(2.0))
        assert beside.result(timeout=10)["Y"].shape == (2, 1)  # ran while the first was held
        assert watch.most == 2
        watch.open.set()
        held.result(timeout=30)


def test_different_device_ids_overlap_and_one_device_does_not(provider, two_models):
    option = PROVIDER_TABLE[provider].device_option
    on_0 = corral.Session(two_models[0], providers=[(provider, {option: 0})])
    also_0 = corral.Session(two_models[1], providers=[provider])  # no id: device 0
    on_1 = corral.Session(two_models[1], providers=[(provider, {option: "1"})])
    assert (on_0.devices, also_0.devices, on_1.devices) == (
        ((provider, 0),),
        ((provider, 0),),
        ((provider, 1),),
    )
    device_0 = DeviceRuns(on_0, also_0, hold_first=True)
    device_1 = DeviceRuns(on_1)
    with ThreadPoolExecutor(2) as threads, device_0:
        held = threads.submit(on_0.run, _feed(1.0))
        assert device_0.started.acquire(timeout=10)
        waiting = threads.submit(also_0.run, _feed(1.0))
        # Device 1 runs while device 0 is held; device 0's other session does not.
        assert on_1.run(_feed(1.0))["Y"].shape == (2, 1)
        assert device_1.runs == 1
        assert not device_0.started.acquire(timeout=NOT_STARTED_S), "device 0 ran twice at once"
        device_0.open.set()
        held.result(timeout=30)
        waiting.result(timeout=30)
    assert device_0.most == 1


def test_a_host_keeps_one_device_to_one_run_and_its_workers_free(tmp_path: Path, provider):
    """Two models on the device and one on the CPU, two compute workers.

    While the device's first run is held, the other model on the device waits in its queue,
    not on a worker: the second worker answers the CPU model meanwhile. Then several
    threads' requests to all three never put two runs on the device at once.
    """
    toml = f'providers = ["{provider}"]\nmax_batch_size = 0\n'
    add_model(tmp_path, "a", build_mlp(seed=3), toml=toml)
    add_model(tmp_path, "b", build_linear(seed=4), toml=toml)
    add_model(tmp_path, "cpu", build_mlp(seed=5), toml="max_batch_size = 0\n")
    with corral.Runtime(compute_workers=2) as runtime, Host(tmp_path, runtime=runtime) as host:
        assert host.preload() == {}
        sessions = []
        for name in ("a", "b"):
            with host.acquire(name) as lease:
                sessions.append(served_version(lease).session)
        assert [str(session.policy) for session in sessions] == ["exclusive+device"] * 2
        with DeviceRuns(*sessions, hold_first=True) as watch:
            held = host.submit("a", _feed(1.0))
            assert watch.started.acquire(timeout=10)
            queued = host.submit("b", _feed(1.0))
            # The second worker is not waiting for the device: it answers the CPU model.
            assert host.submit("cpu", _feed(1.0)).result(timeout=10)["Y"].shape == (2, 1)
            assert not watch.started.acquire(timeout=NOT_STARTED_S), "b ran beside a"
            assert not queued.done()
        held.result(timeout=30)
        queued.result(timeout=30)

        def caller(index: int) -> None:
            name = ("a", "b", "cpu")[index % 3]
            for turn in range(10):
                outputs = host.submit(name, _feed(float(turn))).result(timeout=30)
                assert outputs["Y"].shape == (2, 1)

        with ThreadPoolExecutor(6) as threads:
            for result in [threads.submit(caller, index) for index in range(6)]:
                result.result(timeout=60)
        assert watch.runs == 2 + 2 * 10 * 2
        assert watch.most == 1
        settings = host.status("a").versions[0].settings
        assert settings is not None
        assert str(settings.concurrency) == "exclusive+device"
        assert settings.devices == (f"{provider}:0",)


def test_pool_is_refused_where_runs_on_different_sessions_crash(provider, two_models):
    with pytest.raises(
        corral.ModelConfigError, match=r"'pool:2' cannot be used on .*exclusive\+device"
    ):
        corral.Session(two_models[0], providers=[provider], concurrency="pool:2")
    # A per-session rule asked for keeps the lane: other sessions on the device rely on it.
    session = corral.Session(two_models[0], providers=[provider], concurrency="shared")
    assert str(session.policy) == "shared+device"
    assert session.devices == ((provider, 0),)


def test_device_policies_are_written_and_read_back():
    assert str(ConcurrencyPolicy.parse(" Exclusive+Device ")) == "exclusive+device"
    assert ConcurrencyPolicy.parse("shared+device") == ConcurrencyPolicy("shared", device=True)
    assert ConcurrencyPolicy("exclusive", device=True).runs_at_once == 1
    assert ConcurrencyPolicy("shared", device=True).runs_at_once == 1
    with pytest.raises(ValueError, match=r"'pool:2\+device' cannot be"):
        ConcurrencyPolicy.parse("pool:2+device")
    with pytest.raises(ValueError, match="concurrency must be"):
        ConcurrencyPolicy.parse("device")


def test_device_lane_on_the_cpu_takes_the_first_providers_device(two_models):
    sessions = [corral.Session(model, concurrency="shared+device") for model in two_models]
    assert {session.devices for session in sessions} == {(("CPUExecutionProvider", 0),)}
    watch = DeviceRuns(*sessions, hold_first=True)
    with ThreadPoolExecutor(2) as threads, watch:
        held = threads.submit(sessions[0].run, _feed(1.0))
        assert watch.started.acquire(timeout=10)
        waiting = threads.submit(sessions[1].run, _feed(1.0))
        assert not watch.started.acquire(timeout=NOT_STARTED_S)
        watch.open.set()
        held.result(timeout=30)
        waiting.result(timeout=30)
    assert watch.most == 1


def test_a_device_id_that_is_no_number_is_refused(provider, two_models):
    option = PROVIDER_TABLE[provider].device_option
    with pytest.raises(corral.ProviderUnavailable, match=f"'{option}' option of {provider}"):
        corral.Session(two_models[0], providers=[(provider, {option: "gpu0"})])


def test_waiting_runs_get_the_device_in_the_order_they_asked():
    from corral._onnx.device_lanes import DeviceLane, device_lane

    lane = DeviceLane(("TestExecutionProvider", 7))
    assert repr(lane) == "<corral.DeviceLane TestExecutionProvider:7>"
    order: list[int] = []
    lane.acquire()
    queued = [threading.Event() for _ in range(4)]

    def wait_turn(index: int) -> None:
        queued[index].set()
        lane.acquire()
        order.append(index)
        lane.release()

    threads = []
    for index in range(4):
        thread = threading.Thread(target=wait_turn, args=(index,))
        thread.start()
        threads.append(thread)
        assert queued[index].wait(10)
        # In line once the lane counts it (a wait inside acquire, no event to be had there).
        wait_until(lambda count=index + 1: lane.waiting == count)
    lane.release()
    for thread in threads:
        thread.join(timeout=10)
    assert order == [0, 1, 2, 3]
    assert device_lane(("TestExecutionProvider", 7)) is device_lane(("TestExecutionProvider", 7))


class _Interrupted(Exception):
    pass


@pytest.mark.parametrize("handed_over", [False, True])
def test_a_run_interrupted_while_waiting_leaves_the_line_or_passes_the_device_on(handed_over):
    """A signal (KeyboardInterrupt, say) while the main thread waits for the device.

    Not handed the device yet, the run leaves the line; handed it just before the signal
    landed, it passes the device on: either way the device is free once the holder is done.
    """
    from corral._onnx.device_lanes import DeviceLane

    lane = DeviceLane(("TestExecutionProvider", 8))
    lane.acquire()  # held by "another run"

    def interrupt(signum: int, frame: object) -> None:
        if handed_over:
            lane.release()  # the holder hands the device to the waiting main thread
        raise _Interrupted

    previous = signal.signal(signal.SIGUSR1, interrupt)
    try:
        sender = threading.Thread(
            target=lambda: (
                wait_until(lambda: lane.waiting == 1),
                os.kill(os.getpid(), signal.SIGUSR1),
            )
        )
        sender.start()
        with pytest.raises(_Interrupted):
            lane.acquire()
        sender.join(timeout=10)
    finally:
        signal.signal(signal.SIGUSR1, previous)
    assert not lane.waiting
    if not handed_over:
        lane.release()  # the holder is done
    assert not lane.busy
    lane.acquire()  # free: taken at once
    lane.release()
