"""Repositories in object storage: read lazily through a bounded cache, against a real S3 server.

Every test talks to moto's standalone server in a process of its own on 127.0.0.1
(``tests.s3server``), and counts the object reads it logged: a listing is ``GET /bucket?...``,
a file's read ``GET /bucket/key``.
"""

from __future__ import annotations

import itertools
import logging
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pytest

import corral
from corral import Host, ModelNotFound, ProblemKind, RepositoryError, StoreUnavailable
from corral._base.errors import InvalidOption, fresh
from corral._models.repository import Repository
from corral._models.store import Store, is_store_url
from corral.testing import build_linear
from tests import s3server

pytest.importorskip("obstore")
pytest.importorskip("moto")

X = np.ones((2, 4), np.float32)
MODEL = build_linear()
_buckets = itertools.count()


@pytest.fixture(scope="module")
def s3(tmp_path_factory):
    with s3server.running(tmp_path_factory.mktemp("moto") / "moto.log") as server:
        yield server


@pytest.fixture
def bucket(s3, monkeypatch):
    """A new bucket of the server, the variables that reach it set, and its S3 client."""
    for name, value in s3.environment().items():
        monkeypatch.setenv(name, value)
    name = f"models-{next(_buckets)}"
    client = s3server.client(s3)
    client.create_bucket(Bucket=name)
    return name, client


def put_model(client, bucket: str, name: str, version: int = 1, body: bytes = MODEL) -> None:
    client.put_object(Bucket=bucket, Key=f"repo/{name}/{version}/model.onnx", Body=body)


def object_reads(s3, bucket: str, model: str | None = None) -> list[str]:
    """The object GETs (not listings) of ``bucket`` so far, of ``model``'s files if given."""
    prefix = f"/{bucket}/repo/" + ("" if model is None else f"{model}/")
    return [path for path in s3.requests("GET") if path.startswith(prefix)]


def test_only_the_listing_is_read_at_start_and_a_model_on_its_first_use(s3, bucket, tmp_path):
    name, client = bucket
    for model in ("a", "b", "c"):
        put_model(client, name, model)
    with Host(f"s3://{name}/repo", cache_dir=str(tmp_path / "cache")) as host:
        assert host.repository.names() == ["a", "b", "c"]
        assert object_reads(s3, name) == []
        assert host.infer("b", {"X": X})["Y"].shape == (2, 1)
        assert object_reads(s3, name) == [f"/{name}/repo/b/1/model.onnx"]
        assert (tmp_path / "cache" / "b" / "1" / "model.onnx").read_bytes() == MODEL
        assert not (tmp_path / "cache" / "a").exists()
        stats = host.repository.store.stats()
        assert (stats.fetches, stats.fetched_bytes, stats.models) == (1, len(MODEL), 1)


def test_an_absolute_library_path_in_a_stores_config_pbtxt_is_refused(s3, bucket, tmp_path):
    # A local repository's config.pbtxt may name a library by its absolute path (the operator
    # installed it); a store's names no file of this machine.
    name, client = bucket
    put_model(client, name, "ops")
    client.put_object(
        Bucket=name,
        Key="repo/ops/config.pbtxt",
        Body=b'name: "ops"\nmodel_operations { op_library_filename: "/usr/lib/libops.so" }\n',
    )
    refused = pytest.raises(corral.ModelConfigError, match="resolves outside the model's folder")
    with Host(f"s3://{name}/repo", cache_dir=str(tmp_path / "cache")) as host, refused:
        host.infer("ops", {"X": X})


def test_a_cached_model_is_not_fetched_again_after_a_restart(s3, bucket, tmp_path):
    name, client = bucket
    put_model(client, name, "m")
    put_model(client, name, "m", 2)
    cache = str(tmp_path / "cache")
    with Host(f"s3://{name}/repo", cache_dir=cache) as host:
        host.infer("m", {"X": X})
    assert len(object_reads(s3, name, "m")) == 2
    with Host(f"s3://{name}/repo", cache_dir=cache) as host:
        assert host.infer("m", {"X": X})["Y"].shape == (2, 1)
        stats = host.repository.store.stats()
        assert (stats.hits, stats.fetches) == (1, 0)
    assert len(object_reads(s3, name, "m")) == 2  # no GET the second time


