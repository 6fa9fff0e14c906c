"""edge/proto/ holds copies of corral's .proto files (the crate builds from them)."""

from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_proto_copies_are_current() -> None:
    for copy, original in [
        ("grpc_service.proto", "corral/protocol/proto/grpc_service.proto"),
        ("model_config.proto", "corral/_proto/model_config.proto"),
    ]:
        assert (ROOT / "edge" / "proto" / copy).read_text() == (ROOT / original).read_text(), copy
