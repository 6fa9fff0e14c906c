"""Reloader alone: changed and new versions swapped in, bad edits kept out, polling.

The reloader works on a table and loader wired as a Host wires them (``tests.helpers.Pieces``,
the ``make_pieces`` fixture), with no Host around them. Each changed model file is written
with another size, so that its fingerprint changes whatever the file system's clock.
"""

from __future__ import annotations

import os
import shutil
import threading
from pathlib import Path

import numpy as np
import pytest

import corral
from corral import SessionState
from corral._base.events import EventKind
from corral._base.trace_hooks import LoadRecord
from corral.testing import build_mlp, build_tree
from tests.helpers import Pieces, add_model, reference_run, wait_until

X = np.ones((2, 4), np.float32)
#: What "mlp" is changed to: another hidden size, so another file size.
CHANGED = build_mlp(hidden=8, seed=9)


def builds_of(pieces: Pieces) -> list[LoadRecord]:
    """Every build the loader settles from now on (a reload's builds included)."""
    records: list[LoadRecord] = []
    pieces.loader.load_observer = records.append
    return records


def test_a_changed_version_is_swapped_in_while_a_lease_finishes_on_the_old_copy(
    make_pieces, repo: Path
):
    pieces = make_pieces()
    lease = pieces.loader.lease("mlp", None, timeout=30)
    old = pieces.table.in_use("mlp")[1]
    before = lease.run({"X": X})["Y"]
    add_model(repo, "mlp", CHANGED)

    pieces.reloader.reload("mlp")

    fresh = pieces.table.in_use("mlp")[1]
    assert fresh is not old
    assert fresh.fingerprint != old.fingerprint
    assert pieces.table.stats().reloads == 1
    assert pieces.table.events.recent()[-1].kind is EventKind.RELOAD
    np.testing.assert_array_equal(
        fresh.run({"X": X}, None)["Y"], reference_run(CHANGED, {"X": X})[0]
    )
    # The old copy is out of service but drains: the lease finishes on it, then it closes.
    assert old.session.state is SessionState.CLOSING
    np.testing.assert_array_equal(lease.run({"X": X})["Y"], before)
    # Its inline lane's measuring (a lease of its own, on a load worker, queued at its load)
    # ends first: on a loaded machine it could still hold the copy open past our release.
    assert old.lane_settled.wait(timeout=30)
    lease.release()
    assert old.session.state is SessionState.CLOSED
    with pieces.loader.lease("mlp", None, timeout=30) as again:
        assert again.session is fresh.session


def test_an_unchanged_model_is_left_as_it_is(make_pieces):
    pieces = make_pieces()
    served = pieces.loader.loaded("mlp", None, timeout=30)
    records = builds_of(pieces)
    pieces.reloader.reload("mlp")
    pieces.reloader.refresh()
    assert pieces.table.in_use("mlp") == {1: served}
    assert records == []
    assert pieces.table.stats().reloads == 0


def test_a_newer_version_of_a_model_in_use_replaces_the_older(make_pieces, repo: Path):
    pieces = make_pieces()
    one = pieces.loader.loaded("mlp", None, timeout=30)
    assert one.lane_settled.wait(timeout=30)  # its lane's measuring holds a lease till then
    add_model(repo, "mlp", build_mlp(seed=5), version=2)
    pieces.reloader.reload("mlp")
    (two,) = pieces.table.in_use("mlp").values()
    assert two.version == 2
    assert one.session.state is SessionState.CLOSED  # idle: closed at once
    assert pieces.loader.loaded("mlp", None, timeout=30) is two


def test_refresh_rebuilds_only_the_models_that_changed(make_pieces, repo: Path):
    pieces = make_pieces()
    mlp = pieces.loader.loaded("mlp", None, timeout=30)
    tree = pieces.loader.loaded("tree", None, timeout=30)
    records = builds_of(pieces)
    add_model(repo, "tree", build_tree(depth=4, seed=3))
    pieces.reloader.refresh()
    assert [(record.model, record.error) for record in records] == [("tree", None)]
    assert pieces.table.in_use("mlp") == {1: mlp}
    assert pieces.table.in_use("tree")[1] is not tree


