"""TLS for ``corral serve``: one certificate, key and optional client CA for every port.

:class:`ServerTls` reads the files named by ``--tls-cert-file``, ``--tls-key-file`` and
``--tls-client-ca-file`` and checks that they can serve (each file present and readable, the
certificate and key PEM, the key unencrypted and matching the certificate, the client CA a
PEM bundle): a file that cannot is :class:`TlsFileError`, naming it and what is wrong, and
the server does not start.

The servers take their TLS from it: the HTTP and metrics ports an :class:`ssl.SSLContext`
(:attr:`ServerTls.http_context`), gRPC grpc's dynamic credentials
(:meth:`ServerTls.grpc_credentials`). With a client CA, both require a client certificate
signed by it (mTLS).

:meth:`ServerTls.reload` (SIGHUP) reads the files again. New material is taken only whole and
checked; new handshakes use it, while connections already open keep theirs and stay open.
HTTP switches each new handshake to the newest context in the server-name callback, which
OpenSSL calls on every ClientHello (with or without a name); gRPC asks the fetcher given to
``grpc.dynamic_ssl_server_credentials`` before each handshake. A reload that fails keeps the
material in use and logs an error naming the file: the server never drops to plain text.

Example::

    tls = ServerTls.from_settings(settings)   # None when --tls-cert-file is not given
    await tls.reload()                        # on SIGHUP
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import re
import ssl
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import grpc

    from corral.server.settings import ServerSettings

__all__ = ["ServerTls", "TlsFileError", "TlsFiles", "TlsMaterial", "read_material"]

logger = logging.getLogger(__name__)

_PEM_CERTIFICATE = re.compile(
    rb"-----BEGIN CERTIFICATE-----\s.+?-----END CERTIFICATE-----", re.DOTALL
)


class TlsFileError(ValueError):
    """A TLS file cannot serve: missing, unreadable, not PEM, encrypted, or not matching.

    The text names the file (its option and path) and what is wrong with it.
    """


@dataclass(frozen=True)
class TlsFiles:
    """Where the server's TLS material is read from (the settings' paths)."""

    cert: Path
    key: Path
    #: With it, clients must present a certificate signed by one of its CAs (mTLS).
    client_ca: Path | None = None

    @classmethod
    def from_settings(cls, settings: ServerSettings) -> TlsFiles | None:
        """The files ``settings`` name, or None when TLS is off (no ``tls_cert_file``)."""
        if settings.tls_cert_file is None or settings.tls_key_file is None:
            return None  # the settings refuse one without the other
        return cls(settings.tls_cert_file, settings.tls_key_file, settings.tls_client_ca_file)


@dataclass(frozen=True)
class TlsMaterial:
    """The files' bytes as read together, and the server context made and checked from them."""

    cert_pem: bytes
    key_pem: bytes
    client_ca_pem: bytes | None
    #: The HTTP servers' context: this certificate and key, and the client CA if given.
    context: ssl.SSLContext
    #: The SHA-256 of the (first) certificate's DER bytes, as the logs name it.
    fingerprint: str


def read_material(files: TlsFiles) -> TlsMaterial:
    """Read and check ``files``; raises :class:`TlsFileError` naming the file that cannot serve.

    Reads the disk: call it off the event loop. The bytes are read, the context loaded from
    the same paths, and the bytes read again: a file replaced in between (a reload racing a
    copy) is refused rather than served half old, half new.
    """
    before = _read_all(files)
    context = _server_context(files, before)
    if _read_all(files) != before:
        raise TlsFileError(
            f"the TLS files ({files.cert}, {files.key}"
            + ("" if files.client_ca is None else f", {files.client_ca}")
            + ") changed while they were read: read them again once they are written"
        )
    cert_pem, key_pem, client_ca_pem = before
    first = _PEM_CERTIFICATE.search(cert_pem)
    assert first is not None  # _server_context refused a file without one
    der = ssl.PEM_cert_to_DER_cert(first[0].decode("ascii"))
    return TlsMaterial(cert_pem, key_pem, client_ca_pem, context, hashlib.sha256(der).hexdigest())


def _read_all(files: TlsFiles) -> tuple[bytes, bytes, bytes | None]:
    cert = _read("--tls-cert-file", files.cert)
    key = _read("--tls-key-file", files.key)
    ca = None if files.client_ca is None else _read("--tls-client-ca-file", files.client_ca)
    return cert, key, ca


def _read(option: str, path: Path) -> bytes:
    try:
        return path.read_bytes()
    except FileNotFoundError as exc:
        raise TlsFileError(f"{option} {path}: no such file") from exc
    except IsADirectoryError as exc:
        raise TlsFileError(f"{option} {path}: a folder, not a PEM file") from exc
    except PermissionError as exc:
        raise TlsFileError(f"{option} {path}: not readable by this user ({exc.strerror})") from exc
    except OSError as exc:
        raise TlsFileError(f"{option} {path}: cannot be read ({exc.strerror or exc})") from exc


def _refuse_encrypted_key() -> bytes:
    # Without a password callback OpenSSL would prompt on the terminal, hanging a server.
    raise TlsFileError("encrypted")


