"""Repository: layout, versions, model.toml, names, path escapes and change detection."""

from __future__ import annotations

import logging
import os
import re
import shutil
import threading
import time
from pathlib import Path

import numpy as np
import pytest

import corral
from corral._base.errors import (
    InvalidModelName,
    ModelConfigError,
    ModelInvalid,
    ModelLoadError,
    ModelNotFound,
    RepositoryError,
)
from corral._models.config import ModelConfig
from corral._models.repository import (
    MAX_CONFIG_BYTES,
    MODEL_NAME_PATTERN,
    Repository,
    validate_model_name,
)
from corral.testing import build_mlp
from tests.helpers import add_model

X = np.ones((2, 4), np.float32)
OUTSIDE = "resolves outside the repository root"


@pytest.fixture
def root(tmp_path: Path) -> Path:
    path = tmp_path / "repo"
    path.mkdir()
    return path


@pytest.fixture
def outside(tmp_path: Path, linear_model: bytes) -> Path:
    """A folder next to the root holding a model and a model.toml: bait for escapes."""
    path = tmp_path / "outside"
    (path / "1").mkdir(parents=True)
    (path / "1" / "model.onnx").write_bytes(linear_model)
    (path / "model.toml").write_text("pinned = true\n")
    (path / "model.onnx").write_bytes(linear_model)
    return path


def write_config(root: Path, name: str, text: str) -> Path:
    path = root / name / "model.toml"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


# -- the root ----------------------------------------------------------------------------------


def test_a_missing_root_is_a_repository_error(tmp_path: Path):
    with pytest.raises(RepositoryError, match="does not exist"):
        Repository(tmp_path / "nowhere")


def test_a_file_as_root_is_a_repository_error(tmp_path: Path):
    (tmp_path / "file").write_text("x")
    with pytest.raises(RepositoryError, match="not a folder"):
        Repository(tmp_path / "file")


def test_the_root_is_resolved_and_its_target_shown(tmp_path: Path, root: Path):
    (tmp_path / "link").symlink_to(root)
    repo = Repository(str(tmp_path / "link"))
    assert repo.root == Path(os.path.realpath(root))
    assert repo.given == tmp_path / "link"
    assert repr(repo) == f"Repository({str(tmp_path / 'link')!r} -> {str(repo.root)!r})"
    assert repr(Repository(repo.root)) == f"Repository({str(repo.root)!r})"


def test_an_empty_repository(root: Path):
    repo = Repository(root)
    assert repo.names() == []
    assert repo.scan() == {}


# -- layout ------------------------------------------------------------------------------------


def test_folder_with_versions(root: Path, linear_model: bytes, mlp_model: bytes):
    one = add_model(root, "fraud", linear_model)
    two = add_model(root, "fraud", mlp_model, version=2)
    entry = Repository(root).entry("fraud")
    assert entry.error is None
    assert entry.name == "fraud"
    assert list(entry.versions) == [1, 2]
    assert entry.versions[1].path == one.resolve()
    assert entry.versions[2].path == two.resolve()
    assert entry.versions[2].size == len(mlp_model)
    assert entry.versions[2].mtime_ns == two.stat().st_mtime_ns
    assert entry.config == ModelConfig()
    assert entry.served_versions == (2,)
    assert entry.latest == 2


def test_versions_are_ordered_numerically(root: Path, linear_model: bytes):
    for version in (10, 2, 1, 33):
        add_model(root, "m", linear_model, version=version)
    entry = Repository(root).entry("m")
    assert list(entry.versions) == [1, 2, 10, 33]
    assert entry.latest == 33


def test_bare_file_is_version_one_with_the_default_config(root: Path, linear_model: bytes):
    (root / "churn.onnx").write_bytes(linear_model)
    repo = Repository(root)
    assert repo.names() == ["churn"]
    entry = repo.entry("churn")
    assert entry.error is None
    assert list(entry.versions) == [1]
    assert entry.versions[1].path == (root / "churn.onnx").resolve()
    assert entry.config == ModelConfig()
    assert entry.latest == 1


@pytest.mark.parametrize("ignored", ["latest", "v2", "01", "0", "-1", "1.0", " 3", ".2"])
def test_non_version_folders_are_ignored(root: Path, linear_model: bytes, ignored: str):
    add_model(root, "m", linear_model)
    add_model(root, "m", linear_model, version=ignored)
    entry = Repository(root).entry("m")
    assert entry.error is None
    assert list(entry.versions) == [1]