def test_a_bad_edit_keeps_the_copy_in_use_serving_and_is_reported(make_pieces, repo: Path):
    pieces = make_pieces()
    served = pieces.loader.loaded("mlp", None, timeout=30)
    (repo / "mlp" / "1" / "model.onnx").write_bytes(b"not a model any more")

    for _ in range(2):  # reported once, however often it is checked
        pieces.reloader.refresh()

    assert pieces.table.in_use("mlp") == {1: served}
    assert served.session.state is SessionState.READY
    failure = pieces.table.reload_failure("mlp")
    assert failure is not None
    assert "not an ONNX model" in str(failure)
    assert pieces.table.stats().load_failures == 1
    assert pieces.loader.prepare("mlp", None).result(timeout=30) is served
    # Fixed: the next check swaps the good copy in and forgets the failure.
    add_model(repo, "mlp", CHANGED)
    pieces.reloader.refresh()
    assert pieces.table.in_use("mlp")[1] is not served
    assert pieces.table.reload_failure("mlp") is None


def test_a_malformed_model_toml_keeps_the_copy_in_use_serving(make_pieces, repo: Path):
    pieces = make_pieces()
    served = pieces.loader.loaded("mlp", None, timeout=30)
    (repo / "mlp" / "model.toml").write_text("max_batch_size = 'many'\n")
    pieces.reloader.reload("mlp")
    assert pieces.table.in_use("mlp") == {1: served}
    failure = pieces.table.reload_failure("mlp")
    assert isinstance(failure, corral.ModelConfigError)
    assert "max_batch_size" in str(failure)


def test_a_model_gone_from_the_repository_is_retired_and_forgotten(make_pieces, repo: Path):
    pieces = make_pieces()
    served = pieces.loader.loaded("mlp", None, timeout=30)
    # Its lane's measuring, after the load, holds a lease of its own until it ends.
    assert served.lane_settled.wait(timeout=30)
    shutil.rmtree(repo / "mlp")
    pieces.reloader.refresh()
    assert pieces.table.in_use("mlp") == {}
    assert pieces.table.cached("mlp") == (None, False)
    assert served.session.state is SessionState.CLOSED
    assert pieces.table.stats().unloads == 1
    with pytest.raises(corral.ModelNotFound):
        pieces.loader.loaded("mlp", None, timeout=30)


@pytest.mark.timeout(60)
def test_a_reload_that_ends_as_the_table_closes_publishes_nothing(make_pieces, builds, repo: Path):
    pieces = make_pieces()
    old = pieces.loader.loaded("mlp", None, timeout=30)
    builds.held.add("mlp")
    add_model(repo, "mlp", CHANGED)
    reloading = threading.Thread(target=pieces.reloader.reload, args=("mlp",))
    reloading.start()
    assert builds.reached.wait(timeout=30)
    assert pieces.table.begin_close() == []  # a reload's build is not a load in flight
    builds.opened.set()
    reloading.join(timeout=30)
    assert not reloading.is_alive()
    assert pieces.table.in_use("mlp") == {1: old}
    assert pieces.table.stats().reloads == 0
    # The copy built for nothing is closed: only the old one is left open.
    assert corral.runtime().stats().sessions_alive == 1


