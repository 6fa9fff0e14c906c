"""TLS on every port: real certificates made here, real clients (tritonclient, curl), SIGHUP.

The certificates come from a test CA made with ``cryptography``: a server certificate for
127.0.0.1 and localhost, a client certificate, and a second CA with its own server and
client certificates, so that a reload is seen from outside: a client trusting only the first
CA cannot complete a handshake with the second's certificate, so an old connection that still
answers after the reload kept its handshake, and a new one that needs the second CA met the
new certificate.
"""

from __future__ import annotations

import asyncio
import datetime
import hashlib
import ipaddress
import json
import re
import shutil
import signal
import socket
import ssl
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID
from onnx import TensorProto

import corral.server.app
import corral.server.processes
import corral.server.tls
from corral.cli.commands import main
from corral.server.native.edge import NativeEdgeUnavailable, chosen_edge, edge_label
from corral.server.settings import ServerSettings
from corral.server.tls import ServerTls, TlsFileError, TlsFiles, read_material
from tests.helpers import add_model, build_identity, wait_until
from tests.processes import ServerProcess, logged, start_server, stop_server

pytestmark = [
    pytest.mark.timeout(120),
    pytest.mark.usefixtures("garbage_collected_on_the_main_thread"),
    # tritonclient's HTTP client (geventhttpclient) checks the server's name with
    # ssl.match_hostname, deprecated since Python 3.7, once the handshake has checked it.
    pytest.mark.filterwarnings("ignore:ssl.match_hostname:DeprecationWarning"),
]

CURL = shutil.which("curl")
X = np.array([[1.5, -2.0]], dtype=np.float32)


# -- the certificates ------------------------------------------------------------------------


def _key() -> ec.EllipticCurvePrivateKey:
    return ec.generate_private_key(ec.SECP256R1())


def _name(common_name: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])


def _certificate(
    subject: str,
    key: ec.EllipticCurvePrivateKey,
    issuer: tuple[str, ec.EllipticCurvePrivateKey] | None,
    *,
    ca: bool = False,
    server: bool = False,
) -> x509.Certificate:
    now = datetime.datetime.now(datetime.UTC)
    issuer_name, issuer_key = issuer if issuer is not None else (subject, key)
    builder = (
        x509.CertificateBuilder()
        .subject_name(_name(subject))
        .issuer_name(_name(issuer_name))
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(x509.BasicConstraints(ca=ca, path_length=None), critical=True)
    )
    if ca:
        builder = builder.add_extension(
            x509.KeyUsage(True, False, False, False, False, True, True, False, False), True
        )
    elif server:
        builder = builder.add_extension(
            x509.SubjectAlternativeName(
                [x509.IPAddress(ipaddress.ip_address("127.0.0.1")), x509.DNSName("localhost")]
            ),
            critical=False,
        ).add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), False)
    else:
        builder = builder.add_extension(
            x509.ExtendedKeyUsage([ExtendedKeyUsageOID.CLIENT_AUTH]), critical=False
        )
    return builder.sign(issuer_key, hashes.SHA256())


def _write_key(path: Path, key: ec.EllipticCurvePrivateKey, password: bytes | None = None) -> Path:
    encryption: serialization.KeySerializationEncryption = (
        serialization.NoEncryption()
        if password is None
        else serialization.BestAvailableEncryption(password)
    )
    path.write_bytes(
        key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, encryption)
    )
    return path


def _write_cert(path: Path, certificate: x509.Certificate) -> Path:
    path.write_bytes(certificate.public_bytes(serialization.Encoding.PEM))
    return path


@dataclass(frozen=True)
class Authority:
    """A CA's certificate, and a server and a client certificate it signed, with their keys."""

    ca: Path
    server_cert: Path
    server_key: Path
    client_cert: Path
    client_key: Path
    #: The server certificate's serial number, as a client sees it.
    server_serial: int


@dataclass(frozen=True)
class Pki:
    first: Authority
    second: Authority
    #: A key that belongs to no certificate here.
    stray_key: Path
    #: The first server certificate's key, encrypted with a passphrase.
    encrypted_key: Path


