"""The object-store cache's guarantees when things go wrong: a fetch cut short, a crash, a
restart, a store that hangs, a console's folder markers. Against moto's S3 server, as
tests/core/models/test_store.py.
"""

from __future__ import annotations

import os
import threading
import time

import numpy as np
import pytest

from corral import Host, ModelInvalid, ModelNotFound, RepositoryError, StoreUnavailable
from corral._models.repository import Repository
from corral._models.store import Store
from corral.testing import build_linear
from tests import s3server
from tests.core.models.test_store import MODEL, bucket, put_model, s3
from tests.helpers import wait_until

pytest.importorskip("obstore")
pytest.importorskip("moto")

__all__ = ["bucket", "s3"]  # the fixtures, shared with tests/core/models/test_store.py

OTHER = build_linear(seed=3)


def test_a_refresh_cut_short_leaves_no_file_trusted_for_an_etag_it_does_not_hold(
    s3, bucket, tmp_path, monkeypatch
):
    name, client = bucket
    put_model(client, name, "m", 1)
    put_model(client, name, "m", 2)
    store = Store(f"s3://{name}/repo", tmp_path)
    with store.opened("m"):
        pass
    put_model(client, name, "m", 1, OTHER)
    put_model(client, name, "m", 2, OTHER)
    fetch = Store._get
    calls = []

    def second_fails(
        self: Store, model: str, path: str, listed: tuple[str, int], local: str
    ) -> None:
        calls.append(path)
        if len(calls) == 2:
            raise OSError("the connection dropped")
        fetch(self, model, path, listed, local)

    monkeypatch.setattr(Store, "_get", second_fails)
    with pytest.raises(StoreUnavailable, match="the connection dropped"), store.opened("m"):
        pass
    monkeypatch.setattr(Store, "_get", fetch)
    # Rolled back: the store holds the first copy again, whose ETag the old manifest names.
    put_model(client, name, "m", 1, MODEL)
    put_model(client, name, "m", 2, MODEL)
    with store.opened("m"):
        for version in (1, 2):
            assert (tmp_path / "m" / str(version) / "model.onnx").read_bytes() == MODEL
    store.close()
    with Store(f"s3://{name}/repo", tmp_path).opened("m"):  # and after a restart
        for version in (1, 2):
            assert (tmp_path / "m" / str(version) / "model.onnx").read_bytes() == MODEL


def test_a_cached_file_that_is_not_whole_is_fetched_again(s3, bucket, tmp_path):
    name, client = bucket
    put_model(client, name, "m")
    with Store(f"s3://{name}/repo", tmp_path).opened("m"):
        pass
    # What a crash can leave of a file whose rename reached the disk before its data.
    path = tmp_path / "m" / "1" / "model.onnx"
    path.write_bytes(MODEL[:10])
    with Store(f"s3://{name}/repo", tmp_path).opened("m"):
        assert path.read_bytes() == MODEL


def test_a_fetched_file_and_its_rename_reach_the_disk_before_the_manifest_names_it(
    s3, bucket, tmp_path, monkeypatch
):
    name, client = bucket
    put_model(client, name, "m")
    synced: list[str] = []
    sync = os.fsync

    def recorded(fd: int) -> None:
        synced.append(os.readlink(f"/proc/self/fd/{fd}"))
        sync(fd)

    store = Store(f"s3://{name}/repo", tmp_path)
    monkeypatch.setattr(os, "fsync", recorded)
    with store.opened("m"):
        pass
    monkeypatch.setattr(os, "fsync", sync)
    folder = str(tmp_path / "m" / "1")
    manifests = str(tmp_path / ".manifests")
    data = next(i for i, path in enumerate(synced) if path.startswith(str(tmp_path / ".partial")))
    assert synced.index(folder) > data  # the rename, after the data
    manifest = max(i for i, path in enumerate(synced) if path.startswith(manifests + os.sep))
    assert synced.index(folder) < manifest
    assert synced[-1] == manifests  # the manifest's own rename


def test_a_models_folder_made_in_a_console_is_read_as_the_folder(s3, bucket, tmp_path):
    name, client = bucket
    # The S3 console's "Create folder" leaves an empty object named after the folder.
    client.put_object(Bucket=name, Key="repo/m/", Body=b"")
    client.put_object(Bucket=name, Key="repo/m/1/", Body=b"")
    put_model(client, name, "m")
    entry = Repository(f"s3://{name}/repo", cache_dir=tmp_path).entry("m")
    assert entry.error is None
    assert sorted(entry.versions) == [1]


def test_a_query_in_the_url_is_refused_without_being_shown(bucket):
    token = "sv=2024&sig=s3cr3tSignature"
    with pytest.raises(RepositoryError, match="a query or fragment") as caught:
        Store(f"az://container/models?{token}")
    assert "s3cr3tSignature" not in str(caught.value)


