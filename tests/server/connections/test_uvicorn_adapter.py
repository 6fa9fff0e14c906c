"""uvicorn behind one adapter: every internal corral uses is there on the installed uvicorn.

``corral.server.connections.edge`` lists each name of uvicorn's it touches (UVICORN_INTERNALS).
These tests check each against the uvicorn installed, so that a uvicorn release that renames or
drops one fails here, naming it, instead of at a client's request. They also hold that no
other module of corral imports uvicorn, and that pyproject.toml bounds it above.
"""

from __future__ import annotations

import ast
import asyncio
import importlib.metadata
import tomllib

import pytest
import uvicorn
from packaging.requirements import Requirement
from packaging.version import Version
from uvicorn.config import Config
from uvicorn.protocols.http import flow_control, httptools_impl
from uvicorn.server import ServerState

from corral.server.connections import direct, edge
from corral.server.connections.contract import ConnectionLimits
from corral.server.connections.edge import protocol_for
from corral.server.connections.internals import (
    UVICORN_INTERNALS,
    Internals,
    UvicornChanged,
    check_uvicorn,
)
from corral.server.connections.server import EdgeServer
from tests.helpers import ROOT, FakeTransport

# The owners as UVICORN_INTERNALS names them.
PROTOCOL = "uvicorn.protocols.http.httptools_impl.HttpToolsProtocol"
CYCLE = "uvicorn.protocols.http.httptools_impl.RequestResponseCycle"
FLOW = "uvicorn.protocols.http.flow_control.FlowControl"
SERVER = "uvicorn.server.Server"
LIMITS = ConnectionLimits(8192, 65536, 5.0, 30.0, 100, 30.0)


async def _app(scope: object, receive: object, send: object) -> None:
    raise AssertionError("no request reaches the app in these tests")


def _names(owner: str, kind: str) -> list[str]:
    return [
        name
        for internals in UVICORN_INTERNALS
        if internals.owner == owner and internals.kind == kind
        for name in internals.names
    ]


def test_check_uvicorn_passes_on_the_installed_uvicorn():
    check_uvicorn()


def test_every_instance_attribute_corral_uses_is_set_by_uvicorn():
    """The names uvicorn sets on its objects, seen on a connection in the middle of a request."""

    async def scenario() -> dict[str, object]:
        loop = asyncio.get_running_loop()
        config = Config(_app, lifespan="off", ws="none", log_config=None, access_log=False)
        config.load()
        server = uvicorn.Server(config)
        protocol = protocol_for(LIMITS)(config, ServerState(), {}, loop)
        protocol.connection_made(FakeTransport())  # type: ignore[arg-type]
        # A head whose body has not come yet: the request's cycle exists, its task waits.
        protocol.data_received(
            b"POST /v2/models/m/ready HTTP/1.1\r\nhost: x\r\ncontent-length: 5\r\n\r\n"
        )
        objects = {
            PROTOCOL: protocol,
            CYCLE: protocol.cycle,
            FLOW: protocol.flow,
            "uvicorn.server.ServerState": protocol.server_state,
            SERVER: server,
            "uvicorn.config.Config": config,
        }
        protocol.connection_lost(None)
        for task in list(protocol.tasks):
            task.cancel()
        return objects

    objects = asyncio.run(asyncio.wait_for(scenario(), 10))
    # Server.servers is set once it starts listening: its attribute is held by the tests
    # that start a server (tests/server/test_server_app.py); here, every other one.
    started_only = {(SERVER, "servers")}
    missing = [
        f"{owner}.{name}: {internals.use}"
        for internals in UVICORN_INTERNALS
        if internals.kind == "attribute"
        for owner in [internals.owner]
        for name in internals.names
        if (owner, name) not in started_only and not hasattr(objects[owner], name)
    ]
    assert not missing, f"uvicorn {uvicorn.__version__} no longer sets: {missing}"


