"""The corral functions the edge's tests compare against, from either layout of the package.

corral's modules moved into folders (``corral/protocol/json/codec.py`` ...); the old flat
names (``corral/protocol/http_codec.py`` ...) are tried second, so that these tests run
against whichever corral the venv holds.
"""

from __future__ import annotations

import importlib
from typing import Any


def _first(*candidates: tuple[str, str]) -> Any:
    errors = []
    for module, name in candidates:
        try:
            return getattr(importlib.import_module(module), name)
        except (ImportError, AttributeError) as exc:
            errors.append(f"{module}.{name}: {exc}")
    raise ImportError("; ".join(errors))


InvalidInput = _first(("corral", "InvalidInput"), ("corral._errors", "InvalidInput"))
decode_request = _first(
    ("corral.protocol.json.codec", "decode_request"), ("corral.protocol.http_codec", "decode_request")
)
encode_response = _first(
    ("corral.protocol.json.codec", "encode_response"),
    ("corral.protocol.http_codec", "encode_response"),
)
serialize_response = _first(("corral.protocol.grpc_codec", "serialize_response"),)
grpc_decode_request = _first(("corral.protocol.grpc_codec", "decode_request"),)
SitePolicy = _first(
    ("corral.server.http.origins", "SitePolicy"), ("corral.server.origins", "SitePolicy")
)
host_name = _first(("corral.server.http.origins", "host_name"), ("corral.server.origins", "host_name"))
types = importlib.import_module("corral.protocol.types")
pb = importlib.import_module("corral.protocol.proto.grpc_service_pb2")