def test_a_file_replaced_in_the_store_is_fetched_again_and_one_removed_is_removed(
    s3, bucket, tmp_path
):
    name, client = bucket
    put_model(client, name, "m")
    put_model(client, name, "m", 2)
    repo = Repository(f"s3://{name}/repo", cache_dir=tmp_path)
    assert sorted(repo.entry("m").versions) == [1, 2]
    other = build_linear(seed=3)
    put_model(client, name, "m", 1, other)
    client.delete_object(Bucket=name, Key="repo/m/2/model.onnx")
    entry = repo.entry("m")
    assert sorted(entry.versions) == [1]
    assert entry.versions[1].path.read_bytes() == other
    assert not (tmp_path / "m" / "2").exists()


def test_the_least_recently_read_model_not_in_use_is_evicted_past_the_cache_bytes(
    s3, bucket, tmp_path
):
    name, client = bucket
    for model in ("a", "b", "c"):
        put_model(client, name, model)
    store = Store(f"s3://{name}/repo", tmp_path, cache_bytes=2 * len(MODEL))
    busy = {"a"}
    store.in_use = busy.__contains__
    for model in ("a", "b", "c"):
        with store.opened(model):
            pass
    # "a" is in use: "b", the least recently read of the others, goes.
    assert sorted(p.name for p in tmp_path.iterdir() if not p.name.startswith(".")) == ["a", "c"]
    stats = store.stats()
    assert (stats.evictions, stats.bytes, stats.models) == (1, 2 * len(MODEL), 2)
    busy.clear()
    with store.opened("b"):
        pass
    assert sorted(p.name for p in tmp_path.iterdir() if not p.name.startswith(".")) == ["b", "c"]


def test_a_new_version_in_the_store_is_served_after_a_poll(s3, bucket, tmp_path):
    name, client = bucket
    put_model(client, name, "m")
    with Host(f"s3://{name}/repo", cache_dir=str(tmp_path)) as host:
        host.infer("m", {"X": X})
        assert host.serving_version("m") == 1
        put_model(client, name, "m", 2, build_linear(seed=5))
        host.refresh()
        assert host.serving_version("m") == 2
        expected = X @ np.ones((4, 1), np.float32)  # only the shape is the model's
        assert host.infer("m", {"X": X})["Y"].shape == expected.shape


def test_a_model_removed_from_the_store_is_gone_from_the_listing_and_the_cache(
    s3, bucket, tmp_path
):
    name, client = bucket
    put_model(client, name, "m")
    put_model(client, name, "keep")
    repo = Repository(f"s3://{name}/repo", cache_dir=tmp_path)
    repo.entry("m")
    client.delete_object(Bucket=name, Key="repo/m/1/model.onnx")
    assert repo.names() == ["keep"]
    with pytest.raises(ModelNotFound, match=f"s3://{name}/repo"):
        repo.entry("m")
    assert not (tmp_path / "m").exists()


def test_a_model_in_use_removed_from_the_store_stops_being_served_after_a_poll(
    s3, bucket, tmp_path
):
    name, client = bucket
    put_model(client, name, "m")
    with Host(f"s3://{name}/repo", cache_dir=str(tmp_path)) as host:
        host.infer("m", {"X": X})
        client.delete_object(Bucket=name, Key="repo/m/1/model.onnx")
        host.refresh()
        with pytest.raises(ModelNotFound):
            host.infer("m", {"X": X})
    assert not (tmp_path / "m").exists()


def test_concurrent_first_requests_fetch_a_model_once(s3, bucket, tmp_path):
    name, client = bucket
    put_model(client, name, "m")
    repo = Repository(f"s3://{name}/repo", cache_dir=tmp_path)
    callers = 8
    barrier = threading.Barrier(callers)
    errors: list[BaseException] = []

    def first() -> None:
        barrier.wait(timeout=10)
        try:
            assert 1 in repo.entry("m").versions
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=first) for _ in range(callers)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=30)
    assert errors == []
    assert object_reads(s3, name, "m") == [f"/{name}/repo/m/1/model.onnx"]


def test_a_bare_model_file_is_a_model_too(s3, bucket, tmp_path):
    name, client = bucket
    client.put_object(Bucket=name, Key="repo/solo.onnx", Body=MODEL)
    with Host(f"s3://{name}/repo", cache_dir=str(tmp_path)) as host:
        assert host.repository.names() == ["solo"]
        assert host.infer("solo", {"X": X})["Y"].shape == (2, 1)