def test_the_listed_classes_are_the_ones_corral_subclasses_and_builds():
    assert issubclass(edge.EdgeProtocol, httptools_impl.HttpToolsProtocol)
    assert direct.RequestResponseCycle is httptools_impl.RequestResponseCycle
    assert "write_paused" in _names(FLOW, "attribute")
    assert flow_control.FlowControl.__name__ == FLOW.rpartition(".")[2]


def test_every_callback_edge_protocol_overrides_is_listed():
    """An override of a method uvicorn no longer calls would silently stop doing its work."""
    listed = set(_names(PROTOCOL, "method"))
    overridden = {
        name
        for name, value in vars(edge.EdgeProtocol).items()
        if callable(value) and hasattr(httptools_impl.HttpToolsProtocol, name)
    }
    assert overridden <= listed, sorted(overridden - listed)


@pytest.mark.parametrize(
    ("owner", "name"),
    [
        (httptools_impl.HttpToolsProtocol, "on_headers_complete"),
        (httptools_impl.HttpToolsProtocol, "_get_upgrade"),
        (uvicorn.Server, "capture_signals"),
    ],
)
def test_a_method_gone_is_refused_at_start_by_name(
    monkeypatch: pytest.MonkeyPatch, owner: type, name: str
):
    monkeypatch.delattr(owner, name)
    with pytest.raises(UvicornChanged, match=rf"\.{name} \(") as refused:
        check_uvicorn()
    assert uvicorn.__version__ in str(refused.value)


def test_a_constructor_parameter_gone_is_refused_at_start_by_name(monkeypatch: pytest.MonkeyPatch):
    def renamed(self: object, scope: object, transport: object) -> None:
        pass

    monkeypatch.setattr(httptools_impl.RequestResponseCycle, "__init__", renamed)
    with pytest.raises(UvicornChanged, match=r"RequestResponseCycle\(flow=\.\.\.\)"):
        check_uvicorn()


def test_an_edge_server_is_not_built_on_a_changed_uvicorn(monkeypatch: pytest.MonkeyPatch):
    monkeypatch.delattr(httptools_impl, "STATUS_LINE")
    with pytest.raises(UvicornChanged, match="STATUS_LINE"):
        EdgeServer(_app, "127.0.0.1", 0, protocol_for(LIMITS), drain_margin_s=1)


def test_the_owners_named_are_the_internals_owners():
    assert {PROTOCOL, CYCLE, FLOW, SERVER} <= {i.owner for i in UVICORN_INTERNALS}


def test_the_internals_are_well_formed():
    kinds = {"method", "attribute", "parameter", "constant"}
    for internals in UVICORN_INTERNALS:
        assert isinstance(internals, Internals)
        assert internals.kind in kinds, internals
        assert internals.owner.startswith("uvicorn."), internals
        assert internals.names, internals
        assert internals.use, internals


def test_no_module_outside_the_connections_folder_imports_uvicorn():
    importing = []
    for path in sorted((ROOT / "corral").rglob("*.py")):
        tree = ast.parse(path.read_text(), str(path))
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                modules = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                modules = [node.module or ""]
            else:
                continue
            if any(module == "uvicorn" or module.startswith("uvicorn.") for module in modules):
                importing.append(str(path.relative_to(ROOT)))
    assert "corral/server/connections/edge.py" in importing
    outside = [path for path in importing if not path.startswith("corral/server/connections/")]
    assert outside == []


def test_pyproject_bounds_uvicorn_above_and_the_installed_one_is_within():
    pyproject = tomllib.loads((ROOT / "pyproject.toml").read_text())
    server = pyproject["project"]["optional-dependencies"]["server"]
    [requirement] = [Requirement(r) for r in server if Requirement(r).name == "uvicorn"]
    uppers = [spec for spec in requirement.specifier if spec.operator == "<"]
    assert uppers, f"uvicorn is not bounded above: {requirement}"
    installed = Version(importlib.metadata.version("uvicorn"))
    assert requirement.specifier.contains(installed), (installed, str(requirement))
