"""A config.pbtxt's warm-up is bounded: in runs and bytes before anything is made, and in time.

A sample's ``count`` and the arrays its zero or random data would make are refused when the
file is read, naming the sample and the input; a sample that would not fit beside the model in
the memory budget fails the load before the session is built; a warm-up still running at the
load timeout (or the Host's close) is stopped between graph nodes, its thread returns, and the
error says it was the warm-up, not the storage.
"""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from onnx import TensorProto

import corral
from corral import Host
from corral._base.errors import ModelConfigError
from corral._models.pbtxt.parse import parse_pbtxt
from corral._models.repository import Repository
from tests.helpers import add_model, build_identity, build_slow_loop

pytestmark = pytest.mark.timeout(120)


def _no_labels(path: str, field: str) -> tuple[str, ...]:
    raise AssertionError(f"no label file expected, asked for {path} ({field})")


def _refused(text: str) -> str:
    with pytest.raises(ModelConfigError) as caught:
        parse_pbtxt(text, source="m/config.pbtxt", model_name="m", read_labels=_no_labels)
    return str(caught.value)


def test_a_warmup_count_past_the_limit_is_refused_naming_the_sample():
    message = _refused(
        'max_batch_size: 8\nmodel_warmup [ { name: "many" batch_size: 1 count: 4000000000 '
        'inputs { key: "X" value { data_type: TYPE_FP32 dims: [ 4 ] zero_data: true } } } ]'
    )
    assert "model_warmup[0] ('many').count 4000000000" in message, message
    assert "limit of 1000 warm-up runs" in message, message


@pytest.mark.parametrize("kind", ["zero_data", "random_data"])
def test_a_generated_sample_past_the_limit_is_refused_naming_input_and_size(kind: str):
    # 2 x 100,000 x 100,000 float32: 80 GB, refused from its shape alone.
    message = _refused(
        'max_batch_size: 8\nmodel_warmup [ { name: "huge" batch_size: 2 inputs { key: "X" '
        f"value {{ data_type: TYPE_FP32 dims: [ 100000, 100000 ] {kind}: true }} }} }} ]"
    )
    assert "model_warmup[0] ('huge').inputs['X']" in message, message
    assert "80,000,000,000 bytes" in message, message


def test_a_sample_of_many_inputs_past_the_limit_together_is_refused():
    # Each input is 12 MB (under the limit); the sample's two take 24 MB.
    inputs = " ".join(
        f'inputs {{ key: "{name}" value {{ data_type: TYPE_FP32 dims: [ 3000000 ] '
        "zero_data: true } }"
        for name in ("A", "B")
    )
    message = _refused(f'model_warmup [ {{ name: "pair" batch_size: 1 {inputs} }} ]')
    assert "model_warmup[0] ('pair')'s inputs take 24,000,000 bytes" in message, message


def test_a_string_sample_is_counted_at_what_its_elements_cost():
    message = _refused(
        'model_warmup [ { name: "words" batch_size: 1 inputs { key: "S" value { '
        "data_type: TYPE_STRING dims: [ 1000000 ] zero_data: true } } } ]"
    )
    assert "inputs['S']" in message, message
    assert "40,000,000 bytes" in message, message


def test_a_sample_past_the_memory_budget_fails_the_load_before_it_is_built(tmp_path: Path):
    add_model(tmp_path, "ident", build_identity(TensorProto.FLOAT))
    # 1,000,000 x 2 float32: 8 MB, under the 16 MiB sample limit, past a 4 MiB budget.
    (tmp_path / "ident" / "config.pbtxt").write_text(
        'model_warmup [ { name: "big" batch_size: 1 inputs { key: "X" value { '
        "data_type: TYPE_FP32 dims: [ 1000000, 2 ] zero_data: true } } } ]"
    )
    assert Repository(tmp_path).entry("ident").error is None
    with Host(tmp_path, memory_budget=4 * 1024 * 1024) as host:
        with pytest.raises(corral.ModelTooLarge) as caught:
            host.load("ident")
        message = str(caught.value)
    assert "warm-up sample 'big' takes 8,000,000 bytes" in message, message
    assert "input 'X' TYPE_FP32 [1000000, 2]" in message, message
    assert "memory budget" in message, message


def _endless_warmup(root: Path) -> None:
    """The slow loop model, warmed up by a sample of 10^12 iterations: it never ends alone."""
    add_model(root, "slow", build_slow_loop())
    (root / "slow" / "warmup").mkdir()
    (root / "slow" / "warmup" / "m.raw").write_bytes(np.int64(10**12).tobytes())
    (root / "slow" / "config.pbtxt").write_text(
        'model_warmup [ { name: "endless" batch_size: 1 '
        'inputs { key: "M" value { data_type: TYPE_INT64 input_data_file: "m.raw" } } '
        'inputs { key: "start" value { data_type: TYPE_FP32 dims: [ 1 ] zero_data: true } } } ]'
    )


def _until_no_load_is_abandoned(host: Host) -> None:
    deadline = time.monotonic() + 30
    while host.loads_abandoned:
        assert time.monotonic() < deadline, "the warm-up's thread is still running"
        time.sleep(0.02)


def test_a_warmup_past_the_load_timeout_is_stopped_and_named(tmp_path: Path):
    _endless_warmup(tmp_path)
    with Host(tmp_path, load_timeout_s=1.0) as host:
        with pytest.raises(corral.LoadTimeout) as caught:
            host.load("slow")
        message = str(caught.value)
        assert "running its warm-up (warm-up sample 'endless'" in message, message
        assert "storage" not in message, message
        assert "its runs were stopped" in message, message
        # RunOptions.terminate stopped the run: the load thread returned, not abandoned.
        _until_no_load_is_abandoned(host)


def test_a_warmup_running_when_the_host_closes_is_stopped_and_named(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    _endless_warmup(tmp_path)
    warming = threading.Event()
    run = corral.Session.run

    def seen(session: corral.Session, *args: Any, **kwargs: Any) -> Any:
        warming.set()
        return run(session, *args, **kwargs)

    monkeypatch.setattr(corral.Session, "run", seen)
    host = Host(tmp_path, load_timeout_s=300.0)
    failed: list[BaseException] = []

    def load() -> None:
        try:
            host.load("slow")
        except corral.CorralError as exc:
            failed.append(exc)

    loader = threading.Thread(target=load)
    loader.start()
    assert warming.wait(timeout=60)  # the warm-up's run has begun
    began = time.monotonic()
    host.close(timeout=0.5)
    loader.join(timeout=30)
    assert not loader.is_alive()
    assert time.monotonic() - began < 15
    (error,) = failed
    assert isinstance(error, corral.HostClosed), error
    assert "the Host closed while loading model 'slow'" in str(error), error
    assert "running its warm-up" in str(error), error
    assert "storage" not in str(error), error
    _until_no_load_is_abandoned(host)