def test_a_reader_waiting_on_a_fetch_that_hangs_gives_up_within_its_deadline(
    s3, bucket, tmp_path, monkeypatch
):
    name, client = bucket
    put_model(client, name, "m")
    store = Store(f"s3://{name}/repo", tmp_path, timeout_s=0.5)
    inside, release = threading.Event(), threading.Event()
    sync = Store._sync

    def hangs(self: Store, model: str) -> None:
        inside.set()
        release.wait(timeout=30)  # a fetch stuck past every deadline of its own
        sync(self, model)

    monkeypatch.setattr(Store, "_sync", hangs)
    errors: list[BaseException] = []

    def read() -> None:
        try:
            with store.opened("m"):
                pass
        except BaseException as exc:
            errors.append(exc)

    leader = threading.Thread(target=read)
    leader.start()
    try:
        assert inside.wait(timeout=10)
        started = time.monotonic()
        waiter = threading.Thread(target=read)
        waiter.start()
        waiter.join(timeout=10)
        assert not waiter.is_alive(), "the second reader waited without bound"
        assert time.monotonic() - started < 5
    finally:
        release.set()
        leader.join(timeout=30)
    assert len(errors) == 1
    assert isinstance(errors[0], StoreUnavailable)
    assert f"s3://{name}/repo" in str(errors[0])


def test_a_reader_waiting_on_an_interrupted_fetch_gets_a_store_error_not_the_interrupt(
    s3, bucket, tmp_path, monkeypatch
):
    name, client = bucket
    put_model(client, name, "m")
    store = Store(f"s3://{name}/repo", tmp_path)
    inside, release = threading.Event(), threading.Event()

    def interrupted(self: Store, model: str) -> None:
        inside.set()
        assert release.wait(timeout=30)
        raise KeyboardInterrupt

    monkeypatch.setattr(Store, "_sync", interrupted)
    outcome: list[BaseException] = []

    def leader() -> None:
        try:
            with store.opened("m"):
                pass
        except KeyboardInterrupt as exc:
            outcome.append(exc)

    def waiter() -> None:
        try:
            with store.opened("m"):
                pass
        except BaseException as exc:
            outcome.append(exc)

    first = threading.Thread(target=leader)
    first.start()
    assert inside.wait(timeout=10)
    second = threading.Thread(target=waiter)
    second.start()
    # The waiter is in line once the Store counts it as a reader of the model (no event can
    # be had inside the Store).
    wait_until(lambda: store._readers.get("m", 0) == 2)
    release.set()
    first.join(timeout=30)
    second.join(timeout=30)
    kinds = sorted(type(error).__name__ for error in outcome)
    assert kinds == ["KeyboardInterrupt", "StoreUnavailable"], outcome


def test_after_a_restart_the_least_recently_read_model_is_evicted_first(s3, bucket, tmp_path):
    name, client = bucket
    for model in ("a", "b", "c"):
        put_model(client, name, model)
    first = Store(f"s3://{name}/repo", tmp_path)
    for model in ("a", "b"):
        with first.opened(model):
            pass
    first.close()
    again = Store(f"s3://{name}/repo", tmp_path, cache_bytes=2 * len(MODEL))
    with again.opened("a"):  # read since the restart: "b" is now the least recent
        pass
    with again.opened("c"):
        pass
    assert sorted(p.name for p in tmp_path.iterdir() if not p.name.startswith(".")) == ["a", "c"]


def test_a_models_latest_bytes_count_only_the_versions_the_repository_serves(s3, bucket, tmp_path):
    name, client = bucket
    put_model(client, name, "m", 2, b"x" * 10)
    # Digits to str.isdigit, not version folders to the repository.
    client.put_object(Bucket=name, Key="repo/m/\u0669/model.onnx", Body=b"x" * 99)
    client.put_object(Bucket=name, Key="repo/m/\u00b2/model.onnx", Body=b"x" * 99)
    assert Store(f"s3://{name}/repo", tmp_path).latest_bytes("m") == 10


def test_a_model_read_for_a_load_is_not_evicted_before_its_load_begins(s3, bucket, tmp_path):
    name, client = bucket
    for model in ("a", "b"):
        put_model(client, name, model)
    x = np.ones((2, 4), np.float32)
    with Host(f"s3://{name}/repo", cache_dir=str(tmp_path), cache_bytes=len(MODEL)) as host:
        store = host.repository.store
        assert store is not None
        table = host._table
        begin = table.begin

        def another_fetch_first(key, *args, **kwargs):
            if key[0] == "a" and not table.busy("b"):
                # Another request's fetch ends in the moment between the load of "a" reading
                # its entry and its load beginning: the cache holds room for one model.
                with store.opened("b"):
                    pass
            return begin(key, *args, **kwargs)

        table.begin = another_fetch_first
        assert host.infer("a", {"X": x})["Y"].shape == (2, 1)
    assert (tmp_path / "a" / "1" / "model.onnx").read_bytes() == MODEL


@pytest.mark.parametrize(
    "variable",
    [
        "AZURE_STORAGE_ACCOUNT_KEY",
        "AZURE_STORAGE_SAS_TOKEN",
        "AZURE_CLIENT_SECRET",
        "AWS_SESSION_TOKEN",
    ],
)
def test_the_secret_of_any_store_is_blanked_out_of_a_reason(monkeypatch, variable):
    monkeypatch.setenv(variable, "not-to-be-shown-0123")
    reason = Store._reason(OSError("signing with not-to-be-shown-0123 failed"))
    assert "not-to-be-shown-0123" not in reason
    assert "<secret>" in reason