def test_tritons_spelling_names_the_endpoint_in_the_url(s3, bucket, tmp_path, monkeypatch):
    name, client = bucket
    put_model(client, name, "m")
    monkeypatch.delenv("AWS_ENDPOINT_URL")
    address = s3.endpoint.removeprefix("http://")
    repo = Repository(f"s3://{address}/{name}/repo", cache_dir=tmp_path)
    assert repo.names() == ["m"]
    assert 1 in repo.entry("m").versions


@pytest.mark.parametrize("scheme", ["http", "HTTP"])
def test_tritons_spelling_with_the_endpoints_scheme_names_it_in_the_url(
    s3, bucket, tmp_path, monkeypatch, scheme
):
    # s3://http://host:port/bucket/path was read as the bucket "http:", and obstore refused
    # it with "'None' is not an instance of 'str'".
    name, client = bucket
    put_model(client, name, "m")
    monkeypatch.delenv("AWS_ENDPOINT_URL")
    address = s3.endpoint.removeprefix("http://")
    repo = Repository(f"s3://{scheme}://{address}/{name}/repo", cache_dir=tmp_path)
    assert repo.names() == ["m"]
    assert 1 in repo.entry("m").versions


def test_tritons_https_spelling_speaks_tls_to_the_endpoint_it_names(s3, bucket, tmp_path):
    # moto answers plain HTTP: a client that speaks TLS to it fails its handshake, and
    # obstore's error names the URL it asked: https:// was taken as the endpoint's scheme.
    name, _ = bucket
    address = s3.endpoint.removeprefix("http://")
    url = f"s3://https://{address}/{name}/repo"
    with pytest.raises(RepositoryError) as caught:
        Repository(url, cache_dir=tmp_path, fetch_timeout_s=3)
    assert url in str(caught.value)
    # The listing went to the bucket at that endpoint, over TLS.
    assert f"GET https://{address}/{name}?" in str(caught.value)


def test_credentials_or_a_query_in_tritons_spelling_are_refused(bucket):
    with pytest.raises(RepositoryError, match="credentials do not belong") as caught:
        Store("s3://https://key:hunter2@host:9000/b/p")
    assert "hunter2" not in str(caught.value)
    with pytest.raises(RepositoryError, match="a query or fragment"):
        Store("s3://http://host:9000/b/p?token=1")
    with pytest.raises(RepositoryError, match="names no bucket"):
        Store("s3://http://host:9000/")


def test_an_empty_prefix_warns_as_an_empty_folder_does_naming_the_url(s3, bucket, tmp_path, caplog):
    name, client = bucket
    put_model(client, name, "m")
    url = f"s3://{name}/rpeo"  # a typo of repo/
    with (
        caplog.at_level(logging.WARNING, logger="corral"),
        Host(url, cache_dir=str(tmp_path)) as host,
    ):
        (problem,) = host.check(listing_only=True)
    assert problem.kind is ProblemKind.EMPTY_REPOSITORY
    assert problem.message == f"model repository {url} holds no model"
    assert f"{url}/<name>/1/model.onnx" in problem.fix
    assert str(tmp_path) not in str(problem)  # the URL, not the cache folder
    assert caplog.records[-1].levelno == logging.WARNING
    assert url in caplog.records[-1].getMessage()
    assert object_reads(s3, name) == []  # the listing alone: nothing fetched


def test_corral_serve_warns_of_an_empty_prefix_naming_the_url(s3, bucket, tmp_path):
    from tests.processes import start_server, stop_server

    name, client = bucket
    put_model(client, name, "m")
    url = f"s3://{name}/rpeo"
    served = start_server(
        url,  # type: ignore[arg-type]  # a URL, as the command line takes it
        tmp_path / "serve.log",
        "--cache-dir",
        str(tmp_path / "cache"),
    )
    stop_server(served)
    lines = (tmp_path / "serve.log").read_text().splitlines()
    warned = [line for line in lines if "holds no model" in line]
    assert len(warned) == 1, lines
    assert "WARNING" in warned[0]
    assert f"model repository {url} holds no model" in warned[0]


