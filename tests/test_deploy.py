"""deploy/: the Dockerfile, Kubernetes, KServe and systemd files agree with the server.

Each command line is parsed by ``corral serve``'s own parser and checked by ServerSettings,
as ``corral serve`` would at start (no server started); the ports the files name are the ones
those settings bind; the probe paths are answered by an in-process HttpApp; every memory limit
holds docs/deploy.md's sizing rule for the budget it gives. ``docker build`` runs where a
Docker daemon answers, and is skipped with the reason where none does.
"""

from __future__ import annotations

import asyncio
import json
import re
import shlex
import shutil
import subprocess
import tomllib
from pathlib import Path
from typing import Any

import httpx
import pytest

from corral import Host, HostOptions
from corral._base import parse_bytes
from corral.cli.commands import command_parser
from corral.cli.serve import _triton_spellings
from corral.protocol import DataPlane
from corral.server.http.app import HttpApp
from corral.server.observe.metrics import Metrics
from corral.server.settings import ServerSettings

yaml = pytest.importorskip("yaml", reason="the dev extra installs pyyaml")

ROOT = Path(__file__).resolve().parent.parent
DEPLOY = ROOT / "deploy"
MIB = 1024 * 1024

# docs/deploy.md's rule: limit >= HEADROOM x (BASE + ESTIMATE_BOUND x budget + 2 x body budget).
BASE_BYTES = 160 * MIB
ESTIMATE_BOUND = 1.6
HEADROOM = 1.1


def serve_settings(argv: list[str]) -> ServerSettings:
    """What ``corral argv`` would serve with: parsed and checked as ``corral serve`` does."""
    assert argv[0] == "serve", argv
    args = command_parser("serve").parse_args(argv)  # exits (status 2) on an unknown flag
    given = {name: getattr(args, name, None) for name in ServerSettings.model_fields}
    assert _triton_spellings(args, given) is None
    return ServerSettings(**{k: v for k, v in given.items() if v is not None})


def memory_needed(settings: ServerSettings) -> float:
    assert settings.memory_budget is not None, "a memory limit needs a --memory-budget under it"
    budget = parse_bytes(settings.memory_budget)
    bodies = 2 * settings.body_budget_bytes()
    return HEADROOM * (BASE_BYTES + ESTIMATE_BOUND * budget + bodies)


def documents(path: Path) -> list[dict[str, Any]]:
    return [doc for doc in yaml.safe_load_all(path.read_text()) if doc is not None]


def of_kind(kind: str) -> dict[str, Any]:
    found = [
        doc for path in DEPLOY.rglob("*.yaml") for doc in documents(path) if doc["kind"] == kind
    ]
    assert len(found) == 1, (kind, found)
    return found[0]


def probe_statuses(paths: set[str], repo: Path) -> dict[str, int]:
    """The status an in-process HttpApp answers each GET ``path`` with."""

    async def go() -> dict[str, int]:
        with Host(repo) as host:
            plane = DataPlane(host)
            app = HttpApp(plane, metrics=Metrics(plane).render)  # as corral serve builds it
            transport = httpx.ASGITransport(app=app)
            async with httpx.AsyncClient(transport=transport, base_url="http://corral") as client:
                return {path: (await client.get(path)).status_code for path in sorted(paths)}

    return asyncio.run(go())


# -- every file parses ------------------------------------------------------------------------


def test_every_yaml_and_json_file_under_deploy_parses() -> None:
    files = sorted(DEPLOY.rglob("*.yaml")) + sorted(DEPLOY.rglob("*.json"))
    kinds = [doc["kind"] for path in files if path.suffix == ".yaml" for doc in documents(path)]
    for path in files:
        if path.suffix == ".json":
            json.loads(path.read_text())

    assert sorted(kinds) == [
        "Deployment",
        "InferenceService",
        "ScaledObject",
        "Service",
        "ServingRuntime",
    ]


# -- Dockerfile -----------------------------------------------------------------------------