def _server_context(files: TlsFiles, pems: tuple[bytes, bytes, bytes | None]) -> ssl.SSLContext:
    cert_pem, key_pem, ca_pem = pems
    if _PEM_CERTIFICATE.search(cert_pem) is None:
        raise TlsFileError(f"--tls-cert-file {files.cert}: holds no PEM certificate")
    if b"PRIVATE KEY-----" not in key_pem:
        raise TlsFileError(f"--tls-key-file {files.key}: holds no PEM private key")
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    try:
        context.load_cert_chain(files.cert, files.key, password=_refuse_encrypted_key)
    except TlsFileError as exc:
        raise TlsFileError(
            f"--tls-key-file {files.key}: the key is encrypted; give it unencrypted "
            "(readable by this user only), since the server cannot ask for a passphrase"
        ) from exc
    except ssl.SSLError as exc:
        if "KEY_VALUES_MISMATCH" in str(exc) or "key values mismatch" in str(exc):
            raise TlsFileError(
                f"--tls-key-file {files.key} is not the key of --tls-cert-file {files.cert}"
            ) from exc
        raise TlsFileError(
            f"--tls-cert-file {files.cert} with --tls-key-file {files.key}: OpenSSL cannot "
            f"load them ({exc.reason or exc})"
        ) from exc
    if ca_pem is not None:
        assert files.client_ca is not None  # read only when given
        if _PEM_CERTIFICATE.search(ca_pem) is None:
            raise TlsFileError(f"--tls-client-ca-file {files.client_ca}: holds no PEM certificate")
        try:
            context.load_verify_locations(cadata=ca_pem.decode("ascii", errors="replace"))
        except ssl.SSLError as exc:
            raise TlsFileError(
                f"--tls-client-ca-file {files.client_ca}: OpenSSL cannot load it as CA "
                f"certificates ({exc.reason or exc})"
            ) from exc
        context.verify_mode = ssl.CERT_REQUIRED
    return context


class ServerTls:
    """The server's TLS material in use, reloaded on demand; safe from any thread.

    The first material's context is the one the HTTP servers listen with
    (:attr:`http_context`); its server-name callback moves each new handshake to the newest
    material's context. Whether clients must present a certificate is fixed at start: the
    client CA's file is read again on reload, but it cannot be added or taken away.
    """

    def __init__(self, files: TlsFiles, material: TlsMaterial) -> None:
        self.files = files
        # Guards _material and _generation (read by handshakes on the loop and grpc's threads,
        # replaced by reload) and _delivered (grpc's fetcher's bookkeeping).
        self._material_lock = threading.Lock()
        self._material = material
        #: Counts the materials taken: 1 at start, one more per successful reload.
        self._generation = 1
        self._delivered = 1  # the generation gRPC was last given
        self.http_context = material.context
        self.http_context.sni_callback = self._newest_context

    @classmethod
    def from_settings(cls, settings: ServerSettings) -> ServerTls | None:
        """Read and check the files ``settings`` name (None when TLS is off).

        Raises :class:`TlsFileError` naming the file that cannot serve. Reads the disk.
        """
        files = TlsFiles.from_settings(settings)
        return None if files is None else cls(files, read_material(files))

    @property
    def mutual(self) -> bool:
        """Whether clients must present a certificate signed by the client CA (mTLS)."""
        return self.files.client_ca is not None

    @property
    def material(self) -> TlsMaterial:
        """The material new handshakes use."""
        with self._material_lock:
            return self._material

    def describe(self) -> str:
        """How the start line names the TLS served: mTLS or not, and the certificate's hash."""
        kind = "TLS with client certificates required (mTLS)" if self.mutual else "TLS"
        return f"{kind}, certificate sha256 {self.material.fingerprint[:16]}"

    async def reload(self) -> bool:
        """Read the files again (off the loop); True if their material is now served.

        A file that cannot serve is logged at ERROR, naming it, and the material in use stays.
        """
        try:
            material = await asyncio.to_thread(read_material, self.files)
        except TlsFileError as exc:
            logger.error(
                "corral: SIGHUP: the TLS files were not reloaded, the certificate in use "
                "(sha256 %s) stays: %s",
                self.material.fingerprint[:16],
                exc,
            )
            return False
        material.context.sni_callback = None  # only the listening context switches
        with self._material_lock:
            self._material = material
            self._generation += 1
        logger.info(
            "corral: SIGHUP: TLS reloaded from %s; new connections get the certificate sha256 "
            "%s, open ones keep theirs",
            self.files.cert,
            material.fingerprint[:16],
        )
        return True

    def grpc_credentials(self) -> grpc.ServerCredentials:
        """The gRPC server's credentials: the material in use, and a fetcher of each newer one."""
        import grpc

        return grpc.dynamic_ssl_server_credentials(
            _grpc_configuration(self.material),
            # types-grpcio types the fetcher without None, which grpc's documentation allows
            # ("None for no change") and its core reads as "keep the current one".
            self.newer_for_grpc,  # type: ignore[arg-type]
            require_client_authentication=self.mutual,
        )

    def newer_for_grpc(self) -> grpc.ServerCertificateConfiguration | None:
        """The material reloaded since grpc was last handed one, once; None when none is.

        The fetcher of :meth:`grpc_credentials`: grpc calls it before each handshake, on its
        own threads, and keeps what it has on None.
        """
        with self._material_lock:
            if self._delivered == self._generation:
                return None
            self._delivered = self._generation
            material = self._material
        return _grpc_configuration(material)

    def _newest_context(
        self, connection: ssl.SSLObject | ssl.SSLSocket, server_name: str | None, _: object
    ) -> None:
        # OpenSSL's server-name callback: every ClientHello, on the loop's thread.
        context = self.material.context
        if connection.context is not context:
            connection.context = context


def _grpc_configuration(material: TlsMaterial) -> grpc.ServerCertificateConfiguration:
    import grpc

    return grpc.ssl_server_certificate_configuration(
        [(material.key_pem, material.cert_pem)], root_certificates=material.client_ca_pem
    )