def test_a_version_folder_without_model_onnx_is_ignored(root: Path, linear_model: bytes):
    add_model(root, "m", linear_model)
    (root / "m" / "2").mkdir()
    (root / "m" / "3").mkdir()
    (root / "m" / "3" / "other.onnx").write_bytes(linear_model)
    entry = Repository(root).entry("m")
    assert entry.error is None
    assert list(entry.versions) == [1]
    assert entry.latest == 1


def test_a_file_named_like_a_version_is_ignored(root: Path, linear_model: bytes):
    add_model(root, "m", linear_model)
    (root / "m" / "2").write_bytes(linear_model)
    assert list(Repository(root).entry("m").versions) == [1]


def test_a_model_onnx_that_is_a_folder_is_an_error(root: Path, linear_model: bytes):
    add_model(root, "m", linear_model)
    (root / "m" / "2" / "model.onnx").mkdir(parents=True)
    entry = Repository(root).entry("m")
    assert isinstance(entry.error, ModelLoadError)
    assert "2/model.onnx is not a regular file" in str(entry.error)


def test_a_folder_with_no_version_is_an_error(root: Path):
    (root / "empty" / "latest").mkdir(parents=True)
    entry = Repository(root).entry("empty")
    assert type(entry.error) is ModelInvalid  # what is on disk: fails alike until it changes
    assert "no version" in str(entry.error)
    assert entry.versions == {}
    assert entry.served_versions == ()
    assert entry.latest is None


def test_both_folder_and_bare_file_is_an_error(root: Path, linear_model: bytes):
    add_model(root, "m", linear_model)
    (root / "m.onnx").write_bytes(linear_model)
    repo = Repository(root)
    assert repo.names() == ["m"]
    entry = repo.entry("m")
    assert isinstance(entry.error, ModelLoadError)
    assert "both" in str(entry.error)
    assert "m.onnx" in str(entry.error)


def test_a_missing_model_is_not_found(root: Path, linear_model: bytes):
    add_model(root, "m", linear_model)
    (root / "notes").write_text("not a model")
    repo = Repository(root)
    with pytest.raises(ModelNotFound, match="'nope'"):
        repo.entry("nope")
    with pytest.raises(ModelNotFound):
        repo.entry("notes")  # a top-level file without .onnx is not a model


def test_a_folder_named_like_a_bare_file_is_a_model_of_that_name(root: Path, linear_model: bytes):
    add_model(root, "a.onnx", linear_model)
    repo = Repository(root)
    assert repo.names() == ["a.onnx"]
    assert repo.entry("a.onnx").error is None
    with pytest.raises(ModelNotFound):
        repo.entry("a")


def test_names_lists_folders_and_bare_files_sorted(root: Path, linear_model: bytes):
    add_model(root, "zeta", linear_model)
    add_model(root, "Alpha", linear_model)
    (root / "beta.onnx").write_bytes(linear_model)
    (root / "no-versions-yet").mkdir()
    (root / "README.md").write_text("docs")
    (root / "weights.bin").write_bytes(b"\0")
    assert Repository(root).names() == ["Alpha", "beta", "no-versions-yet", "zeta"]


def test_names_skips_invalid_names_and_logs_them(
    root: Path, linear_model: bytes, caplog: pytest.LogCaptureFixture
):
    add_model(root, "good", linear_model)
    (root / ".git").mkdir()
    (root / "has space").mkdir()
    (root / ".hidden.onnx").write_bytes(linear_model)
    (root / "_private").mkdir()
    (root / ("x" * 129)).mkdir()
    with caplog.at_level(logging.DEBUG, logger="corral._models.repository"):
        assert Repository(root).names() == ["good"]
    skipped = caplog.text
    for name in (".git", "has space", ".hidden", "_private"):
        assert repr(name) in skipped


def test_scan_holds_every_model(root: Path, linear_model: bytes):
    add_model(root, "a", linear_model)
    add_model(root, "a", linear_model, version=2)
    (root / "b.onnx").write_bytes(linear_model)
    (root / "c").mkdir()
    scanned = Repository(root).scan()
    assert list(scanned) == ["a", "b", "c"]
    assert scanned["a"].latest == 2
    assert scanned["b"].latest == 1
    assert scanned["c"].error is not None


def test_entry_is_immutable_and_hashable(root: Path, linear_model: bytes):
    add_model(root, "m", linear_model)
    entry = Repository(root).entry("m")
    with pytest.raises(TypeError):
        entry.versions[2] = entry.versions[1]  # type: ignore[index]
    with pytest.raises(AttributeError):
        entry.name = "other"  # type: ignore[misc]
    hash(entry)
    hash(entry.fingerprint)
    assert entry == Repository(root).entry("m")