def test_a_fetch_from_a_paused_store_fails_within_its_deadline_naming_the_store(
    s3, bucket, tmp_path
):
    name, client = bucket
    put_model(client, name, "m")
    store = Store(f"s3://{name}/repo", tmp_path, timeout_s=1)
    s3server.pause(s3)
    try:
        started = time.monotonic()
        with (
            pytest.raises(StoreUnavailable, match=f"s3://{name}/repo") as caught,
            store.opened("m"),
        ):
            pass
        assert time.monotonic() - started < 20
    finally:
        s3server.resume(s3)
    assert caught.value.store == f"s3://{name}/repo"
    assert fresh(caught.value).store == f"s3://{name}/repo"  # as each waiter gets it
    assert store.stats().failures == 1
    with store.opened("m") as local:  # the store back, the same Store reads it
        assert Path(local, "1", "model.onnx").read_bytes() == MODEL


def test_a_store_error_is_a_503_with_retry_after():
    from corral.server.http.responses import error_answer

    status, body, headers = error_answer(
        StoreUnavailable("model 'm': cannot fetch it from s3://b/p", store="s3://b/p"), "POST", "/"
    )
    assert status == 503
    assert b"s3://b/p" in body
    assert dict(headers)[b"retry-after"] == b"5"


def test_wrong_credentials_are_a_clear_error_at_start_without_the_secret(tmp_path, monkeypatch):
    # moto checks signatures only when told to: with no action allowed unauthenticated, an
    # access key it never issued is refused.
    log = tmp_path / "moto.log"
    server = s3server.start(log, environment={"INITIAL_NO_AUTH_ACTION_COUNT": "0"})
    try:
        for variable, value in server.environment().items():
            monkeypatch.setenv(variable, value)
        with pytest.raises(RepositoryError) as caught:
            Repository("s3://models/repo", cache_dir=tmp_path / "cache")
    finally:
        s3server.stop(server)
    text = str(caught.value)
    assert "s3://models/repo" in text
    assert "403 Forbidden" in text
    assert "InvalidAccessKeyId: The AWS Access Key Id you provided does not exist" in text
    assert s3server.SECRET not in text


def test_serving_a_store_that_is_down_exits_within_a_minute_naming_it(tmp_path):
    env = {k: v for k, v in os.environ.items() if not k.startswith(("CORRAL_", "AWS_"))}
    env |= {
        "AWS_ENDPOINT_URL": f"http://127.0.0.1:{s3server.free_port()}",
        "AWS_ACCESS_KEY_ID": s3server.KEY_ID,
        "AWS_SECRET_ACCESS_KEY": s3server.SECRET,
        "AWS_REGION": "us-east-1",
    }
    started = time.monotonic()
    done = subprocess.run(
        [
            sys.executable,
            "-c",
            "import sys; from corral.cli import main; sys.exit(main())",
            "serve",
            "s3://models/repo",
            "--cache-dir",
            str(tmp_path),
            "--http-port",
            "0",
            "--grpc-port",
            "-1",
        ],
        capture_output=True,
        text=True,
        env=env,
        timeout=90,
    )
    assert time.monotonic() - started < 60
    assert done.returncode != 0
    assert "s3://models/repo" in done.stderr
    assert "Traceback" not in done.stderr + done.stdout
    assert s3server.SECRET not in done.stderr + done.stdout


def test_cache_options_are_refused_for_a_local_folder(tmp_path):
    with pytest.raises(InvalidOption, match="cache_dir"):
        Repository(tmp_path, cache_dir=tmp_path / "cache")
    with pytest.raises(InvalidOption, match="cache_bytes"):
        corral.HostOptions(cache_bytes="lots")


def test_cache_options_beside_a_repository_object_are_refused(tmp_path):
    with pytest.raises(InvalidOption, match="cache_dir"):
        Host(Repository(tmp_path), cache_dir=str(tmp_path / "cache"))


def test_only_object_store_urls_go_to_a_store():
    assert is_store_url("s3://b/p")
    assert is_store_url("GS://b")
    assert not is_store_url("models/")
    assert not is_store_url("file:///models")
    assert not is_store_url(Path("s3://b"))


def test_credentials_in_the_url_are_refused_without_being_shown(bucket):
    with pytest.raises(RepositoryError, match="credentials do not belong") as caught:
        Store("s3://key:hunter2@b/p")
    assert "hunter2" not in str(caught.value)


