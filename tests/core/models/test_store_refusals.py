"""What a store holds that can never load from it: refused for that model alone, as a 4xx.

A key that is no path (``..``), a key part too long for the cache's file system, a model
larger than the whole cache, an object larger than the store lists it: each is refused by
name (:class:`ModelInvalid` or :class:`ModelTooLarge`: 400 / ``FAILED_PRECONDITION``, no
``Retry-After``), nothing of it kept in the cache, and the other models serve. What may pass
(an object replaced while it was read) stays :class:`StoreUnavailable` (503, ``Retry-After``).
Against moto's S3 server, as tests/core/models/test_store.py; a store that lies about a size
is this process's own listing, changed.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import pytest

from corral import ModelInvalid, ModelTooLarge, RepositoryError, StoreUnavailable
from corral._models.repository import Repository
from corral._models.store import Store
from tests.core.models.test_store import MODEL, bucket, object_reads, put_model, s3
from tests.processes import start_server, stop_server

pytest.importorskip("obstore")
pytest.importorskip("moto")

__all__ = ["bucket", "s3"]  # the fixtures, shared with tests/core/models/test_store.py

BIG = b"\0" * (5 << 20)


def _cache_files(cache: Path) -> list[str]:
    """Every file in the cache folder but its lock: copies, manifests, partial downloads."""
    return sorted(
        str(path.relative_to(cache))
        for path in cache.rglob("*")
        if path.is_file()
        if path.name != ".lock"
    )


def _relist(
    store: Store,
    monkeypatch: pytest.MonkeyPatch,
    change: Callable[[dict[str, tuple[str, int]]], dict[str, tuple[str, int]]],
) -> None:
    """The tests' one seam: ``store``'s listing of a model's files, as ``change`` makes it.

    A store that lies about a file (its size, its ETag) or changes it under a read cannot be
    made with moto, which lists what it holds: the listing the Store reads is changed instead.
    ``{path: (etag, size)}`` in, the same out.
    """
    listed = store._list_files
    monkeypatch.setattr(store, "_list_files", lambda model, key: change(listed(model, key)))


def _listing_says(store: Store, size: int, monkeypatch: pytest.MonkeyPatch) -> None:
    """Make ``store``'s listing of a model's files give ``size`` for each (its ETag kept)."""
    _relist(store, monkeypatch, lambda found: {p: (e, size) for p, (e, _) in found.items()})


@pytest.mark.timeout(60)
def test_an_object_larger_than_listed_is_refused_by_name_and_nothing_of_it_kept(
    s3, bucket, tmp_path, monkeypatch
):
    name, client = bucket
    put_model(client, name, "m", body=BIG)
    cache = tmp_path / "cache"
    store = Store(f"s3://{name}/repo", cache, cache_bytes=100_000)
    _listing_says(store, 284, monkeypatch)
    for _ in range(2):  # asked again, refused again: it never sits in the cache
        with pytest.raises(ModelInvalid) as caught, store.opened("m"):
            pass
        text = str(caught.value)
        assert f"repo/m/1/model.onnx' holds {len(BIG)} bytes" in text
        assert "as 284 bytes" in text
        assert _cache_files(cache) == []
    assert not isinstance(caught.value, StoreUnavailable)
    stats = store.stats()
    assert (stats.bytes, stats.models, stats.failures) == (0, 0, 2)


@pytest.mark.timeout(60)
def test_a_body_longer_than_its_listed_size_is_not_read_past_it(s3, bucket, tmp_path, monkeypatch):
    # A store whose answer's headers agree with its listing, and whose body does not.
    name, client = bucket
    put_model(client, name, "m")
    cache = tmp_path / "cache"
    store = Store(f"s3://{name}/repo", cache)
    pulled: list[int] = []

    class Answer:
        def __init__(self) -> None:
            self.meta = {"size": len(MODEL)}

        def stream(self, min_chunk_size: int) -> Any:
            for index in range(100):
                pulled.append(index)
                yield b"x" * len(MODEL)

    import obstore

    monkeypatch.setattr(obstore, "get", lambda *args, **kwargs: Answer())
    with pytest.raises(ModelInvalid, match=f"sent over {len(MODEL)} bytes"), store.opened("m"):
        pass
    assert pulled == [0, 1]  # the second chunk passed the size: nothing more was asked for
    assert _cache_files(cache) == []


@pytest.mark.timeout(60)
def test_an_object_replaced_while_it_is_read_is_a_store_error_that_passes(
    s3, bucket, tmp_path, monkeypatch
):
    name, client = bucket
    put_model(client, name, "m")
    store = Store(f"s3://{name}/repo", tmp_path / "cache")

    def replaced_after_listing(found: dict[str, tuple[str, int]]) -> dict[str, tuple[str, int]]:
        put_model(client, name, "m", body=BIG)
        return found

    _relist(store, monkeypatch, replaced_after_listing)
    with pytest.raises(StoreUnavailable, match="precondition"), store.opened("m"):
        pass
    monkeypatch.undo()
    with store.opened("m") as local:
        assert Path(local, "1", "model.onnx").read_bytes() == BIG


@pytest.mark.timeout(60)
def test_a_key_that_is_no_path_refuses_its_model_by_name(s3, bucket, tmp_path):
    name, client = bucket
    put_model(client, name, "m")
    client.put_object(Bucket=name, Key="repo/m/1/../../stray.onnx", Body=b"x")
    cache = tmp_path / "cache"
    store = Store(f"s3://{name}/repo", cache)
    with pytest.raises(ModelInvalid, match=r"repo/m/1/\.\./\.\./stray\.onnx"), store.opened("m"):
        pass
    assert _cache_files(cache) == []


@pytest.mark.timeout(60)
@pytest.mark.parametrize("file_system", ["says its longest name", "will not say"])
def test_a_key_part_too_long_for_the_cache_refuses_its_model_by_name(
    s3, bucket, tmp_path, monkeypatch, file_system
):
    if file_system == "will not say":  # the longest part is then taken to be 255 bytes

        def unanswered(path: str, name: str) -> int:
            raise OSError("no answer")

        monkeypatch.setattr(os, "pathconf", unanswered)
    name, client = bucket
    put_model(client, name, "m")
    client.put_object(Bucket=name, Key="repo/m/1/" + "L" * 300, Body=b"x")
    cache = tmp_path / "cache"
    store = Store(f"s3://{name}/repo", cache)
    with (
        pytest.raises(ModelInvalid, match="is 300 bytes, more than the 255") as caught,
        store.opened("m"),
    ):
        pass
    assert "m/1/LLL" in str(caught.value)
    assert object_reads(s3, name, "m") == []  # refused from its listing, nothing read
    assert _cache_files(cache) == []


@pytest.mark.timeout(60)
def test_a_model_larger_than_the_whole_cache_is_too_large_not_unavailable(s3, bucket, tmp_path):
    name, client = bucket
    put_model(client, name, "m")
    store = Store(f"s3://{name}/repo", tmp_path / "cache", cache_bytes=len(MODEL) - 1)
    with pytest.raises(ModelTooLarge, match=f"cache_bytes={len(MODEL) - 1}"), store.opened("m"):
        pass


@pytest.mark.timeout(60)
def test_a_stray_key_beside_the_models_neither_stops_the_listing_nor_hides_a_model(
    s3, bucket, tmp_path, caplog
):
    name, client = bucket
    for model in ("a", "m", "z"):
        put_model(client, name, model)
    client.put_object(Bucket=name, Key="repo/b.onnx", Body=MODEL)
    client.put_object(Bucket=name, Key="repo/c/", Body=b"")  # a console's folder marker
    put_model(client, name, "c")
    client.put_object(Bucket=name, Key="repo/../stray.onnx", Body=b"x")
    client.put_object(Bucket=name, Key="repo//empty-part.onnx", Body=b"x")
    with caplog.at_level(logging.WARNING, logger="corral._models.store"):
        repo = Repository(f"s3://{name}/repo", cache_dir=tmp_path / "cache")
        assert repo.names() == ["a", "b", "c", "m", "z"]
        assert repo.names() == ["a", "b", "c", "m", "z"]
    warned = [record.getMessage() for record in caplog.records]
    assert len(warned) == 1, warned  # once per stray key, not per listing
    assert "'repo/../'" in warned[0]
    assert 1 in repo.entry("m").versions


@pytest.mark.timeout(60)
def test_a_stray_key_beside_one_inside_a_model_refuses_the_listing_naming_both(
    s3, bucket, tmp_path
):
    name, client = bucket
    put_model(client, name, "m")
    client.put_object(Bucket=name, Key="repo/m/1/../x.onnx", Body=b"x")
    client.put_object(Bucket=name, Key="repo/../stray.onnx", Body=b"x")
    store = Store(f"s3://{name}/repo", tmp_path / "cache")
    with pytest.raises(RepositoryError) as caught:
        store.names()
    assert "'repo/../'" in str(caught.value)
    assert "repo/m/1/../x.onnx" in str(caught.value)


def _serve(s3_url: str, tmp_path: Path, *flags: str) -> Any:
    return start_server(
        s3_url,  # type: ignore[arg-type]  # a URL, as the command line takes it
        tmp_path / "serve.log",
        "--cache-dir",
        str(tmp_path / "cache"),
        *flags,
    )


INFER = {"inputs": [{"name": "X", "shape": [2, 4], "datatype": "FP32", "data": [1.0] * 8}]}


@pytest.mark.timeout(180)
def test_corral_serve_starts_past_a_stray_key_and_serves_and_lists_the_models(s3, bucket, tmp_path):
    name, client = bucket
    put_model(client, name, "good")
    client.put_object(Bucket=name, Key="repo/../stray.onnx", Body=b"x")
    served = _serve(f"s3://{name}/repo", tmp_path)
    try:
        url = f"http://{served.http}/v2"
        assert httpx.post(f"{url}/models/good/infer", json=INFER, timeout=30).status_code == 200
        index = httpx.post(f"{url}/repository/index", timeout=30).json()
        assert [entry["name"] for entry in index] == ["good"]
    finally:
        stop_server(served)
    assert "'repo/../'" in (tmp_path / "serve.log").read_text()


@pytest.mark.timeout(180)
def test_corral_serve_refuses_models_that_can_never_load_from_its_store_with_4xx(
    s3, bucket, tmp_path
):
    import tritonclient.grpc as grpcclient
    from tritonclient.utils import InferenceServerException

    name, client = bucket
    put_model(client, name, "good")
    put_model(client, name, "dots")
    client.put_object(Bucket=name, Key="repo/dots/1/../../x.onnx", Body=b"x")
    put_model(client, name, "long")
    client.put_object(Bucket=name, Key="repo/long/1/" + "L" * 300, Body=b"x")
    put_model(client, name, "big", body=MODEL + b"\0" * 4000)
    put_model(client, name, "N" * 1000)
    served = _serve(f"s3://{name}/repo", tmp_path, "--cache-bytes", str(len(MODEL) + 2000))
    grpc_client = grpcclient.InferenceServerClient(served.grpc)
    try:
        url = f"http://{served.http}/v2"
        assert httpx.post(f"{url}/models/good/infer", json=INFER, timeout=30).status_code == 200
        for model, named, code in (
            ("dots", "repo/dots/1/../../x.onnx", "FAILED_PRECONDITION"),
            ("long", "long/1/LLLL", "FAILED_PRECONDITION"),
            ("big", "more than the whole cache", "FAILED_PRECONDITION"),
            ("N" * 1000, "at most 128 characters", "INVALID_ARGUMENT"),  # a name it cannot be
        ):
            for answer in (
                httpx.post(f"{url}/models/{model}/infer", json=INFER, timeout=30),
                httpx.post(f"{url}/repository/models/{model}/load", timeout=30),
            ):
                assert answer.status_code == 400, (model, answer.text)
                assert "retry-after" not in answer.headers, model
                assert named in answer.json()["error"], (model, answer.text)
            with pytest.raises(InferenceServerException) as refused:
                grpc_client.load_model(model)
            assert refused.value.status() == f"StatusCode.{code}", model
            assert named in refused.value.message(), model
        assert httpx.post(f"{url}/models/good/infer", json=INFER, timeout=30).status_code == 200
    finally:
        grpc_client.close()
        stop_server(served)


@pytest.mark.timeout(60)
def test_a_refusal_part_way_keeps_the_copy_the_manifest_names_and_drops_the_rest(
    s3, bucket, tmp_path, monkeypatch
):
    name, client = bucket
    put_model(client, name, "m")
    cache = tmp_path / "cache"
    store = Store(f"s3://{name}/repo", cache)
    with store.opened("m"):
        pass
    client.put_object(Bucket=name, Key="repo/m/1/labels.txt", Body=b"a\n")  # fetched first
    put_model(client, name, "m", 2, body=BIG)
    _relist(
        store,
        monkeypatch,
        lambda found: found | {"2/model.onnx": (found["2/model.onnx"][0], 284)},
    )
    with pytest.raises(ModelInvalid, match=r"2/model\.onnx"), store.opened("m"):
        pass
    # The unchanged copy stays, counted and named by the manifest; what came before the
    # refusal (labels.txt) goes with it.
    assert _cache_files(cache) == [".manifests/m.json", "m/1/model.onnx"]
    assert store.stats().bytes == len(MODEL)


@pytest.mark.timeout(60)
def test_a_bare_model_larger_than_listed_leaves_no_copy(s3, bucket, tmp_path, monkeypatch):
    import obstore

    name, client = bucket
    client.put_object(Bucket=name, Key="repo/b.onnx", Body=MODEL)
    cache = tmp_path / "cache"
    store = Store(f"s3://{name}/repo", cache)
    with store.opened("b"):
        pass
    client.put_object(Bucket=name, Key="repo/b.onnx", Body=BIG)
    head = obstore.head

    def lying_head(*args: Any, **kwargs: Any) -> Any:
        return head(*args, **kwargs) | {"size": len(MODEL)}

    monkeypatch.setattr(obstore, "head", lying_head)
    for _ in range(2):  # the old copy goes with the first refusal; the second finds none
        with pytest.raises(ModelInvalid, match=f"holds {len(BIG)} bytes"), store.opened("b"):
            pass
        assert _cache_files(cache) == [".manifests/b.json"]
        assert (store.stats().bytes, store.stats().models) == (0, 0)


@pytest.mark.timeout(60)
def test_an_empty_file_and_one_listed_without_an_etag_are_copied_whole(
    s3, bucket, tmp_path, monkeypatch
):
    name, client = bucket
    put_model(client, name, "m")
    client.put_object(Bucket=name, Key="repo/m/1/empty.bin", Body=b"")
    store = Store(f"s3://{name}/repo", tmp_path / "cache")
    _relist(store, monkeypatch, lambda found: {p: ("", size) for p, (_, size) in found.items()})
    with store.opened("m") as local:
        assert Path(local, "1", "model.onnx").read_bytes() == MODEL
        assert Path(local, "1", "empty.bin").read_bytes() == b""


@pytest.mark.timeout(60)
def test_a_body_cut_short_is_a_store_error_that_passes(s3, bucket, tmp_path, monkeypatch):
    import obstore

    name, client = bucket
    put_model(client, name, "m")
    cache = tmp_path / "cache"
    store = Store(f"s3://{name}/repo", cache)

    class Answer:
        def __init__(self) -> None:
            self.meta = {"size": len(MODEL)}

        def stream(self, min_chunk_size: int) -> Any:
            yield MODEL[:10]

    get = obstore.get
    monkeypatch.setattr(obstore, "get", lambda *args, **kwargs: Answer())
    with (
        pytest.raises(StoreUnavailable, match=f"10 of its {len(MODEL)} bytes came"),
        store.opened("m"),
    ):
        pass
    assert _cache_files(cache) == []
    monkeypatch.setattr(obstore, "get", get)
    with store.opened("m") as local:
        assert Path(local, "1", "model.onnx").read_bytes() == MODEL
