"""The object-store cache's guarantees when things go wrong: a fetch cut short, a crash, a
restart, a store that hangs, a console's folder markers. Against moto's S3 server, as
tests/test_store.py.
"""

from __future__ import annotations

import pytest

from corral import RepositoryError
from corral._store import Store
from corral.testing import build_linear
from tests.test_store import bucket, put_model, s3

pytest.importorskip("obstore")
pytest.importorskip("moto")

__all__ = ["bucket", "s3"]  # the fixtures, shared with tests/test_store.py

OTHER = build_linear(seed=3)


def test_a_query_in_the_url_is_refused_without_being_shown(bucket):
    token = "sv=2024&sig=s3cr3tSignature"
    with pytest.raises(RepositoryError, match="a query or fragment") as caught:
        Store(f"az://container/models?{token}")
    assert "s3cr3tSignature" not in str(caught.value)


def test_a_models_latest_bytes_count_only_the_versions_the_repository_serves(s3, bucket, tmp_path):
    name, client = bucket
    put_model(client, name, "m", 2, b"x" * 10)
    # Digits to str.isdigit, not version folders to the repository.
    client.put_object(Bucket=name, Key="repo/m/\u0669/model.onnx", Body=b"x" * 99)
    client.put_object(Bucket=name, Key="repo/m/\u00b2/model.onnx", Body=b"x" * 99)
    assert Store(f"s3://{name}/repo", tmp_path).latest_bytes("m") == 10