def test_corral_serve_answers_from_the_store_and_a_503_with_retry_after_while_it_hangs(
    s3, bucket, tmp_path
):
    import httpx

    from tests.processes import start_server, stop_server

    name, client = bucket
    put_model(client, name, "warm")
    put_model(client, name, "cold")
    body = {"inputs": [{"name": "X", "shape": [2, 4], "datatype": "FP32", "data": [1.0] * 8}]}
    served = start_server(
        f"s3://{name}/repo",  # type: ignore[arg-type]  # a URL, as the command line takes it
        tmp_path / "serve.log",
        "--cache-dir",
        str(tmp_path / "cache"),
        # The fetch's deadline is half of it: 3 s, well before the load's own.
        "--load-timeout-s",
        "6",
    )
    try:
        url = f"http://{served.http}/v2/models"
        assert httpx.post(f"{url}/warm/infer", json=body, timeout=30).status_code == 200
        assert object_reads(s3, name, "cold") == []
        s3server.pause(s3)
        try:
            started = time.monotonic()
            answer = httpx.post(f"{url}/cold/infer", json=body, timeout=60)
            took = time.monotonic() - started
            # The model already loaded answers while the store hangs.
            assert httpx.post(f"{url}/warm/infer", json=body, timeout=30).status_code == 200
        finally:
            s3server.resume(s3)
        assert answer.status_code == 503, answer.text
        assert answer.headers.get("retry-after") == "5", answer.text
        assert took < 30
        assert f"s3://{name}/repo" in answer.json()["error"]
        metrics = httpx.get(f"http://{served.http}/metrics", timeout=30).text
        assert "corral_store_fetches_total 1.0" in metrics  # "warm"
        assert "corral_store_fetch_failures_total 1.0" in metrics  # "cold", while paused
        assert f"corral_store_cache_bytes {float(len(MODEL))}" in metrics
        cache = httpx.get(f"http://{served.http}/v2/corral/status", timeout=30).json()
        cache = cache["server"]["cache"]
        assert (cache["url"], cache["bytes"], cache["fetches"], cache["failures"]) == (
            f"s3://{name}/repo",
            len(MODEL),
            1,
            1,
        )
    finally:
        stop_server(served)
    log = (tmp_path / "serve.log").read_text()
    assert f"s3://{name}/repo" in log
    assert s3server.SECRET not in log


def test_a_store_refuses_bad_urls_and_sizes_naming_them(bucket):
    with pytest.raises(InvalidOption, match="cache_bytes"):
        Store("s3://b/p", cache_bytes=0)
    with pytest.raises(RepositoryError, match="a query or fragment"):
        Store("s3://b/p?x=1")
    with pytest.raises(RepositoryError, match="names no bucket"):
        Store("s3:///p")


def test_a_model_larger_than_the_whole_cache_is_a_load_error_naming_both(s3, bucket, tmp_path):
    name, client = bucket
    put_model(client, name, "m")
    store = Store(f"s3://{name}/repo", tmp_path, cache_bytes=len(MODEL) - 1)
    with (
        pytest.raises(corral.ModelLoadError, match=f"holds {len(MODEL)} bytes") as caught,
        store.opened("m"),
    ):
        pass
    assert not isinstance(caught.value, StoreUnavailable)  # waiting would not help
    assert store.stats().failures == 1


def test_the_default_cache_is_a_folder_of_its_own_removed_with_the_store(s3, bucket):
    name, client = bucket
    put_model(client, name, "m")
    store = Store(f"s3://{name}/repo")
    folder = Path(store.cache_dir)
    assert repr(store) == f"Store('s3://{name}/repo', cache {str(folder)!r})"
    with store.opened("m"):
        assert (folder / "m" / "1" / "model.onnx").is_file()
    del store
    assert not folder.exists()


def test_names_that_cannot_name_a_model_are_listed_apart(s3, bucket, tmp_path):
    name, client = bucket
    put_model(client, name, "good")
    put_model(client, name, "bad name")
    client.put_object(Bucket=name, Key="repo/notes.txt", Body=b"x")
    listing = Repository(f"s3://{name}/repo", cache_dir=tmp_path).listing()
    assert listing == (["good"], ["bad name"])


def test_a_bare_model_that_becomes_a_folder_is_read_as_the_folder(s3, bucket, tmp_path):
    name, client = bucket
    client.put_object(Bucket=name, Key="repo/m.onnx", Body=MODEL)
    repo = Repository(f"s3://{name}/repo", cache_dir=tmp_path)
    assert repo.entry("m").versions[1].path == tmp_path / "m.onnx"
    client.delete_object(Bucket=name, Key="repo/m.onnx")
    put_model(client, name, "m", 3)
    entry = repo.entry("m")
    assert sorted(entry.versions) == [3]
    assert entry.versions[3].path == tmp_path / "m" / "3" / "model.onnx"
    assert not (tmp_path / "m.onnx").exists()