def test_polling_runs_only_between_start_and_stop(make_pieces, repo: Path):
    def polling() -> list[threading.Thread]:
        return [t for t in threading.enumerate() if t.name == "corral-host-poll"]

    quiet = make_pieces()
    quiet.reloader.start()  # no interval: nothing to start
    assert polling() == []

    pieces = make_pieces(poll_interval_s=0.01)
    served = pieces.loader.loaded("mlp", None, timeout=30)
    assert polling() == []  # built, not started
    pieces.reloader.start()
    pieces.reloader.start()
    (poller,) = polling()
    assert poller.daemon
    add_model(repo, "mlp", CHANGED)
    wait_until(lambda: pieces.table.in_use("mlp")[1] is not served)
    pieces.reloader.stop(timeout=10)
    assert not poller.is_alive()
    pieces.reloader.start()  # stopped for good
    assert polling() == []


def external_weights_model(weight: float) -> tuple[bytes, bytes]:
    """``Y = X @ W`` (X: float32 [N, 4]) with W (all ``weight``) in the file weights.bin."""
    import tempfile

    import onnx
    from onnx import TensorProto, helper, numpy_helper

    weights = numpy_helper.from_array(np.full((4, 1), weight, np.float32), "W")
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["X", "W"], ["Y"])],
        "external",
        [helper.make_tensor_value_info("X", TensorProto.FLOAT, [None, 4])],
        [helper.make_tensor_value_info("Y", TensorProto.FLOAT, [None, 1])],
        [weights],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder, "model.onnx")
        onnx.save_model(
            model, str(path), save_as_external_data=True, location="weights.bin", size_threshold=0
        )
        return path.read_bytes(), Path(folder, "weights.bin").read_bytes()


def test_new_external_weights_alone_are_served_after_a_refresh(tmp_path: Path):
    version = tmp_path / "m" / "1"
    version.mkdir(parents=True)
    model, weights = external_weights_model(1.0)
    (version / "model.onnx").write_bytes(model)
    (version / "weights.bin").write_bytes(weights)
    x = np.ones((1, 4), np.float32)
    with corral.Host(tmp_path) as host:
        np.testing.assert_array_equal(host.infer("m", {"X": x})["Y"], [[4.0]])
        # New weights only, put in place as a deployment (or the object-store cache) does:
        # the model file that names them is unchanged.
        _, new_weights = external_weights_model(2.0)
        (version / "weights.bin.new").write_bytes(new_weights)
        (version / "weights.bin.new").replace(version / "weights.bin")
        host.refresh()
        np.testing.assert_array_equal(host.infer("m", {"X": x})["Y"], [[8.0]])


def _replace(repo: Path, seed: int) -> None:
    """Put another mlp in place of mlp/1/model.onnx, its time later than the file's before."""
    model = repo / "mlp" / "1" / "model.onnx"
    before = model.stat().st_mtime_ns
    add_model(repo, "mlp", build_mlp(seed=seed))
    # Of the same size: a later time tells it apart, made sure of here.
    os.utime(model, ns=(before + 10**9, before + 10**9))


def test_a_reload_whose_files_change_under_it_is_built_again_and_serves_them(
    repo: Path, monkeypatch: pytest.MonkeyPatch
):
    with corral.Host(repo) as host:
        host.infer("mlp", {"X": X})  # in use: seed 1
        _replace(repo, 9)
        build = corral.Session.__init__
        builds: list[str] = []

        def changing_build(session: corral.Session, path: object, **options: object) -> None:
            builds.append(str(options.get("name")))
            if len(builds) == 1:
                _replace(repo, 10)  # the reload's first build finds seed 9's entry stale
            build(session, path, **options)  # type: ignore[arg-type]

        monkeypatch.setattr(corral.Session, "__init__", changing_build)
        host.load("mlp")  # a reload of the model in use: no error, no mix
        assert builds == ["mlp:1", "mlp:1"]
        want = reference_run(build_mlp(seed=10), {"X": X})[0]
        np.testing.assert_array_equal(host.infer("mlp", {"X": X})["Y"], want)
        reloads = host.stats().reloads
        host.refresh()  # what is served is what the disk holds: nothing to reload
        assert host.stats().reloads == reloads
        assert builds == ["mlp:1", "mlp:1"]
