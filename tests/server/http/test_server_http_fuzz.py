"""Fuzzing the HTTP endpoints: whatever the body, path or header, a 4xx JSON error, not 500."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import httpx
from hypothesis import given, settings

from corral import Host
from corral.protocol import DataPlane
from corral.server.http.app import HttpApp
from corral.testing import build_mlp
from tests.helpers import add_model
from tests.strategies import header_lengths, http_bodies, http_paths

FUZZ = settings(max_examples=300, deadline=None, database=None)


def test_malformed_requests_get_a_4xx_json_error_never_a_500(tmp_path: Path):
    add_model(tmp_path, "mlp", build_mlp(seed=1))
    with Host(tmp_path) as host:
        app = HttpApp(DataPlane(host), max_request_bytes=4096)
        loop = asyncio.new_event_loop()
        client = httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://c")
        statuses: set[int] = set()
        try:

            @FUZZ
            @given(path=http_paths, body=http_bodies, header=header_lengths)
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