def dockerfile_instructions() -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) of the final stage, continuation lines joined."""
    instructions = dockerfile_instructions_all()
    stages = [i for i, (word, _) in enumerate(instructions) if word == "FROM"]
    return [(word, rest) for word, rest in instructions[stages[-1] :]]


def test_the_dockerfile_command_is_accepted_by_corral_serve_and_binds_every_address() -> None:
    instructions = dict(dockerfile_instructions())
    command = json.loads(instructions["ENTRYPOINT"]) + json.loads(instructions["CMD"])

    assert command[0] == "corral"
    settings = serve_settings(command[1:])
    assert settings.host == "0.0.0.0"
    assert str(settings.repository) == "/models"
    # The ports exposed are the ones it binds, and a drain notice lets probes see it go.
    exposed = {int(port) for port in instructions["EXPOSE"].split()}
    assert exposed == {settings.http_port, settings.grpc_port}
    assert settings.drain_notice_s > 0
    assert instructions["STOPSIGNAL"] == "SIGTERM"


def test_the_image_runs_as_a_user_and_installs_the_serving_extras_only() -> None:
    instructions = dockerfile_instructions()
    users = [rest for word, rest in instructions if word == "USER"]
    installs = [rest for word, rest in instructions if word == "RUN" and "pip install" in rest]

    assert users
    assert users[-1] not in ("root", "0")
    assert int(users[-1]) >= 1000
    assert len(installs) == 1
    # Serving, and what a repository may need to be served: object storage, custom operators.
    assert re.findall(r"\[([a-z0-9,]+)\]", installs[0]) == ["server,grpc,s3,extensions"]
    assert re.match(r"python:3\.11\.\d+-slim-bookworm\b", dict(instructions)["FROM"])


def test_every_base_image_is_pinned_to_an_exact_tag_or_a_digest() -> None:
    # python:3.11-slim and rust:1-slim-bookworm moved under every rebuild.
    bases = [rest.split()[0] for word, rest in dockerfile_instructions_all() if word == "FROM"]
    assert len(bases) == 3
    for base in bases:
        assert re.fullmatch(r"[a-z0-9/]+:\d+\.\d+\.\d+-[a-z-]+(@sha256:[0-9a-f]{64})?", base), base
    # The stages that build for and install into one Python agree on it.
    assert bases[0] == bases[2]


def test_the_dockerfile_healthcheck_asks_the_ready_route_on_the_http_port(repo: Path) -> None:
    instructions = dict(dockerfile_instructions())
    command = json.loads(instructions["ENTRYPOINT"]) + json.loads(instructions["CMD"])
    settings = serve_settings(command[1:])
    (url,) = re.findall(r"http://[^'\"]+", instructions["HEALTHCHECK"])

    assert url == f"http://127.0.0.1:{settings.http_port}/v2/health/ready"
    assert probe_statuses({"/v2/health/ready"}, repo) == {"/v2/health/ready": 200}


def test_the_docker_image_builds() -> None:
    if shutil.which("docker") is None:
        pytest.skip("no docker command on this machine")
    info = subprocess.run(["docker", "info"], capture_output=True, text=True, timeout=30)
    if info.returncode != 0:
        reason = (info.stderr.strip().splitlines() or ["docker info failed"])[-1]
        pytest.skip(f"no Docker daemon answers: {reason}")
    built = subprocess.run(
        ["docker", "build", "-f", "deploy/Dockerfile", "-t", "corral:test", "."],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert built.returncode == 0, built.stderr[-4000:]


# -- Kubernetes -----------------------------------------------------------------------------


def test_the_deployment_serves_the_ports_and_probes_the_routes_of_the_server(
    repo: Path,
) -> None:
    pod = of_kind("Deployment")["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    settings = serve_settings(container["args"])
    ports = {port["name"]: port["containerPort"] for port in container["ports"]}
    probes = {container["readinessProbe"]["httpGet"]["path"]: "ready"}
    probes[container["livenessProbe"]["httpGet"]["path"]] = "live"

    assert settings.host == "0.0.0.0"
    assert ports == {"http": settings.http_port, "grpc": settings.grpc_port}
    assert container["readinessProbe"]["httpGet"]["port"] == "http"
    assert container["livenessProbe"]["httpGet"]["port"] == "http"
    assert probes == {"/v2/health/ready": "ready", "/v2/health/live": "live"}
    # The probed routes exist: a route that does not is 404, so this could fail.
    answered = probe_statuses({*probes, "/v2/health/nothing"}, repo)
    assert answered == {"/v2/health/ready": 200, "/v2/health/live": 200, "/v2/health/nothing": 404}


def test_the_service_targets_the_container_ports_by_name() -> None:
    service = of_kind("Service")
    (container,) = of_kind("Deployment")["spec"]["template"]["spec"]["containers"]
    labels = of_kind("Deployment")["spec"]["template"]["metadata"]["labels"]

    assert service["spec"]["selector"] == labels
    named = {port["name"] for port in container["ports"]}
    assert {port["targetPort"] for port in service["spec"]["ports"]} == named


def pods() -> list[dict[str, Any]]:
    """The pod specs the manifests run corral in: the Deployment's and the ServingRuntime's."""
    return [of_kind("Deployment")["spec"]["template"]["spec"], of_kind("ServingRuntime")["spec"]]


def test_the_manifests_run_the_image_the_docs_build() -> None:
    docs = (ROOT / "docs" / "deploy.md").read_text()
    (built,) = re.findall(r"docker build -f deploy/Dockerfile -t (\S+) \.", docs)
    version = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]

    # corral's version, not :latest, which Kubernetes pulls on every start (and fails to, for
    # an image built locally).
    assert built == f"corral:{version}"
    images = [container["image"] for pod in pods() for container in pod["containers"]]
    assert images == [built, built]
    assert f"--stop-timeout 30 {built} serve /models" in docs  # docker run: the same image
    # The Dockerfile's own recipe builds and runs that tag too (it built "corral").
    dockerfile = (DEPLOY / "Dockerfile").read_text()
    assert re.findall(r"docker build -f deploy/Dockerfile -t (\S+) \.", dockerfile) == [built]
    (run,) = [line for line in dockerfile.splitlines() if "docker run" in line]
    assert run.split()[-1] == built


def test_a_read_only_root_leaves_the_upload_folder_writable() -> None:
    # Files uploaded by loads are written to tempfile's folder: /tmp, unless TMPDIR says.
    checked = 0
    for pod in pods():
        volumes = {volume["name"]: volume for volume in pod.get("volumes", [])}
        for container in pod["containers"]:
            if not container.get("securityContext", {}).get("readOnlyRootFilesystem"):
                continue
            checked += 1
            env = {item["name"]: item.get("value") for item in container.get("env", [])}
            folder = env.get("TMPDIR") or "/tmp"
            (mount,) = [m for m in container["volumeMounts"] if m["mountPath"] == folder]
            assert not mount.get("readOnly", False), mount
            volume = volumes[mount["name"]]
            assert "emptyDir" in volume, volume
            # Larger than what corral lets uploads hold, so that corral refuses first.
            size = parse_bytes(volume["emptyDir"]["sizeLimit"])
            assert size > parse_bytes(HostOptions().max_upload_bytes or 0)
    assert checked == 1  # the Deployment's


def test_probes_allow_a_slow_answer_and_a_miss_before_taking_a_replica_out() -> None:
    # failureThreshold 1 with Kubernetes' 1 s default timeout: one answer slower than 1 s
    # under load took the pod out, and every replica under the same load at once.
    for pod in pods():
        (container,) = pod["containers"]
        settings = serve_settings(container["args"])
        for kind in ("readinessProbe", "livenessProbe"):
            probe = container[kind]
            assert probe.get("timeoutSeconds", 1) >= 2, (container["name"], kind)
            assert probe.get("failureThreshold", 3) >= 3, (container["name"], kind)
        # A draining pod still leaves the endpoints within the notice.
        ready = container["readinessProbe"]
        seen = ready["periodSeconds"] * ready["failureThreshold"] + ready["timeoutSeconds"]
        assert seen < settings.drain_notice_s, container["name"]


def test_the_grace_period_covers_the_drain_notice_and_the_drain_timeout() -> None:
    pod = of_kind("Deployment")["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    settings = serve_settings(container["args"])

    assert settings.drain_notice_s > 0  # the endpoints drop the pod before connections close
    assert (
        pod["terminationGracePeriodSeconds"] >= settings.drain_notice_s + settings.drain_timeout_s
    )
    # The readiness probe sees the notice within it.
    probe = container["readinessProbe"]
    assert (
        probe["periodSeconds"] * probe["failureThreshold"] + probe["timeoutSeconds"]
        < settings.drain_notice_s
    )


def test_each_memory_limit_holds_the_sizing_rule_for_its_budget() -> None:
    runtimes = [
        of_kind("Deployment")["spec"]["template"]["spec"]["containers"][0],
        of_kind("ServingRuntime")["spec"]["containers"][0],
    ]
    for container in runtimes:
        limit = parse_bytes(container["resources"]["limits"]["memory"])
        assert limit >= memory_needed(serve_settings(container["args"])), container["name"]
    unit = systemd_unit()
    settings = serve_settings(shlex.split(unit["ExecStart"])[1:])
    # systemd's M is MiB.
    assert parse_bytes(unit["MemoryMax"].replace("M", "MiB")) >= memory_needed(settings)


# -- KServe ---------------------------------------------------------------------------------


def test_the_serving_runtime_listens_where_kserve_expects_it(repo: Path) -> None:
    runtime = of_kind("ServingRuntime")
    (container,) = runtime["spec"]["containers"]
    settings = serve_settings(container["args"])
    probes = {container[probe]["httpGet"]["path"] for probe in ("readinessProbe", "livenessProbe")}

    # KServe's ports: HTTP 8080, gRPC 8081; its storage initializer fills /mnt/models.
    assert (settings.http_port, settings.grpc_port) == (8080, 8081)
    assert str(settings.repository) == "/mnt/models"
    assert settings.host == "0.0.0.0"
    assert [port["containerPort"] for port in container["ports"]] == [settings.http_port]
    assert {"v2", "grpc-v2"} <= set(runtime["spec"]["protocolVersions"])
    # Prometheus scrapes /metrics where it is served: on the HTTP port unless given one.
    annotations = runtime["spec"]["annotations"]
    metrics_port = getattr(settings, "metrics_port", None) or settings.http_port
    assert int(annotations["prometheus.kserve.io/port"]) == metrics_port
    assert annotations["prometheus.kserve.io/path"] == "/metrics"
    probes.add(annotations["prometheus.kserve.io/path"])
    assert probe_statuses(probes, repo) == dict.fromkeys(probes, 200)


def test_the_inference_service_names_the_runtime_and_one_of_its_formats() -> None:
    runtime = of_kind("ServingRuntime")
    model = of_kind("InferenceService")["spec"]["predictor"]["model"]

    assert model["runtime"] == runtime["metadata"]["name"]
    assert model["modelFormat"] in [
        {"name": fmt["name"], "version": fmt["version"]}
        for fmt in runtime["spec"]["supportedModelFormats"]
    ]
    assert model["protocolVersion"] in runtime["spec"]["protocolVersions"]


# -- systemd --------------------------------------------------------------------------------


def systemd_unit() -> dict[str, str]:
    """The unit's ``Key=value`` lines (each key appears once in ours)."""
    lines = (DEPLOY / "systemd" / "corral.service").read_text().splitlines()
    pairs = [line.split("=", 1) for line in lines if "=" in line and line[0] not in "#;"]
    keys = [key for key, _ in pairs]
    assert len(keys) == len(set(keys)), keys
    return dict(pairs)