# -- model.toml --------------------------------------------------------------------------------


def test_model_toml_is_read(root: Path, linear_model: bytes):
    for version in (1, 2, 3):
        add_model(root, "m", linear_model, version=version)
    write_config(
        root,
        "m",
        'pinned = true\nconcurrency = "exclusive"\nversion_policy = { specific = [1, 3] }\n',
    )
    entry = Repository(root).entry("m")
    assert entry.error is None
    assert entry.config.pinned is True
    assert entry.config.concurrency == "exclusive"
    assert entry.served_versions == (1, 3)
    assert entry.latest == 3


@pytest.mark.parametrize(
    ("policy", "served"),
    [
        ('"latest"', (3,)),
        ('"all"', (1, 2, 3)),
        ("{ latest = 2 }", (2, 3)),
        ("{ specific = [2, 9] }", (2,)),
        ("{ specific = [9] }", ()),
    ],
)
def test_served_versions_follow_the_policy(root: Path, linear_model: bytes, policy, served):
    for version in (1, 2, 3):
        add_model(root, "m", linear_model, version=version)
    write_config(root, "m", f"version_policy = {policy}\n")
    entry = Repository(root).entry("m")
    assert entry.served_versions == served
    assert entry.latest == (served[-1] if served else None)
    assert list(entry.versions) == [1, 2, 3]  # on disk, whatever is served


def test_a_malformed_model_toml_affects_only_that_model(root: Path, linear_model: bytes):
    add_model(root, "bad", linear_model)
    add_model(root, "good", linear_model)
    config = write_config(root, "bad", "max_batch_size = true\n")
    repo = Repository(root)
    scanned = repo.scan()
    assert list(scanned) == ["bad", "good"]
    error = scanned["bad"].error
    assert isinstance(error, ModelConfigError)
    assert str(config) in str(error)
    assert "max_batch_size" in str(error)
    assert scanned["bad"].config == ModelConfig()
    assert scanned["good"].error is None
    with corral.Session(scanned["good"].versions[1].path) as session:
        assert session.run({"X": X})["Y"].shape == (2, 1)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("max_batch_size = [", "invalid TOML"),
        ("max_batch_sise = 3", "unknown key 'max_batch_sise'"),
        ("version_policy = { latest = 0 }", "version_policy.latest"),
    ],
)
def test_model_toml_errors_name_the_file(root: Path, linear_model: bytes, text, expected):
    add_model(root, "m", linear_model)
    config = write_config(root, "m", text)
    error = Repository(root).entry("m").error
    assert isinstance(error, ModelConfigError)
    assert str(error).startswith(f"{config}: ")
    assert expected in str(error)


