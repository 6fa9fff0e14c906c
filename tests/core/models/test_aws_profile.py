"""The AWS shared files (~/.aws/credentials, ~/.aws/config): a profile's keys reach the store.

The rules are checked on files in ``tmp_path``; the whole chain against moto's server checking
signatures (``INITIAL_NO_AUTH_ACTION_COUNT``: the first three requests, which make the IAM user
and its key, go unsigned; every later one must carry a key moto issued).
"""

from __future__ import annotations

import json
import logging

import pytest

from corral import RepositoryError
from corral._models.aws_profile import profile_settings
from corral._models.repository import Repository
from corral.testing import build_linear
from tests import s3server

VARIABLES = (
    "AWS_ACCESS_KEY_ID",
    "AWS_SECRET_ACCESS_KEY",
    "AWS_SESSION_TOKEN",
    "AWS_REGION",
    "AWS_DEFAULT_REGION",
    "AWS_PROFILE",
    "AWS_ROLE_ARN",
    "AWS_WEB_IDENTITY_TOKEN_FILE",
)


@pytest.fixture
def files(tmp_path, monkeypatch):
    """The shared files' paths, empty, and no AWS_* key, region or profile in the environment."""
    for variable in VARIABLES:
        monkeypatch.delenv(variable, raising=False)
    credentials, config = tmp_path / "credentials", tmp_path / "config"
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(credentials))
    monkeypatch.setenv("AWS_CONFIG_FILE", str(config))
    return credentials, config


def test_the_default_profile_gives_its_keys_and_the_config_its_region(files):
    credentials, config = files
    credentials.write_text(
        "[default]\naws_access_key_id = AKIADEFAULT\naws_secret_access_key = s1\n"
    )
    config.write_text("[default]\nregion = eu-west-3\n")
    settings = profile_settings()
    assert settings.config() == {
        "access_key_id": "AKIADEFAULT",
        "secret_access_key": "s1",
        "region": "eu-west-3",
    }
    assert settings.source == str(credentials)


def test_aws_profile_picks_the_section_and_the_config_files_profile_form(files, monkeypatch):
    credentials, config = files
    credentials.write_text("[default]\naws_access_key_id = A0\naws_secret_access_key = s0\n")
    config.write_text(
        "[profile ci]\naws_access_key_id = A1\naws_secret_access_key = s1\n"
        "aws_session_token = t1\nregion = ap-south-1\n"
    )
    monkeypatch.setenv("AWS_PROFILE", "ci")
    assert profile_settings().config() == {
        "access_key_id": "A1",
        "secret_access_key": "s1",
        "session_token": "t1",
        "region": "ap-south-1",
    }


def test_the_environment_comes_before_the_files(files, monkeypatch):
    credentials, config = files
    credentials.write_text("[default]\naws_access_key_id = A0\naws_secret_access_key = s0\n")
    config.write_text("[default]\nregion = eu-west-3\n")
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "AKIAENV")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "from-env")
    monkeypatch.setenv("AWS_REGION", "us-east-2")
    assert profile_settings().config() == {}  # obstore reads the environment itself
    monkeypatch.delenv("AWS_ACCESS_KEY_ID")
    monkeypatch.delenv("AWS_SECRET_ACCESS_KEY")
    monkeypatch.setenv("AWS_ROLE_ARN", "arn:aws:iam::1:role/r")
    monkeypatch.setenv("AWS_WEB_IDENTITY_TOKEN_FILE", "/var/run/token")
    assert profile_settings().config() == {}  # a web identity comes before the files too


def test_no_files_and_no_profile_add_nothing(files):
    assert profile_settings().config() == {}


def test_a_profile_named_and_nowhere_is_refused_naming_it_and_both_files(files, monkeypatch):
    credentials, config = files
    credentials.write_text("[default]\naws_access_key_id = A0\naws_secret_access_key = s0\n")
    monkeypatch.setenv("AWS_PROFILE", "prod")
    with pytest.raises(RepositoryError, match="'prod'") as caught:
        profile_settings()
    assert str(credentials) in str(caught.value)
    assert str(config) in str(caught.value)