def test_the_systemd_command_is_accepted_and_the_stop_timeout_covers_the_drain() -> None:
    unit = systemd_unit()
    command = shlex.split(unit["ExecStart"])
    settings = serve_settings(command[1:])

    assert Path(command[0]).name == "corral"
    assert unit["KillSignal"] == "SIGTERM"
    assert float(unit["TimeoutStopSec"]) >= settings.drain_notice_s + settings.drain_timeout_s
    assert unit["NoNewPrivileges"] == "yes"
    assert unit["DynamicUser"] == "yes"


@pytest.mark.timeout(60)
def test_systemd_analyze_finds_nothing_wrong_with_the_unit(tmp_path: Path) -> None:
    if shutil.which("systemd-analyze") is None:
        pytest.skip("no systemd-analyze on this machine")
    # The unit names /opt/corral/bin/corral, which this machine need not have: point it at an
    # executable that exists, and change nothing else.
    text = (DEPLOY / "systemd" / "corral.service").read_text()
    unit = tmp_path / "corral.service"
    unit.write_text(text.replace("/opt/corral/bin/corral", shutil.which("true") or "/bin/true"))
    checked = subprocess.run(
        ["systemd-analyze", "verify", str(unit)], capture_output=True, text=True, timeout=50
    )

    problems = [line for line in checked.stderr.splitlines() if "corral.service" in line]
    assert checked.returncode == 0, checked.stderr
    assert not problems, checked.stderr