def _authority(folder: Path, name: str) -> Authority:
    folder.mkdir()
    ca_key = _key()
    ca = _certificate(f"corral test CA {name}", ca_key, None, ca=True)
    issuer = (f"corral test CA {name}", ca_key)
    server_key, client_key = _key(), _key()
    server = _certificate(f"corral server {name}", server_key, issuer, server=True)
    client = _certificate(f"corral client {name}", client_key, issuer)
    return Authority(
        _write_cert(folder / "ca.pem", ca),
        _write_cert(folder / "server.pem", server),
        _write_key(folder / "server.key", server_key),
        _write_cert(folder / "client.pem", client),
        _write_key(folder / "client.key", client_key),
        server.serial_number,
    )


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    root = tmp_path_factory.mktemp("pki")
    first = _authority(root / "first", "one")
    key = serialization.load_pem_private_key(first.server_key.read_bytes(), None)
    assert isinstance(key, ec.EllipticCurvePrivateKey)
    return Pki(
        first,
        _authority(root / "second", "two"),
        _write_key(root / "stray.key", _key()),
        _write_key(root / "encrypted.key", key, b"passphrase"),
    )


@pytest.fixture(scope="module")
def repo(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("repository")
    add_model(root, "identity", build_identity(TensorProto.FLOAT))
    return root


def _served_files(folder: Path, authority: Authority, *, client_ca: bool = False) -> list[str]:
    """Copies of ``authority``'s server files in ``folder`` (swapped by the tests), as flags."""
    folder.mkdir(exist_ok=True)
    cert = shutil.copy(authority.server_cert, folder / "cert.pem")
    key = shutil.copy(authority.server_key, folder / "key.pem")
    flags = ["--tls-cert-file", str(cert), "--tls-key-file", str(key)]
    if client_ca:
        flags += ["--tls-client-ca-file", str(shutil.copy(authority.ca, folder / "ca.pem"))]
    return flags


def _swap(folder: Path, authority: Authority) -> None:
    """Replace the served certificate and key with ``authority``'s, each file atomically."""
    for source, name in ((authority.server_cert, "cert.pem"), (authority.server_key, "key.pem")):
        shutil.copy(source, folder / f".{name}.new")
        (folder / f".{name}.new").replace(folder / name)


def _client_context(
    ca: Path, client: Authority | None = None, *, factory: Any = ssl.create_default_context
) -> ssl.SSLContext:
    context: ssl.SSLContext = factory(cafile=str(ca))
    if client is not None:
        context.load_cert_chain(str(client.client_cert), str(client.client_key))
    return context


def _peer_serial(sock: ssl.SSLSocket) -> int:
    der = sock.getpeercert(binary_form=True)
    assert der is not None
    return x509.load_der_x509_certificate(der).serial_number


def _https_get(
    address: str, path: str, context: ssl.SSLContext, *, timeout: float = 10.0
) -> tuple[int, bytes, int]:
    """One GET over a new TLS connection: status, body and the server certificate's serial."""
    host, port = address.split(":")
    raw = socket.create_connection((host, int(port)), timeout=timeout)
    with raw, context.wrap_socket(raw, server_hostname=host) as sock:
        sock.sendall(
            f"GET {path} HTTP/1.1\r\nHost: {address}\r\nConnection: close\r\n\r\n".encode()
        )
        answer = b""
        while chunk := sock.recv(65536):
            answer += chunk
        head, _, body = answer.partition(b"\r\n\r\n")
        return int(head.split()[1]), body, _peer_serial(sock)


def _curl(*arguments: str) -> subprocess.CompletedProcess[str]:
    assert CURL is not None
    return subprocess.run(
        [CURL, "--silent", "--show-error", "--max-time", "10", *arguments],
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )


def _infer_http(address: str, ca: Path, client: Authority | None = None) -> np.ndarray:
    import gevent.ssl
    import tritonclient.http as httpclient

    context = _client_context(ca, client, factory=gevent.ssl.create_default_context)
    triton = httpclient.InferenceServerClient(
        address, ssl=True, ssl_context_factory=lambda: context
    )
    try:
        given = httpclient.InferInput("X", [1, 2], "FP32")
        given.set_data_from_numpy(X)
        result = triton.infer("identity", [given])
        return np.asarray(result.as_numpy("Y"))
    finally:
        triton.close()


def _grpc_client(address: str, ca: Path, client: Authority | None = None) -> Any:
    import tritonclient.grpc as grpcclient

    return grpcclient.InferenceServerClient(
        address,
        ssl=True,
        root_certificates=str(ca),
        private_key=None if client is None else str(client.client_key),
        certificate_chain=None if client is None else str(client.client_cert),
    )


def _infer_grpc(triton: Any) -> np.ndarray:
    import tritonclient.grpc as grpcclient

    given = grpcclient.InferInput("X", [1, 2], "FP32")
    given.set_data_from_numpy(X)
    return np.asarray(triton.infer("identity", [given], client_timeout=10).as_numpy("Y"))


def _lines(served: ServerProcess) -> int:
    return len(served.log.read_text().splitlines())


# -- the files, checked at start -------------------------------------------------------------


def test_good_files_give_their_material_and_fingerprint(pki: Pki):
    material = read_material(TlsFiles(pki.first.server_cert, pki.first.server_key, pki.first.ca))
    assert material.context.verify_mode == ssl.CERT_REQUIRED  # a client CA: mTLS
    assert material.client_ca_pem == pki.first.ca.read_bytes()
    der = x509.load_pem_x509_certificate(pki.first.server_cert.read_bytes()).public_bytes(
        serialization.Encoding.DER
    )
    assert material.fingerprint == hashlib.sha256(der).hexdigest()
    plain = read_material(TlsFiles(pki.first.server_cert, pki.first.server_key))
    assert plain.context.verify_mode == ssl.CERT_NONE  # no client certificate asked for


@pytest.mark.parametrize(
    ("case", "expected"),
    [
        ("missing cert", r"--tls-cert-file \S+nowhere\.pem: no such file"),
        ("missing key", r"--tls-key-file \S+nowhere\.pem: no such file"),
        ("missing ca", r"--tls-client-ca-file \S+nowhere\.pem: no such file"),
        ("folder", r"--tls-cert-file \S+: a folder, not a PEM file"),
        ("key as cert", r"--tls-cert-file \S+server\.key: holds no PEM certificate"),
        ("cert as key", r"--tls-key-file \S+server\.pem: holds no PEM private key"),
        ("stray key", r"--tls-key-file \S+stray\.key is not the key of --tls-cert-file"),
        ("encrypted key", r"--tls-key-file \S+encrypted\.key: the key is encrypted"),
        ("ca not pem", r"--tls-client-ca-file \S+server\.key: holds no PEM certificate"),
    ],
)
def test_a_file_that_cannot_serve_is_named_with_what_is_wrong(
    pki: Pki, tmp_path: Path, case: str, expected: str
):
    first, nowhere = pki.first, tmp_path / "nowhere.pem"
    files = {
        "missing cert": TlsFiles(nowhere, first.server_key),
        "missing key": TlsFiles(first.server_cert, nowhere),
        "missing ca": TlsFiles(first.server_cert, first.server_key, nowhere),
        "folder": TlsFiles(tmp_path, first.server_key),
        "key as cert": TlsFiles(first.server_key, first.server_key),
        "cert as key": TlsFiles(first.server_cert, first.server_cert),
        "stray key": TlsFiles(first.server_cert, pki.stray_key),
        "encrypted key": TlsFiles(first.server_cert, pki.encrypted_key),
        "ca not pem": TlsFiles(first.server_cert, first.server_key, first.server_key),
    }[case]
    with pytest.raises(TlsFileError, match=expected):
        read_material(files)


def test_a_pem_block_openssl_cannot_read_is_named(pki: Pki, tmp_path: Path):
    garbage = tmp_path / "garbage.pem"
    garbage.write_text("-----BEGIN CERTIFICATE-----\nbm90IGEgY2VydA==\n-----END CERTIFICATE-----\n")
    with pytest.raises(TlsFileError, match=r"--tls-cert-file \S+garbage\.pem with --tls-key-file"):
        read_material(TlsFiles(garbage, pki.first.server_key))
    with pytest.raises(TlsFileError, match=r"--tls-client-ca-file \S+garbage\.pem: OpenSSL cannot"):
        read_material(TlsFiles(pki.first.server_cert, pki.first.server_key, garbage))


@pytest.mark.parametrize(
    ("error", "expected"),
    [
        (PermissionError(13, "Permission denied"), "not readable by this user (Permission denied)"),
        (OSError(5, "Input/output error"), "cannot be read (Input/output error)"),
    ],
)
def test_a_file_the_server_cannot_read_is_named(
    pki: Pki, monkeypatch: pytest.MonkeyPatch, error: OSError, expected: str
):
    # Run as root here, a mode cannot make a file unreadable: the read itself fails instead.
    original = Path.read_bytes

    def read_bytes(path: Path) -> bytes:
        if path == pki.first.server_key:
            raise error
        return original(path)

    monkeypatch.setattr(Path, "read_bytes", read_bytes)
    with pytest.raises(
        TlsFileError, match=re.escape(f"--tls-key-file {pki.first.server_key}: {expected}")
    ):
        read_material(TlsFiles(pki.first.server_cert, pki.first.server_key))


def test_files_replaced_while_read_are_refused_not_mixed(
    pki: Pki, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    files = TlsFiles(*(Path(flag) for flag in _served_files(tmp_path, pki.first)[1::2]))
    read_bytes = Path.read_bytes
    reads: list[Path] = []

    def then_replaced(path: Path) -> bytes:
        content = read_bytes(path)
        reads.append(path)
        if len(reads) == 2:  # the key, first read: a copy lands before the context is loaded
            _swap(tmp_path, pki.second)
        return content

    monkeypatch.setattr(Path, "read_bytes", then_replaced)
    with pytest.raises(TlsFileError, match="changed while they were read"):
        read_material(files)


def test_a_key_or_a_client_ca_without_the_certificate_is_refused(pki: Pki, tmp_path: Path):
    with pytest.raises(ValueError, match="tls_cert_file is given without tls_key_file"):
        ServerSettings(repository=tmp_path, tls_cert_file=pki.first.server_cert)
    with pytest.raises(ValueError, match="tls_key_file is given without tls_cert_file"):
        ServerSettings(repository=tmp_path, tls_key_file=pki.first.server_key)
    with pytest.raises(ValueError, match="tls_client_ca_file is given without tls_cert_file"):
        ServerSettings(repository=tmp_path, tls_client_ca_file=pki.first.ca)


# -- the command line: corral's flags, their variables, Triton's spellings ----------------------


def test_the_flags_and_their_variables_set_the_files(
    pki: Pki, tmp_path: Path, served: list[ServerSettings], monkeypatch: pytest.MonkeyPatch
):
    first = pki.first
    flags = ["--tls-cert-file", str(first.server_cert), "--tls-key-file", str(first.server_key)]
    assert main(["serve", str(tmp_path), *flags, "--tls-client-ca-file", str(first.ca)]) == 0
    monkeypatch.setenv("CORRAL_TLS_CERT_FILE", str(first.server_cert))
    monkeypatch.setenv("CORRAL_TLS_KEY_FILE", str(first.server_key))
    monkeypatch.setenv("CORRAL_TLS_CLIENT_CA_FILE", str(first.ca))
    assert main(["serve", str(tmp_path)]) == 0
    by_flags, by_variables = served
    for settings in served:
        assert settings.tls_cert_file == first.server_cert
        assert settings.tls_key_file == first.server_key
        assert settings.tls_client_ca_file == first.ca
    assert by_flags == by_variables


def test_tritons_grpc_tls_flags_mean_the_same(
    pki: Pki, tmp_path: Path, served: list[ServerSettings], caplog: pytest.LogCaptureFixture
):
    first = pki.first
    triton = ["--grpc-server-cert", str(first.server_cert), "--grpc-server-key"]
    triton += [str(first.server_key), "--grpc-use-ssl", "true"]
    assert main(["serve", str(tmp_path), *triton]) == 0
    mutual = ["--grpc-use-ssl-mutual=true", "--grpc-root-cert", str(first.ca)]
    assert main(["serve", str(tmp_path), *triton, *mutual]) == 0
    # Triton uses its root certificate only for mTLS: without it, neither does corral.
    assert main(["serve", str(tmp_path), *triton, "--grpc-root-cert", str(first.ca)]) == 0
    plain, mtls, root_unused = served
    assert (plain.tls_cert_file, plain.tls_key_file) == (first.server_cert, first.server_key)
    assert plain.tls_client_ca_file is None
    assert mtls.tls_client_ca_file == first.ca
    assert root_unused.tls_client_ca_file is None
    # --grpc-use-ssl=false without a certificate: plain text, as Triton serves it.
    assert main(["serve", str(tmp_path), "--grpc-use-ssl", "false"]) == 0
    assert served[-1].tls_cert_file is None
    assert "--grpc-root-cert" in caplog.text
    assert "is not used" in caplog.text


@pytest.mark.parametrize(
    ("flags", "expected"),
    [
        (["--grpc-use-ssl", "true"], "--grpc-use-ssl=true needs --grpc-server-cert"),
        (["--grpc-use-ssl", "maybe"], "--grpc-use-ssl 'maybe': give true or false"),
        (["--grpc-use-ssl-mutual", "true", "CERTS"], "--grpc-use-ssl-mutual=true needs"),
        (["--grpc-use-ssl", "false", "CERTS"], "--grpc-use-ssl=false, but a certificate"),
        (["--edge", "native", "CERTS"], "--edge native: the native edge does not terminate TLS"),
        (["--tls-cert-file", "CERT", "--tls-key-file", "STRAY"], "is not the key of"),
        (
            [
                *("CERTS", "--grpc-use-ssl-mutual", "true", "--grpc-root-cert", "CA"),
                *("--tls-client-ca-file", "CERT"),
            ],
            "name the same setting with different values",
        ),
    ],
)
def test_a_tls_command_line_that_cannot_serve_exits_2_saying_why(
    pki: Pki,
    tmp_path: Path,
    served: list[ServerSettings],
    capsys: pytest.CaptureFixture[str],
    flags: list[str],
    expected: str,
):
    certs = ["--grpc-server-cert", str(pki.first.server_cert)]
    certs += ["--grpc-server-key", str(pki.first.server_key)]
    spelled: list[str] = []
    for flag in flags:
        named = {
            "CERT": str(pki.first.server_cert),
            "STRAY": str(pki.stray_key),
            "CA": str(pki.first.ca),
        }
        spelled += certs if flag == "CERTS" else [named.get(flag, flag)]
    assert main(["serve", str(tmp_path), *spelled]) == 2
    assert served == []
    assert expected in capsys.readouterr().err


# -- the edge: TLS is the Python edge's ----------------------------------------------------------


def test_tls_chooses_the_python_edge_and_native_is_refused():
    assert chosen_edge("auto", tls=True) == "python"
    assert chosen_edge("python", tls=True) == "python"
    with pytest.raises(NativeEdgeUnavailable, match="the native edge does not terminate TLS"):
        chosen_edge("native", tls=True)
    assert edge_label("python", tls=True) == "python (TLS is served by the Python edge)"
    assert edge_label("native", tls=False) == "native"


# -- reloading, in-process ------------------------------------------------------------------------


def test_grpc_is_handed_each_new_material_once(pki: Pki, tmp_path: Path):
    files = TlsFiles(*(Path(flag) for flag in _served_files(tmp_path, pki.first)[1::2]))
    tls = ServerTls(files, read_material(files))
    assert tls.newer_for_grpc() is None  # nothing new since start
    _swap(tmp_path, pki.second)
    assert asyncio.run(tls.reload()) is True
    assert tls.newer_for_grpc() is not None  # the new material, once
    assert tls.newer_for_grpc() is None


def test_a_reload_that_fails_keeps_the_material_in_use(
    pki: Pki, tmp_path: Path, caplog: pytest.LogCaptureFixture
):
    flags = _served_files(tmp_path, pki.first)
    settings = ServerSettings(repository=tmp_path, tls_cert_file=flags[1], tls_key_file=flags[3])
    tls = ServerTls.from_settings(settings)
    assert tls is not None
    before = tls.material
    shutil.copy(pki.stray_key, tmp_path / "key.pem")
    assert asyncio.run(tls.reload()) is False
    assert tls.material is before
    assert tls.newer_for_grpc() is None  # gRPC is not handed anything either
    assert "the TLS files were not reloaded" in caplog.text
    assert f"--tls-key-file {tmp_path / 'key.pem'} is not the key of" in caplog.text


@pytest.mark.timeout(60)
def test_a_reloaded_client_ca_decides_new_https_handshakes(pki: Pki, tmp_path: Path):
    """The listening context hands each handshake to the newest one: its CA checks the client."""
    flags = _served_files(tmp_path, pki.first, client_ca=True)
    files = TlsFiles(*(Path(flag) for flag in flags[1::2]))
    tls = ServerTls(files, read_material(files))

    async def scenario() -> list[bool]:
        async def answer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            writer.write(b"ok")
            await writer.drain()
            writer.close()

        server = await asyncio.start_server(answer, "127.0.0.1", 0, ssl=tls.http_context)
        port = server.sockets[0].getsockname()[1]

        async def handshake(client: Authority) -> bool:
            context = _client_context(pki.first.ca, client)
            try:
                reader, writer = await asyncio.wait_for(
                    asyncio.open_connection("127.0.0.1", port, ssl=context), 10
                )
                got = await asyncio.wait_for(reader.read(), 10)
                writer.close()
                return got == b"ok"
            except (ssl.SSLError, ConnectionError):
                return False

        seen = [await handshake(pki.first), await handshake(pki.second)]
        shutil.copy(pki.second.ca, tmp_path / "ca.pem")
        assert await tls.reload()
        seen += [await handshake(pki.first), await handshake(pki.second)]
        server.close()
        await server.wait_closed()
        return seen

    # Before: the first CA's client only; after: the second's only.
    assert asyncio.run(scenario()) == [True, False, False, True]


@pytest.mark.timeout(60)
def test_serve_reads_the_files_itself_when_not_given_them(repo: Path, pki: Pki):
    """corral.server.app.serve, as an embedding program calls it: TLS from the settings alone."""
    settings = ServerSettings(
        repository=str(repo),
        http_port=0,
        grpc_port=-1,
        edge="python",
        tls_cert_file=pki.first.server_cert,
        tls_key_file=pki.first.server_key,
    )
    answers: list[bytes] = []
    asking: list[asyncio.Task[None]] = []  # held: the loop keeps only a weak reference

    async def scenario() -> int:
        stop = asyncio.Event()

        async def ask_then_stop(port: int) -> None:
            try:
                context = _client_context(pki.first.ca)
                reader, writer = await asyncio.open_connection("127.0.0.1", port, ssl=context)
                writer.write(b"GET /v2/health/live HTTP/1.1\r\nhost: 127.0.0.1\r\n")
                writer.write(b"connection: close\r\n\r\n")
                answers.append(await asyncio.wait_for(reader.read(), 10))
                writer.close()
            finally:
                stop.set()

        def started(addresses: corral.server.app.Addresses) -> None:
            loop = asyncio.get_running_loop()
            asking.append(loop.create_task(ask_then_stop(addresses.http_port)))

        return await corral.server.app.serve(settings, stop, started=started)

    assert asyncio.run(scenario()) == corral.server.app.EXIT_CLEAN
    (answer,) = answers
    assert answer.startswith(b"HTTP/1.1 200 ")


# -- a real server: tritonclient, curl, plain text, SIGHUP -----------------------------------------


@pytest.fixture(scope="module")
def tls_server(
    repo: Path, pki: Pki, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[ServerProcess, Path]]:
    """``corral serve`` on the Python edge with the first CA's certificate (copies, swapped)."""
    folder = tmp_path_factory.mktemp("served-tls")
    flags = _served_files(folder / "files", pki.first)
    served = start_server(
        repo,
        folder / "serve.log",
        *flags,
        "--metrics-port",
        "0",
        "--idle-timeout-s",
        "60",
        environment={"CORRAL_EDGE": "python"},
    )
    yield served, folder / "files"
    stop_server(served)


def test_tritonclient_infers_over_tls_on_http_and_grpc(
    tls_server: tuple[ServerProcess, Path], pki: Pki
):
    served, _ = tls_server
    assert np.array_equal(_infer_http(served.http, pki.first.ca), X)
    triton = _grpc_client(served.grpc, pki.first.ca)
    try:
        assert np.array_equal(_infer_grpc(triton), X)
    finally:
        triton.close()
    assert "TLS is served by the Python edge; TLS, certificate sha256" in served.log.read_text()


@pytest.mark.skipif(CURL is None, reason="curl is not installed")
def test_curl_reads_health_and_metrics_over_https(tls_server: tuple[ServerProcess, Path], pki: Pki):
    served, _ = tls_server
    done = _curl("--fail", "--cacert", str(pki.first.ca), f"https://{served.http}/v2/health/ready")
    assert done.returncode == 0, done.stderr
    found = re.search(r"metrics on https://127\.0\.0\.1:(\d+)/metrics", served.log.read_text())
    assert found, served.log.read_text()
    metrics = f"https://127.0.0.1:{found[1]}/metrics"
    done = _curl("--fail", "--cacert", str(pki.first.ca), metrics)
    assert done.returncode == 0, done.stderr
    assert "# TYPE" in done.stdout
    # Plain HTTP on the metrics port gets no metrics either.
    plain = _curl(f"http://127.0.0.1:{found[1]}/metrics")
    assert plain.returncode != 0
    assert "# TYPE" not in plain.stdout


@pytest.mark.timeout(30)
def test_a_plain_text_client_is_closed_at_once(tls_server: tuple[ServerProcess, Path]):
    served, _ = tls_server
    host, port = served.http.split(":")
    with socket.create_connection((host, int(port)), timeout=10) as sock:
        sock.sendall(f"GET /v2/health/live HTTP/1.1\r\nHost: {served.http}\r\n\r\n".encode())
        answer = b""
        while chunk := sock.recv(4096):  # a timeout here (10 s) fails the test
            answer += chunk
    assert b"HTTP/1.1" not in answer  # at most a TLS alert, then the connection closed


@pytest.mark.timeout(30)
def test_a_plain_text_grpc_client_is_refused(tls_server: tuple[ServerProcess, Path]):
    import tritonclient.grpc as grpcclient
    from tritonclient.utils import InferenceServerException

    served, _ = tls_server
    triton = grpcclient.InferenceServerClient(served.grpc)
    try:
        with pytest.raises(InferenceServerException, match=r"UNAVAILABLE|unavailable"):
            triton.is_server_live(client_timeout=10)
    finally:
        triton.close()


@pytest.mark.timeout(90)
def test_sighup_reloads_the_files_and_open_connections_stay(
    tls_server: tuple[ServerProcess, Path], pki: Pki
):
    import http.client

    served, files = tls_server
    host, port = served.http.split(":")
    old = http.client.HTTPSConnection(
        host, int(port), context=_client_context(pki.first.ca), timeout=10
    )
    triton = _grpc_client(served.grpc, pki.first.ca)  # trusts the first CA only
    try:
        old.request("GET", "/v2/health/live")
        assert json.loads(old.getresponse().read()) == {"live": True}
        sock = old.sock
        assert isinstance(sock, ssl.SSLSocket)
        assert _peer_serial(sock) == pki.first.server_serial
        assert np.array_equal(_infer_grpc(triton), X)

        since = _lines(served)
        _swap(files, pki.second)
        served.process.send_signal(signal.SIGHUP)
        assert logged(served, since, lambda line: "TLS reloaded from" in line)
        assert served.process.poll() is None  # SIGHUP with TLS does not stop the server

        # The connections opened before answer on, on their first handshake.
        old.request("GET", "/v2/health/live")
        assert old.getresponse().status == 200
        assert old.sock is sock
        assert np.array_equal(_infer_grpc(triton), X)

        # A new connection gets the second CA's certificate: the first CA alone refuses it.
        with pytest.raises(ssl.SSLCertVerificationError):
            _https_get(served.http, "/v2/health/live", _client_context(pki.first.ca))
        status, _, serial = _https_get(
            served.http, "/v2/health/live", _client_context(pki.second.ca)
        )
        assert (status, serial) == (200, pki.second.server_serial)
        assert np.array_equal(_infer_http(served.http, pki.second.ca), X)
        fresh = _grpc_client(served.grpc, pki.second.ca)
        try:
            assert np.array_equal(_infer_grpc(fresh), X)
        finally:
            fresh.close()

        # A reload whose files cannot serve keeps the certificate in use, never plain text.
        since = _lines(served)
        shutil.copy(pki.stray_key, files / "key.pem")
        served.process.send_signal(signal.SIGHUP)
        (error,) = logged(served, since, lambda line: "were not reloaded" in line)
        assert f"--tls-key-file {files / 'key.pem'} is not the key of" in error
        status, _, serial = _https_get(
            served.http, "/v2/health/live", _client_context(pki.second.ca)
        )
        assert (status, serial) == (200, pki.second.server_serial)
    finally:
        old.close()
        triton.close()
        _swap(files, pki.first)


# -- mTLS, and the default edge falling to the Python edge -----------------------------------------


@pytest.fixture(scope="module")
def mtls_server(
    repo: Path, pki: Pki, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[ServerProcess]:
    """``corral serve`` with the default edge (auto: native when installed) and mTLS."""
    folder = tmp_path_factory.mktemp("served-mtls")
    flags = _served_files(folder / "files", pki.first, client_ca=True)
    served = start_server(repo, folder / "serve.log", *flags, environment={"CORRAL_EDGE": "auto"})
    yield served
    stop_server(served)


def test_the_default_edge_serves_tls_on_the_python_edge_and_says_so(
    mtls_server: ServerProcess, pki: Pki
):
    log = mtls_server.log.read_text()
    assert re.search(
        r"\(the Python edge: TLS is served by the Python edge; TLS with client certificates "
        r"required \(mTLS\), certificate sha256 [0-9a-f]{16}\)",
        log,
    ), log
    status, body, _ = _https_get(
        mtls_server.http, "/v2/corral/status", _client_context(pki.first.ca, pki.first)
    )
    assert status == 200
    assert json.loads(body)["server"]["edge"] == "python (TLS is served by the Python edge)"


@pytest.mark.skipif(CURL is None, reason="curl is not installed")
def test_mtls_refuses_a_client_without_a_certificate_of_its_ca(
    mtls_server: ServerProcess, pki: Pki
):
    url = f"https://{mtls_server.http}/v2/health/ready"
    ca = ["--cacert", str(pki.first.ca)]
    refused = _curl("--fail", *ca, url)
    assert refused.returncode != 0
    assert refused.stdout == ""
    other = ["--cert", str(pki.second.client_cert), "--key", str(pki.second.client_key)]
    assert _curl("--fail", *ca, *other, url).returncode != 0  # another CA's client
    mine = ["--cert", str(pki.first.client_cert), "--key", str(pki.first.client_key)]
    accepted = _curl("--fail", *ca, *mine, url)
    assert accepted.returncode == 0, accepted.stderr


def test_corral_status_reads_an_mtls_server_with_its_ca_and_certificate(
    mtls_server: ServerProcess, pki: Pki
):
    status = [sys.executable, "-m", "corral.cli", "status", f"https://{mtls_server.http}"]
    mine = ["--ca-file", str(pki.first.ca), "--cert-file", str(pki.first.client_cert)]
    mine += ["--key-file", str(pki.first.client_key)]
    shown = subprocess.run([*status, *mine], capture_output=True, text=True, timeout=60)
    assert shown.returncode == 0, shown.stderr
    # rich wraps the head line where the terminal's width ends it: read it unwrapped.
    assert "edge: python (TLS is served" in " ".join(shown.stdout.split()), shown.stdout
    document = subprocess.run(
        [*status, *mine, "--json"], capture_output=True, text=True, timeout=60
    )
    assert json.loads(document.stdout)["server"]["edge"].startswith("python (TLS")
    # Without a client certificate, and without the CA: refused, saying why.
    anonymous = [*status, "--ca-file", str(pki.first.ca)]
    for command in (anonymous, status):
        refused = subprocess.run(command, capture_output=True, text=True, timeout=60)
        assert refused.returncode != 0
        assert "cannot reach" in refused.stderr, refused.stderr
    lone_key = [*status, "--key-file", str(pki.first.client_key)]
    refused = subprocess.run(lone_key, capture_output=True, text=True, timeout=60)
    assert "--key-file needs --cert-file" in refused.stderr, refused.stderr
    missing_ca = [*status, "--ca-file", str(pki.first.ca) + ".missing"]
    refused = subprocess.run(missing_ca, capture_output=True, text=True, timeout=60)
    assert "--ca-file" in refused.stderr, refused.stderr
    wrong_key = [*status, *mine[:4], "--key-file", str(pki.stray_key)]
    refused = subprocess.run(wrong_key, capture_output=True, text=True, timeout=60)
    assert "--cert-file" in refused.stderr, refused.stderr


def test_mtls_on_grpc_and_http_with_tritonclient(mtls_server: ServerProcess, pki: Pki):
    from tritonclient.utils import InferenceServerException

    assert np.array_equal(_infer_http(mtls_server.http, pki.first.ca, pki.first), X)
    triton = _grpc_client(mtls_server.grpc, pki.first.ca, pki.first)
    anonymous = _grpc_client(mtls_server.grpc, pki.first.ca)
    try:
        assert np.array_equal(_infer_grpc(triton), X)
        with pytest.raises(InferenceServerException):
            anonymous.is_server_live(client_timeout=10)
    finally:
        triton.close()
        anonymous.close()


# -- --processes N: each process serves TLS and reloads on the parent's SIGHUP -------------------


@pytest.mark.timeout(120)
def test_a_group_without_tls_stops_on_sighup(repo: Path, tmp_path: Path):
    served = start_server(
        repo, tmp_path / "serve.log", "--processes", "2", environment={"CORRAL_EDGE": "python"}
    )
    try:
        wait_until(lambda: "all 2 processes are ready" in served.log.read_text(), 60)
        served.process.send_signal(signal.SIGHUP)
        assert served.process.wait(timeout=60) == 0
        assert "SIGHUP received, stopping 2 processes" in served.log.read_text()
    finally:
        stop_server(served)


@pytest.mark.timeout(180)
def test_a_group_passes_sighup_to_each_process_which_reloads(repo: Path, pki: Pki, tmp_path: Path):
    flags = _served_files(tmp_path / "files", pki.first)
    served = start_server(
        repo,
        tmp_path / "serve.log",
        *flags,
        "--processes",
        "2",
        environment={"CORRAL_EDGE": "python"},
    )
    try:
        wait_until(lambda: "all 2 processes are ready" in served.log.read_text(), 60)
        status, _, serial = _https_get(
            served.http, "/v2/health/ready", _client_context(pki.first.ca)
        )
        assert (status, serial) == (200, pki.first.server_serial)
        _swap(tmp_path / "files", pki.second)
        served.process.send_signal(signal.SIGHUP)
        wait_until(lambda: served.log.read_text().count("TLS reloaded from") == 2, 30)
        assert "SIGHUP received, passed on to 2 processes" in served.log.read_text()
        assert served.process.poll() is None
        # Whichever process a new connection reaches, it has the new certificate.
        for _ in range(6):
            status, _, serial = _https_get(
                served.http, "/v2/health/live", _client_context(pki.second.ca)
            )
            assert (status, serial) == (200, pki.second.server_serial)
    finally:
        stop_server(served)