def test_a_cache_of_another_repository_is_not_taken_for_this_ones(s3, bucket, tmp_path):
    name, client = bucket
    put_model(client, name, "m")
    with Store(f"s3://{name}/repo", tmp_path).opened("m"):
        pass
    other = Store(f"s3://{name}/elsewhere", tmp_path)
    assert other.stats().models == 0


def test_corral_models_lists_a_store(s3, bucket, tmp_path, capsys):
    from corral.cli import main

    name, client = bucket
    put_model(client, name, "m")
    assert main(["models", f"s3://{name}/repo"]) == 0
    assert "m" in capsys.readouterr().out


def test_a_model_whose_files_were_evicted_is_fetched_again_when_asked(s3, bucket, tmp_path):
    name, client = bucket
    for model in ("a", "b", "c"):
        put_model(client, name, model)
    with Host(
        f"s3://{name}/repo",
        cache_dir=str(tmp_path),
        cache_bytes=len(MODEL),
        max_loaded_models=1,
    ) as host:
        for model in ("a", "b", "c", "a"):
            assert host.infer(model, {"X": X})["Y"].shape == (2, 1), model
        assert host.repository.store.stats().evictions >= 2
    assert len(object_reads(s3, name, "a")) == 2


def test_concurrent_readers_of_a_fetch_that_fails_share_its_one_failure(s3, bucket, tmp_path):
    name, client = bucket
    put_model(client, name, "m")
    store = Store(f"s3://{name}/repo", tmp_path, timeout_s=3)
    callers = 4
    barrier = threading.Barrier(callers)
    errors: list[BaseException] = []

    def first() -> None:
        barrier.wait(timeout=10)
        try:
            with store.opened("m"):
                pass
        except StoreUnavailable as exc:
            errors.append(exc)

    s3server.pause(s3)
    try:
        threads = [threading.Thread(target=first) for _ in range(callers)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(timeout=60)
    finally:
        s3server.resume(s3)
    assert len(errors) == callers
    assert len({id(error) for error in errors}) == callers  # each its own copy
    assert store.stats().failures == 1  # one fetch failed, for all of them


def test_listing_requests_are_counted_as_the_store_received_them(s3, bucket, tmp_path):
    name, client = bucket
    models = 1001  # two pages of the listing

    def put(index: int) -> None:
        client.put_object(Bucket=name, Key=f"repo/m{index}/1/model.onnx", Body=b"x")

    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(8) as pool:
        list(pool.map(put, range(models)))

    def listings() -> int:
        return len([path for path in s3.requests("GET") if path.startswith(f"/{name}?")])

    before = listings()
    store = Store(f"s3://{name}/repo", tmp_path)
    assert len(store.names()[0]) == models
    with store.opened("m7"):
        pass
    assert listings() - before == store.stats().list_requests == 3  # 2 pages, then m7's


def test_importing_corral_or_serving_a_folder_does_not_import_the_store_library(tmp_path):
    script = (
        "import sys, corral\n"
        "from corral._models.repository import Repository\n"
        f"Repository({str(tmp_path)!r}).names()\n"
        "assert 'obstore' not in sys.modules, 'obstore imported'\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr


def test_a_key_that_would_leave_the_models_folder_is_refused_and_nothing_written(
    s3, bucket, tmp_path
):
    name, client = bucket
    put_model(client, name, "m")
    client.put_object(Bucket=name, Key="repo/m/1/../../../escaped.txt", Body=b"x")
    client.put_object(Bucket=name, Key="repo/ok/1/", Body=b"")  # a console's folder marker
    put_model(client, name, "ok")
    cache = tmp_path / "cache"
    repo = Repository(f"s3://{name}/repo", cache_dir=cache)
    # obstore refuses such a key itself while listing; corral would too (_check_inside).
    with pytest.raises(corral.ModelLoadError, match=r"\.\."):
        repo.entry("m")
    assert not any(path.name == "escaped.txt" for path in tmp_path.rglob("*"))
    assert 1 in repo.entry("ok").versions


def test_a_models_latest_bytes_come_from_the_listing_without_fetching(s3, bucket, tmp_path):
    name, client = bucket
    put_model(client, name, "two", version=1, body=b"x" * 10)
    put_model(client, name, "two", version=2, body=b"x" * 30)
    client.put_object(Bucket=name, Key="repo/two/2/weights.bin", Body=b"w" * 5)
    client.put_object(Bucket=name, Key="repo/two/config.pbtxt", Body=b"c" * 7)
    client.put_object(Bucket=name, Key="repo/bare.onnx", Body=b"b" * 12)
    client.put_object(Bucket=name, Key="repo/empty/config.pbtxt", Body=b"c")
    store = Store(f"s3://{name}/repo", tmp_path / "cache")
    before = store.stats().list_requests
    # The highest version's files, model and external data: not version 1, not the config.
    assert store.latest_bytes("two") == 35
    assert store.latest_bytes("bare") == 12
    assert store.latest_bytes("empty") is None  # no version folder
    assert store.latest_bytes("missing") is None
    assert object_reads(s3, name) == []
    assert store.stats().list_requests - before == 4
    assert store.stats().fetches == 0


def test_ray_sizes_a_stores_routing_count_from_its_listing_without_fetching(s3, bucket):
    pytest.importorskip("ray.serve")
    from corral._host.budget import estimate_model_bytes
    from corral.ray import RayServeConfig, models_per_replica

    name, client = bucket
    for model in ("a", "b", "c"):
        put_model(client, name, model)
    # A model with no version yet takes no part in the mean.
    client.put_object(Bucket=name, Key="repo/unversioned/config.pbtxt", Body=b"")
    repository = Repository(f"s3://{name}/repo")
    mean = estimate_model_bytes(len(MODEL))
    assert models_per_replica(repository, RayServeConfig(memory_budget=10 * mean)) == 10
    # A URL given as it is makes its own Repository: the same count.
    assert models_per_replica(f"s3://{name}/repo", RayServeConfig(memory_budget=10 * mean)) == 10
    # Sized from what the store lists: no model was copied into a cache.
    assert object_reads(s3, name) == []
    assert repository.store is not None
    assert repository.store.stats().fetches == 0


def test_ray_refuses_cache_options_beside_a_repository_folder(tmp_path):
    pytest.importorskip("ray.serve")
    from corral.ray import RayServeConfig, build_app

    for option in ({"cache_dir": str(tmp_path)}, {"cache_bytes": "1GiB"}):
        with pytest.raises(InvalidOption, match="applies to a repository in object storage"):
            build_app(tmp_path, RayServeConfig(**option))


def test_replicas_of_a_store_cache_in_subfolders_they_claimed(s3, bucket, tmp_path, monkeypatch):
    pytest.importorskip("ray.serve")
    from types import SimpleNamespace

    import corral.ray._replica as replica_module
    from corral.ray import ModelReplica, RayServeConfig

    # Ray's serve functions a replica calls while it is made, stood in for.
    serve = SimpleNamespace(
        get_replica_context=lambda: SimpleNamespace(replica_tag="replica"),
        multiplexed=lambda max_num_models_per_replica: lambda route: route,
    )
    monkeypatch.setattr(replica_module, "serve", serve)
    name, client = bucket
    put_model(client, name, "a")
    cache = tmp_path / "cache"
    config = RayServeConfig(cache_dir=str(cache), compute_workers=1)
    one = ModelReplica(f"s3://{name}/repo", config)
    two = ModelReplica(f"s3://{name}/repo", config)
    try:
        for replica, folder in ((one, "replica-0"), (two, "replica-1")):
            assert replica.host.infer("a", {"X": X})["Y"].shape == (2, 1)
            assert (cache / folder / "a" / "1" / "model.onnx").read_bytes() == MODEL
    finally:
        one.__del__()
        two.__del__()
    # Both claims ended with their replicas: the next replica here takes replica-0 again.
    folder, claim = replica_module.claim_cache_folder(str(cache))
    os.close(claim)
    assert folder == str(cache / "replica-0")


def test_a_models_latest_bytes_from_a_store_that_is_down_name_the_store(tmp_path, monkeypatch):
    monkeypatch.setenv("AWS_ENDPOINT_URL", f"http://127.0.0.1:{s3server.free_port()}")
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", s3server.KEY_ID)
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", s3server.SECRET)
    monkeypatch.setenv("AWS_REGION", "us-east-1")
    store = Store("s3://models/repo", tmp_path / "cache", timeout_s=3)
    with pytest.raises(StoreUnavailable, match=r"model 'a': cannot list it in s3://models/repo"):
        store.latest_bytes("a")