def test_a_model_named_like_another_models_bare_file_is_not_found_without_harm(
    s3, bucket, tmp_path
):
    name, client = bucket
    put_model(client, name, "foo.onnx")  # a folder model whose name ends in .onnx
    repo = Repository(f"s3://{name}/repo", cache_dir=tmp_path)
    assert 1 in repo.entry("foo.onnx").versions
    # "foo" would be a bare foo.onnx: the store has none, and the cache's foo.onnx is the
    # folder of the model "foo.onnx".
    with pytest.raises(ModelNotFound):
        repo.entry("foo")
    assert (tmp_path / "foo.onnx" / "1" / "model.onnx").read_bytes() == MODEL


def test_two_stores_never_share_a_cache_folder(s3, bucket, tmp_path):
    name, client = bucket
    put_model(client, name, "m")
    url = f"s3://{name}/repo"
    with Host(url, cache_dir=str(tmp_path)) as host:
        host.infer("m", {"X": np.ones((2, 4), np.float32)})
        # Another Host (or process) here would clear this one's partial downloads and evict
        # the files it reads.
        with pytest.raises(RepositoryError, match="in use by another") as caught:
            Store(url, tmp_path)
        assert str(tmp_path) in str(caught.value)
    # Closed, the Host's Store gives the folder up; a later one reuses the cache.
    store = Store(url, tmp_path)
    with store.opened("m"):
        pass
    assert store.stats().hits == 1
    store.close()
    store.close()  # idempotent
    Store(url, tmp_path).close()


def test_a_key_that_is_both_a_file_and_a_folder_is_refused_naming_it(s3, bucket, tmp_path):
    name, client = bucket
    put_model(client, name, "m")
    client.put_object(Bucket=name, Key="repo/m/1", Body=b"not a marker")
    store = Store(f"s3://{name}/repo", tmp_path)
    with (
        pytest.raises(ModelInvalid, match="m/1 is both a file and a folder") as caught,
        store.opened("m"),
    ):
        pass
    assert not isinstance(caught.value, StoreUnavailable)  # waiting would not help


def test_whether_a_store_holds_a_model_is_told_without_fetching_it(s3, bucket, tmp_path):
    name, client = bucket
    put_model(client, name, "folder")
    client.put_object(Bucket=name, Key="repo/bare.onnx", Body=MODEL)
    client.put_object(Bucket=name, Key="repo/stray/1/../x.onnx", Body=b"x")
    store = Store(f"s3://{name}/repo", tmp_path / "cache")
    assert store.holds("folder")
    assert store.holds("bare")
    assert store.holds("stray")  # a key that is no path under it: something of it is there
    assert not store.holds("none")
    assert store.stats().fetches == 0
    assert not any((tmp_path / "cache").glob("*/*"))


def test_whether_a_store_that_is_down_holds_a_model_is_a_store_error(tmp_path, monkeypatch):
    monkeypatch.setenv("AWS_ENDPOINT_URL", f"http://127.0.0.1:{s3server.free_port()}")
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", s3server.KEY_ID)
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", s3server.SECRET)
    monkeypatch.setenv("AWS_REGION", "us-east-1")
    store = Store("s3://models/repo", tmp_path / "cache", timeout_s=3)
    with pytest.raises(StoreUnavailable, match=r"model 'a': cannot list it in s3://models/repo"):
        store.holds("a")


def test_an_unload_gives_back_an_upload_only_where_the_store_lacks_the_model(s3, bucket, tmp_path):
    name, client = bucket
    put_model(client, name, "m")
    with Host(f"s3://{name}/repo", cache_dir=str(tmp_path / "cache")) as host:
        for model in ("m", "up"):
            host.load(model, config="{}", files={"1/model.onnx": OTHER})
            host.unload(model)
        wait_until(lambda: host.uploads.held_bytes == len(OTHER))
        assert host.repository.override("up") is None
        assert host.repository.override("m") is not None  # the store's model keeps its upload


@pytest.mark.timeout(60)
def test_an_unload_that_cannot_tell_whether_the_store_holds_the_model_drops_nothing(
    s3, bucket, tmp_path
):
    name, client = bucket
    put_model(client, name, "m")
    cache = str(tmp_path / "cache")
    with Host(f"s3://{name}/repo", cache_dir=cache, load_timeout_s=2) as host:
        host.load("up", config="{}", files={"1/model.onnx": OTHER})
        s3server.pause(s3)
        try:
            with pytest.raises(
                StoreUnavailable, match=f"model 'up': cannot list it in s3://{name}"
            ):
                host.unload("up")
        finally:
            s3server.resume(s3)
        assert host.repository.override("up") is not None
        assert host.uploads.held_bytes == len(OTHER)
        assert host.infer("up", {"X": np.ones((2, 4), np.float32)})["Y"].shape == (2, 1)