def test_an_oversized_model_toml_is_not_read(root: Path, linear_model: bytes):
    add_model(root, "m", linear_model)
    write_config(root, "m", "# padding\n" * (MAX_CONFIG_BYTES // 10 + 1))
    error = Repository(root).entry("m").error
    assert isinstance(error, ModelConfigError)
    assert "limit" in str(error)


def test_a_model_toml_that_is_not_utf8_is_an_error(root: Path, linear_model: bytes):
    add_model(root, "m", linear_model)
    (root / "m" / "model.toml").write_bytes(b"pinned = true # \xff\n")
    error = Repository(root).entry("m").error
    assert isinstance(error, ModelConfigError)
    assert "UTF-8" in str(error)


def test_a_dangling_model_toml_symlink_is_an_error(root: Path, linear_model: bytes):
    add_model(root, "m", linear_model)
    (root / "m" / "model.toml").symlink_to(root / "m" / "gone.toml")
    error = Repository(root).entry("m").error
    assert isinstance(error, ModelConfigError)
    assert "does not exist" in str(error)


# -- names -------------------------------------------------------------------------------------


GOOD_NAMES = [
    "a",
    "A",
    "0",
    "fraud",
    "fraud-v2",
    "fraud_v2",
    "fraud.v2",
    "9lives",
    "a..b",
    "x" * 128,
]
BAD_NAMES = [
    ("", "empty"),
    (".", "start with a letter or digit"),
    ("..", "start with a letter or digit"),
    ("a/b", "'/'"),
    ("../x", "'/'"),
    ("/abs", "'/'"),
    ("a\\b", "'\\\\'"),
    (".hidden", "start with a letter or digit"),
    ("-flag", "start with a letter or digit"),
    ("_private", "start with a letter or digit"),
    ("x" * 129, "at most 128"),
    ("has space", "' '"),
    ("tab\t", "'\\t'"),
    ("line\n", "'\\n'"),
    ("nul\0", "'\\x00'"),
    ("café", "'é'"),
    ("٣", "'٣'"),  # a non-ASCII digit
]


@pytest.mark.parametrize("name", GOOD_NAMES)
def test_good_names(name):
    assert validate_model_name(name) == name
    assert re.fullmatch(MODEL_NAME_PATTERN, name)


@pytest.mark.parametrize(("name", "rule"), BAD_NAMES)
def test_bad_names_say_which_rule(name, rule):
    with pytest.raises(InvalidModelName) as info:
        validate_model_name(name)
    assert rule in str(info.value)
    assert not re.fullmatch(MODEL_NAME_PATTERN, name)


@pytest.mark.parametrize("name", [None, 3, b"fraud", Path("fraud"), ["fraud"]])
def test_non_string_names_are_invalid(name):
    with pytest.raises(InvalidModelName, match="must be a string"):
        validate_model_name(name)


@pytest.mark.parametrize(("name", "rule"), BAD_NAMES)
def test_entry_rejects_bad_names_before_touching_the_disk(root: Path, name, rule):
    (root / "x").mkdir()
    with pytest.raises(InvalidModelName):
        Repository(root).entry(name)


# -- path escapes ------------------------------------------------------------------------------


def assert_outside(entry_error: ModelLoadError | None) -> None:
    assert isinstance(entry_error, ModelLoadError)
    assert OUTSIDE in str(entry_error)


def assert_rest_still_works(repo: Repository, escaped: str) -> None:
    scanned = repo.scan()
    assert "good" in scanned
    assert escaped in scanned  # listed, with its error, not hidden
    good = scanned["good"]
    assert good.error is None
    with corral.Session(good.versions[1].path) as session:
        assert session.run({"X": X})["Y"].shape == (2, 1)


@pytest.fixture
def repo_with_good(root: Path, linear_model: bytes) -> Repository:
    add_model(root, "good", linear_model)
    return Repository(root)


def test_a_model_folder_symlink_outside(root: Path, outside: Path, repo_with_good: Repository):
    (root / "evil").symlink_to(outside, target_is_directory=True)
    entry = repo_with_good.entry("evil")
    assert_outside(entry.error)
    assert entry.versions == {}
    assert entry.config == ModelConfig()  # its model.toml (pinned = true) was not read
    assert_rest_still_works(repo_with_good, "evil")


def test_a_version_folder_symlink_outside(
    root: Path, outside: Path, linear_model: bytes, repo_with_good: Repository
):
    add_model(root, "evil", linear_model)
    (root / "evil" / "2").symlink_to(outside / "1", target_is_directory=True)
    entry = repo_with_good.entry("evil")
    assert_outside(entry.error)
    assert "evil/2" in str(entry.error)
    assert 2 not in entry.versions
    assert_rest_still_works(repo_with_good, "evil")


def test_a_model_onnx_symlink_outside(root: Path, outside: Path, repo_with_good: Repository):
    (root / "evil" / "1").mkdir(parents=True)
    (root / "evil" / "1" / "model.onnx").symlink_to(outside / "model.onnx")
    entry = repo_with_good.entry("evil")
    assert_outside(entry.error)
    assert entry.versions == {}
    assert_rest_still_works(repo_with_good, "evil")


def test_a_model_toml_symlink_outside_is_not_read(
    root: Path, outside: Path, linear_model: bytes, repo_with_good: Repository
):
    add_model(root, "evil", linear_model)
    (root / "evil" / "model.toml").symlink_to(outside / "model.toml")
    entry = repo_with_good.entry("evil")
    assert_outside(entry.error)
    assert "model.toml" in str(entry.error)
    assert entry.config.pinned is False
    assert_rest_still_works(repo_with_good, "evil")


def test_a_bare_file_symlink_outside(root: Path, outside: Path, repo_with_good: Repository):
    (root / "evil.onnx").symlink_to(outside / "model.onnx")
    entry = repo_with_good.entry("evil")
    assert_outside(entry.error)
    assert entry.versions == {}
    assert_rest_still_works(repo_with_good, "evil")


def test_a_relative_symlink_climbing_out(
    root: Path, outside: Path, linear_model: bytes, repo_with_good: Repository
):
    add_model(root, "evil", linear_model)
    (root / "evil" / "2").mkdir()
    (root / "evil" / "2" / "model.onnx").symlink_to("../../../outside/model.onnx")
    assert_outside(repo_with_good.entry("evil").error)


def test_a_sibling_folder_sharing_the_root_prefix_is_outside(
    tmp_path: Path, root: Path, linear_model: bytes, repo_with_good: Repository
):
    # "/tmp/x/repo-other" starts with "/tmp/x/repo": a plain prefix test would let it in.
    sibling = tmp_path / (root.name + "-other")
    add_model(sibling, "m", linear_model)
    (root / "evil").symlink_to(sibling / "m", target_is_directory=True)
    assert_outside(repo_with_good.entry("evil").error)


def test_symlinks_inside_the_root_are_fine(root: Path, linear_model: bytes, mlp_model: bytes):
    store = root / "_store"  # an invalid model name: not listed itself
    store.mkdir()
    (store / "v1.onnx").write_bytes(linear_model)
    (store / "v2").mkdir()
    (store / "v2" / "model.onnx").write_bytes(mlp_model)
    (store / "config.toml").write_text("warmup = true\n")
    add_model(root, "real", linear_model)

    (root / "m" / "1").mkdir(parents=True)
    (root / "m" / "1" / "model.onnx").symlink_to(store / "v1.onnx")
    (root / "m" / "2").symlink_to(store / "v2", target_is_directory=True)
    (root / "m" / "model.toml").symlink_to("../_store/config.toml")
    (root / "alias").symlink_to("real", target_is_directory=True)
    (root / "bare.onnx").symlink_to(store / "v1.onnx")

    repo = Repository(root)
    assert repo.names() == ["alias", "bare", "m", "real"]
    entry = repo.entry("m")
    assert entry.error is None
    assert entry.config.warmup is True
    assert entry.versions[1].path == (store / "v1.onnx").resolve()
    assert entry.versions[2].path == (store / "v2" / "model.onnx").resolve()
    alias = repo.entry("alias")
    assert alias.error is None
    assert alias.versions[1].path == (root / "real" / "1" / "model.onnx").resolve()
    assert repo.entry("bare").versions[1].path == (store / "v1.onnx").resolve()
    for version in entry.versions.values():
        assert version.path.is_relative_to(repo.root)
    with corral.Session(entry.versions[2].path) as session:
        assert session.run({"X": X})["Y"].shape == (2, 1)


def test_a_symlink_loop_is_an_error_not_an_exception(root: Path, linear_model: bytes):
    add_model(root, "m", linear_model)
    (root / "m" / "2").mkdir()
    (root / "m" / "2" / "model.onnx").symlink_to("model.onnx")
    entry = Repository(root).entry("m")
    assert isinstance(entry.error, ModelLoadError)
    assert 1 in entry.versions


def test_a_root_reached_through_a_symlink_still_confines(
    tmp_path: Path, root: Path, outside: Path, linear_model: bytes
):
    add_model(root, "good", linear_model)
    (root / "evil").symlink_to(outside, target_is_directory=True)
    (tmp_path / "via").symlink_to(root, target_is_directory=True)
    repo = Repository(tmp_path / "via")
    assert repo.entry("good").error is None
    assert_outside(repo.entry("evil").error)


# -- change detection --------------------------------------------------------------------------


def set_mtime(path: Path, delta_ns: int = 5_000_000_000) -> None:
    info = path.stat()
    os.utime(path, ns=(info.st_atime_ns, info.st_mtime_ns + delta_ns))


def test_fingerprint_is_stable_when_nothing_changed(root: Path, linear_model: bytes):
    add_model(root, "m", linear_model)
    write_config(root, "m", "pinned = true\n")
    (root / "b.onnx").write_bytes(linear_model)
    repo = Repository(root)
    assert repo.entry("m").fingerprint == repo.entry("m").fingerprint
    assert repo.entry("b").fingerprint == Repository(root).entry("b").fingerprint
    assert repo.scan() == repo.scan()


def test_fingerprint_changes_when_the_served_file_is_rewritten(root: Path, linear_model: bytes):
    path = add_model(root, "m", linear_model)
    repo = Repository(root)
    before = repo.entry("m").fingerprint
    set_mtime(path)
    after_touch = repo.entry("m").fingerprint
    assert after_touch != before
    info = path.stat()
    path.write_bytes(linear_model + b"\0")  # same mtime, another size
    os.utime(path, ns=(info.st_atime_ns, info.st_mtime_ns))
    assert repo.entry("m").fingerprint != after_touch


def test_fingerprint_changes_when_a_bare_file_is_rewritten(root: Path, linear_model: bytes):
    path = root / "b.onnx"
    path.write_bytes(linear_model)
    repo = Repository(root)
    before = repo.entry("b").fingerprint
    set_mtime(path)
    assert repo.entry("b").fingerprint != before


def test_fingerprint_changes_when_model_toml_changes(root: Path, linear_model: bytes):
    add_model(root, "m", linear_model)
    repo = Repository(root)
    without = repo.entry("m").fingerprint
    config = write_config(root, "m", "pinned = true\n")
    with_config = repo.entry("m").fingerprint
    assert with_config != without
    set_mtime(config)
    assert repo.entry("m").fingerprint != with_config


def test_fingerprint_changes_when_a_version_is_added_or_removed(root: Path, linear_model: bytes):
    add_model(root, "m", linear_model)
    write_config(root, "m", "version_policy = { specific = [1] }\n")
    repo = Repository(root)
    one = repo.entry("m").fingerprint
    two_path = add_model(root, "m", linear_model, version=2)
    two = repo.entry("m").fingerprint
    assert two != one  # version 2 is not served, but the set of versions changed
    two_path.unlink()
    assert repo.entry("m").fingerprint == one


def test_fingerprint_ignores_versions_that_are_not_served(root: Path, linear_model: bytes):
    old = add_model(root, "m", linear_model)
    new = add_model(root, "m", linear_model, version=2)
    repo = Repository(root)
    before = repo.entry("m").fingerprint
    set_mtime(old)
    assert repo.entry("m").fingerprint == before  # only version 2 is served
    set_mtime(new)
    assert repo.entry("m").fingerprint != before


def test_fingerprint_changes_when_an_error_is_fixed(root: Path, linear_model: bytes):
    add_model(root, "m", linear_model)
    config = write_config(root, "m", "pinned = yes\n")
    repo = Repository(root)
    broken = repo.entry("m")
    assert broken.error is not None
    config.write_text("pinned = true\n")
    set_mtime(config)
    fixed = repo.entry("m")
    assert fixed.error is None
    assert fixed.fingerprint != broken.fingerprint


# -- concurrency and scale ---------------------------------------------------------------------


def test_many_threads_may_scan_at_once(root: Path, linear_model: bytes):
    for i in range(50):
        add_model(root, f"m{i}", linear_model)
    repo = Repository(root)
    expected = repo.scan()
    start = threading.Barrier(8)
    results: list[dict[str, object]] = []
    failures: list[BaseException] = []

    def work() -> None:
        start.wait()
        try:
            results.append(dict(repo.scan()))
        except BaseException as exc:  # reported below, in the test thread
            failures.append(exc)

    threads = [threading.Thread(target=work) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    assert not failures
    assert results == [expected] * 8


# Writing the folders is most of the time: make test lists 2,000 models, make soak 10,000
# (docs/host.md's figures).
@pytest.mark.timeout(300)
@pytest.mark.parametrize("count", [2_000, pytest.param(10_000, marks=pytest.mark.soak)])
def test_thousands_of_models(root: Path, linear_model: bytes, count: int):
    for i in range(count):
        folder = root / f"model-{i:05d}" / "1"
        folder.mkdir(parents=True)
        (folder / "model.onnx").write_bytes(linear_model)
    repo = Repository(root)

    started = time.perf_counter()
    names = repo.names()
    listed = time.perf_counter() - started
    started = time.perf_counter()
    scanned = repo.scan()
    scanned_in = time.perf_counter() - started
    print(f"\n{count:,} models: names() {listed * 1000:.1f} ms, scan() {scanned_in * 1000:.1f} ms")

    assert len(names) == count
    assert names[0] == "model-00000"
    assert names[-1] == f"model-{count - 1:05d}"
    assert len(scanned) == count
    assert all(entry.error is None and entry.latest == 1 for entry in scanned.values())


def test_a_switched_root_symlink_is_read_against_its_new_target(
    tmp_path: Path, linear_model: bytes, caplog: pytest.LogCaptureFixture
):
    old, new = tmp_path / "release-1", tmp_path / "release-2"
    add_model(old, "m", linear_model)
    add_model(new, "m", linear_model, version=2)
    # In the new release, a link back into the old one: outside the root once it switched.
    (new / "back").symlink_to(old / "m", target_is_directory=True)
    link = tmp_path / "current"
    link.symlink_to(old)
    repo = Repository(link)
    assert list(repo.entry("m").versions) == [1]
    assert repo.names() == ["m"]
    staging = tmp_path / "current.new"
    staging.symlink_to(new)
    os.replace(staging, link)
    with caplog.at_level(logging.WARNING, logger="corral._models.repository"):
        assert repo.names() == ["back", "m"]
        entry = repo.entry("m")
    assert list(entry.versions) == [2]
    assert entry.versions[2].path == new / "m" / "2" / "model.onnx"
    assert repo.root == new
    assert_outside(repo.entry("back").error)
    assert [r.getMessage() for r in caplog.records] == [
        f"corral: model repository {link} now resolves to {new} (was {old})"
    ]
    link.unlink()
    with pytest.raises(RepositoryError, match=r"cannot list model repository .*current"):
        repo.names()


# -- what cannot be read ---------------------------------------------------------------------


@pytest.mark.parametrize("name", ["loop", "loop.onnx"])
def test_a_symlink_loop_is_skipped_in_the_listing_and_reported_when_asked_for(
    root: Path, linear_model: bytes, name: str, caplog: pytest.LogCaptureFixture
):
    add_model(root, "m", linear_model)
    (root / name).symlink_to(root / name)
    repo = Repository(root)
    with caplog.at_level(logging.DEBUG, logger="corral._models.repository"):
        assert repo.names() == ["m"]
    assert f"skipping {name!r} in the model repository: cannot stat it" in caplog.text
    entry = repo.entry("loop")
    assert isinstance(entry.error, ModelLoadError)
    assert "model 'loop': cannot stat it:" in str(entry.error)
    assert "Too many levels of symbolic links" in str(entry.error)


def test_a_loads_config_for_a_bare_model_file_is_refused(root: Path, linear_model: bytes):
    (root / "m.onnx").write_bytes(linear_model)
    with corral.Host(root) as host:
        with pytest.raises(ModelConfigError) as caught:
            host.load("m", config='{"max_batch_size": 4}')
        assert "is the file" in str(caught.value)
        assert "a load's config applies only to a model folder" in str(caught.value)
        assert host.repository.override("m") is None  # taken back with the failed load
        host.load("m")
        assert host.infer("m", {"X": X})["Y"].shape == (2, 1)


def test_uploaded_files_removed_behind_the_hosts_back_are_reported(root: Path, linear_model: bytes):
    with corral.Host(root) as host:
        host.load("fresh", config="{}", files={"1/model.onnx": linear_model})
        override = host.repository.override("fresh")
        assert override is not None
        assert override.folder is not None
        shutil.rmtree(override.folder)
        entry = host.repository.entry("fresh")
        assert isinstance(entry.error, ModelLoadError)
        assert f"its uploaded files in {override.folder} are gone" in str(entry.error)


def test_every_problem_of_a_model_is_named_together(root: Path, linear_model: bytes):
    add_model(root, "m", linear_model)
    (root / "m" / "2" / "model.onnx").mkdir(parents=True)
    (root / "m" / "3" / "model.onnx").mkdir(parents=True)
    error = Repository(root).entry("m").error
    assert isinstance(error, ModelLoadError)
    assert str(error).startswith("model 'm' has 2 problems: "), error
    assert "2/model.onnx is not a regular file" in str(error)
    assert "3/model.onnx is not a regular file" in str(error)


def test_a_dangling_version_link_is_no_version(root: Path, linear_model: bytes):
    # As a version folder without its model file: a version being replaced, not an error.
    add_model(root, "m", linear_model)
    (root / "m" / "2").symlink_to(root / "m" / "not-yet")
    entry = Repository(root).entry("m")
    assert entry.error is None
    assert list(entry.versions) == [1]


def test_a_repository_removed_under_it_is_an_error_not_a_missing_model(
    root: Path, linear_model: bytes
):
    add_model(root, "m", linear_model)
    repo = Repository(root)
    assert repo.entry("m").error is None
    shutil.rmtree(root)
    with pytest.raises(RepositoryError, match="is gone"):
        repo.entry("m")


@pytest.mark.parametrize("marker", ["version", "config.pbtxt", "model.toml"])
def test_one_models_folder_given_as_the_repository_is_refused_naming_its_parent(
    tmp_path: Path, marker: str
):
    # What a newcomer does: `corral serve models/magika` instead of `corral serve models`.
    add_model(tmp_path / "models", "magika", build_mlp())
    folder = tmp_path / "models" / "magika"
    if marker != "version":
        (folder / marker).write_text("")
    with pytest.raises(RepositoryError) as refused:
        corral.Host(folder)
    words = str(refused.value)
    assert "looks like one model's folder, not a repository of models" in words
    assert repr(str(tmp_path / "models")) in words  # the parent, to give instead
    if marker == "version":
        assert "the version folder 1/ with its model.onnx" in words
    else:
        assert f"it holds {marker};" in words


def test_a_repository_with_a_model_named_like_a_version_is_still_a_repository(tmp_path: Path):
    add_model(tmp_path, "1", build_mlp())  # <root>/1/1/model.onnx: a model named "1"
    with corral.Host(tmp_path) as host:
        out = host.infer("1", {"X": np.ones((1, 4), np.float32)})
    assert out["Y"].shape == (1, 1)


# -- each config.pbtxt text is parsed once --------------------------------------------------

_PBTXT = """name: "m"
platform: "onnxruntime_onnx"
max_batch_size: {rows}
"""


def _counting_parses(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    from corral._models.pbtxt import parse as _pbtxt

    texts: list[str] = []
    parse = _pbtxt.parse_pbtxt

    def counted(text: str, **kwargs: object) -> ModelConfig:
        texts.append(text)
        return parse(text, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(_pbtxt, "parse_pbtxt", counted)
    return texts


def test_a_config_pbtxt_read_again_unchanged_is_not_parsed_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    # A server reads each entry twice at start (the check, then the load): one parse.
    add_model(tmp_path, "m", build_mlp())
    config = tmp_path / "m" / "config.pbtxt"
    config.write_text(_PBTXT.format(rows=8))
    texts = _counting_parses(monkeypatch)
    repo = Repository(tmp_path)
    first, second = repo.entry("m"), repo.entry("m")
    assert first.error is None
    assert first.config.max_batch_size == 8
    assert second.config is first.config
    assert len(texts) == 1
    # Other bytes, of the same size and with the same modification time: parsed afresh, as
    # the text itself is the key (a size or a time would let a stale config through).
    stamp = config.stat()
    config.write_text(_PBTXT.format(rows=4))
    os.utime(config, ns=(stamp.st_atime_ns, stamp.st_mtime_ns))
    assert config.stat().st_size == stamp.st_size
    assert repo.entry("m").config.max_batch_size == 4
    assert len(texts) == 2


def test_a_config_pbtxt_that_names_other_files_or_fails_is_parsed_every_time(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    add_model(tmp_path, "m", build_mlp())
    (tmp_path / "m" / "labels.txt").write_text("cat\ndog\n")
    config = tmp_path / "m" / "config.pbtxt"
    config.write_text(
        'name: "m"\noutput [ { name: "Y", data_type: TYPE_FP32, dims: [ -1, 1 ], '
        'label_filename: "labels.txt" } ]\n'
    )
    texts = _counting_parses(monkeypatch)
    repo = Repository(tmp_path)
    assert repo.entry("m").config.outputs[0].labels == ("cat", "dog")
    # The same config text, other labels: what the text names is not in the key.
    (tmp_path / "m" / "labels.txt").write_text("cow\n")
    assert repo.entry("m").config.outputs[0].labels == ("cow",)
    assert len(texts) == 2
    config.write_text('name: "m"\nmax_batch_size: -1\n')
    for _ in range(2):
        error = repo.entry("m").error
        assert isinstance(error, ModelConfigError)
        assert "max_batch_size must be >= 0" in str(error)
    assert len(texts) == 4


def test_parsed_configs_keep_the_most_recent_within_their_size():
    from corral._models.pbtxt.parse import ParsedConfigs

    def labels(path: str, field: str) -> tuple[str, ...]:
        raise AssertionError("no label file is named")

    texts = [_PBTXT.format(rows=rows) for rows in (1, 2, 3)]
    parsed = ParsedConfigs(max_chars=2 * (len(texts[0]) + len("s") + len("m")))
    configs = [parsed.parse(t, source="s", model_name="m", read_labels=labels) for t in texts]
    assert len(parsed) == 2  # the first, least recently used, was dropped
    assert parsed.parse(texts[2], source="s", model_name="m", read_labels=labels) is configs[2]
    again = parsed.parse(texts[0], source="s", model_name="m", read_labels=labels)
    assert again is not configs[0]
    assert again == configs[0]
    assert len(parsed) == 2