def test_a_key_without_its_secret_is_refused_without_showing_the_key(files):
    credentials, _ = files
    credentials.write_text("[default]\naws_access_key_id = AKIAHALF\n")
    with pytest.raises(RepositoryError, match="no aws_secret_access_key") as caught:
        profile_settings()
    assert "AKIAHALF" not in str(caught.value)


def test_a_file_that_is_no_ini_is_refused_without_quoting_it(files):
    credentials, _ = files
    credentials.write_text("aws_secret_access_key = before-any-section\n")
    with pytest.raises(RepositoryError, match="cannot be read as an INI file") as caught:
        profile_settings()
    assert "before-any-section" not in str(caught.value)


def test_a_profile_that_assumes_a_role_is_named_in_a_warning(files, monkeypatch, caplog):
    _, config = files
    config.write_text("[profile deploy]\nrole_arn = arn:aws:iam::1:role/r\nsource_profile = x\n")
    monkeypatch.setenv("AWS_PROFILE", "deploy")
    with caplog.at_level(logging.WARNING, logger="corral"):
        assert profile_settings().config() == {}
    assert "'deploy'" in caplog.text
    assert "role_arn" in caplog.text


@pytest.fixture
def signing_s3(tmp_path):
    """moto checking signatures, a bucket ``models`` with one model, and the key it issued."""
    pytest.importorskip("obstore")
    boto3 = pytest.importorskip("boto3")
    server = s3server.start(
        tmp_path / "moto.log", environment={"INITIAL_NO_AUTH_ACTION_COUNT": "3"}
    )
    try:
        unsigned = {
            "endpoint_url": server.endpoint,
            "aws_access_key_id": s3server.KEY_ID,
            "aws_secret_access_key": s3server.SECRET,
            "region_name": "us-east-1",
        }
        iam = boto3.client("iam", **unsigned)
        iam.create_user(UserName="ci")
        everything = {"Effect": "Allow", "Action": "*", "Resource": "*"}
        iam.put_user_policy(
            UserName="ci",
            PolicyName="all",
            PolicyDocument=json.dumps({"Version": "2012-10-17", "Statement": [everything]}),
        )
        key = iam.create_access_key(UserName="ci")["AccessKey"]
        signed = unsigned | {
            "aws_access_key_id": key["AccessKeyId"],
            "aws_secret_access_key": key["SecretAccessKey"],
        }
        client = boto3.client("s3", **signed)
        client.create_bucket(Bucket="models")
        client.put_object(Bucket="models", Key="repo/m/1/model.onnx", Body=build_linear())
        yield server, key["AccessKeyId"], key["SecretAccessKey"]
    finally:
        s3server.stop(server)


def test_a_profile_in_the_shared_files_reads_a_store_that_checks_signatures(
    signing_s3, files, monkeypatch, tmp_path
):
    server, key_id, secret = signing_s3
    credentials, config = files
    monkeypatch.setenv("AWS_ENDPOINT_URL", server.endpoint)
    monkeypatch.setenv("AWS_PROFILE", "ci")
    credentials.write_text(
        f"[default]\naws_access_key_id = AKIANOTISSUED\naws_secret_access_key = {'x' * 40}\n"
        f"[ci]\naws_access_key_id = {key_id}\naws_secret_access_key = {secret}\n"
    )
    config.write_text("[profile ci]\nregion = us-east-1\n")
    repository = Repository("s3://models/repo", cache_dir=tmp_path / "cache", fetch_timeout_s=10)
    try:
        assert repository.names() == ["m"]
        assert 1 in repository.entry("m").versions  # a signed GET of the model's file too
    finally:
        assert repository.store is not None
        repository.store.close()
    # The default profile's key, which moto never issued, is refused, naming the URL alone.
    monkeypatch.delenv("AWS_PROFILE")
    with pytest.raises(RepositoryError, match="InvalidAccessKeyId") as caught:
        Repository("s3://models/repo", cache_dir=tmp_path / "cache2", fetch_timeout_s=10)
    assert "s3://models/repo" in str(caught.value)
    assert "x" * 40 not in str(caught.value)
