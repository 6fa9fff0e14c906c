"""Fuzzing the HTTP endpoints: whatever the body, path or header, a 4xx JSON error, not 500."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import httpx
import orjson
from hypothesis import given, settings
from hypothesis import strategies as st

from corral import Host
from corral.bench.models import build_mlp
from corral.protocol import DataPlane
from corral.server.http import HttpApp
from tests.test_host import add_model

FUZZ = settings(max_examples=300, deadline=None, database=None)

JSON = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-(2**63), 2**63 - 1)
    | st.floats()
    | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner),
    max_leaves=12,
)
# Bodies that look like inference requests, wrong in some detail or other.
TENSOR = st.fixed_dictionaries(
    {
        "name": st.sampled_from(["X", "Y", ""]) | st.integers(-5, 5),
        "datatype": st.sampled_from(["FP32", "INT64", "BYTES", "BOOL", "FP17"]) | st.none(),
        "shape": st.lists(st.integers(-2, 5), max_size=3) | JSON,
    },
    optional={"data": JSON, "parameters": st.dictionaries(st.just("binary_data_size"), JSON)},
)
REQUEST = st.fixed_dictionaries(
    {"inputs": st.lists(TENSOR, max_size=3) | JSON},
    optional={"outputs": JSON, "parameters": JSON, "id": JSON},
)
BODIES = st.binary(max_size=300) | JSON.map(orjson.dumps) | REQUEST.map(orjson.dumps)
PATHS = st.sampled_from(
    [
        "/v2/models/mlp/infer",
        "/v2/models/mlp/versions/1/infer",
        "/v2/models/nope/infer",
        "/v2/repository/index",
        "/v2/repository/models/nope/load",
    ]
) | st.text(alphabet="abcv2/.%_-", max_size=30).map(lambda tail: f"/v2/{tail}")
HEADER = st.none() | st.integers(-3, 400).map(str) | st.text(max_size=4)


def test_malformed_requests_get_a_4xx_json_error_never_a_500(tmp_path: Path):
    add_model(tmp_path, "mlp", build_mlp(seed=1))
    with Host(tmp_path) as host:
        app = HttpApp(DataPlane(host), max_request_bytes=4096)
        loop = asyncio.new_event_loop()
        client = httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://c")
        statuses: set[int] = set()
        try:

            @FUZZ
            @given(path=PATHS, body=BODIES, header=HEADER)
            def check(path: str, body: bytes, header: str | None) -> None:
                headers: dict[str, Any] = {}
                if header is not None and header.isascii() and header.isprintable():
                    headers["Inference-Header-Content-Length"] = header
                response = loop.run_until_complete(client.post(path, content=body, headers=headers))
                statuses.add(response.status_code)
                assert response.status_code < 500, response.text
                if response.status_code >= 400:
                    assert response.json()["error"]

            check()
        finally:
            loop.run_until_complete(client.aclose())
            loop.close()
        assert statuses & {400, 404}  # the fuzzing reached the refusals it is about