#: The public addresses deploy/ may name: each one checked by hand to exist (none now: the
#: systemd unit's Documentation= named a repository that does not exist).
REAL_ADDRESSES: frozenset[str] = frozenset()


def test_deploy_names_no_public_address_but_real_ones() -> None:
    named = {
        address
        for path in sorted(DEPLOY.rglob("*"))
        if path.is_file()
        for address in re.findall(r"https?://[^\s\"'<>`)]+", path.read_text())
        if not re.match(r"https?://(127\.0\.0\.1|localhost|0\.0\.0\.0)[:/]", address)
        # A cluster's own service names (the autoscaler's Prometheus) are not public.
        and not re.match(r"https?://[\w.-]+\.svc(\.cluster\.local)?[:/]", address)
    }
    assert named <= REAL_ADDRESSES, sorted(named - REAL_ADDRESSES)


def test_docs_state_the_sizing_rule_these_tests_check() -> None:
    text = (ROOT / "docs" / "deploy.md").read_text()
    rule = (
        f"container limit >= {HEADROOM} x ({BASE_BYTES // MIB} MiB + {ESTIMATE_BOUND} x "
        "memory_budget + 2 x max_body_bytes_in_flight)"
    )
    bodies = 2 * 4 * 64 * MIB  # the default body budget, twice

    assert rule in text
    for limit_gib, budget_mib in ((1, 161), (2, 743), (4, 1907), (8, 4234)):
        largest = (limit_gib * 1024 * MIB / HEADROOM - BASE_BYTES - bodies) / ESTIMATE_BOUND
        assert int(largest // MIB) == budget_mib
        assert f"| {limit_gib} GiB | {budget_mib:,} MiB" in text


def test_the_image_and_the_systemd_recipe_install_as_the_readme_does() -> None:
    # corral is not on PyPI: each builds the wheel in the checkout with the README's command
    # and installs that wheel with the serving extras, never `pip install corral`.
    readme = (DEPLOY.parent / "README.md").read_text()
    build = "pip wheel --no-deps --wheel-dir dist ."
    install = re.compile(r'pip install "\$\(ls ([\w/]+)/corral-\*\.whl\)\[server,grpc[a-z0-9,]*\]"')
    assert build in readme
    assert install.search(readme)
    runs = [rest for word, rest in dockerfile_instructions_all() if word == "RUN"]
    assert any(
        re.fullmatch(r"pip wheel (--no-cache-dir )?--no-deps --wheel-dir /wheels \.", run)
        for run in runs
    )
    assert any(install.search(run.replace("--no-cache-dir ", "")) for run in runs)
    unit = (DEPLOY / "systemd" / "corral.service").read_text()
    guide = (DEPLOY.parent / "docs" / "deploy.md").read_text()
    for text in (unit, guide):
        assert build in text
        assert install.search(text)
    for text in (readme, unit, guide, (DEPLOY / "Dockerfile").read_text()):
        assert not re.search(r"pip install '?corral\[", text)


def dockerfile_instructions_all() -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) of every stage, continuation lines joined."""
    text = re.sub(r"\\\n\s*", " ", (DEPLOY / "Dockerfile").read_text())
    lines = [line.strip() for line in text.splitlines()]
    return [tuple(line.split(None, 1)) for line in lines if line and line[0] != "#"]
