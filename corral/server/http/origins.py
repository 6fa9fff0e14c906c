"""Which sites may drive the HTTP server: the ``Host`` a request names, a browser's ``Origin``.

A web page in a browser on the server's machine can send requests to ``127.0.0.1:8000``
without the user knowing, and the HTTP protocol gives the server two ways to tell:

- **DNS rebinding**: a page at ``http://evil.example:8000`` whose name is then pointed at
  ``127.0.0.1`` is, for the browser, the same origin as the server, so it may read every
  answer (the status document, ``/metrics``). Its requests carry ``Host: evil.example:8000``
  all the same: the ``Host`` is checked against the names the server answers to
  (``--allowed-hosts``; by default the loopback names when bound to loopback, any name
  otherwise). Another is answered 421, naming it. The health checks are not held to it:
  they hold no data, and probes name the server by whatever address they reach it at.
- **Cross-site requests**: a page on another site cannot read the answers (corral sends no
  CORS headers, and answers the CORS preflight 405), but a *simple* request (a form, or a
  ``fetch`` without custom headers) reaches the server all the same, and a POST changes
  state or costs CPU (a load, an unload, a shared-memory region, an inference). Every
  browser sends ``Origin`` on a cross-origin POST: a POST whose ``Origin`` is not the
  server's own (``http://`` or ``https://`` and the ``Host`` it was sent to; ``null``
  included) is answered 403, naming it.

What clients of the protocol send, so that nothing refused here is what they send: tritonclient
(HTTP) sends no ``Content-Type``, its asyncio client ``application/octet-stream``; KServe's
REST client none for JSON, ``application/octet-stream`` for the binary extension;
``requests``' ``json=`` ``application/json``; ``curl -d`` ``application/x-www-form-urlencoded``
and ``curl -F`` ``multipart/form-data``. None sends ``Origin``. So, on a POST:

- ``Content-Type: text/plain`` is answered 415: it is the one type a browser's form can shape
  into a JSON body (``enctype="text/plain"``), and older browsers send such a form without
  ``Origin``;
- the other two types a browser sends without a preflight, ``application/x-www-form-urlencoded``
  and ``multipart/form-data``, are answered 415 only on a browser's request (one with
  ``Origin``, ``Referer`` or ``Sec-Fetch-Site``): ``curl -d`` sends the first.

Example::

    sites = SitePolicy.for_address("127.0.0.1", None)   # loopback names only
    sites.check_post(headers)   # HttpError 421, 403 or 415 naming what was refused
"""

from __future__ import annotations

import ipaddress
from collections.abc import Iterable

from corral.server.http.responses import HttpError

__all__ = ["ANY_HOST", "LOOPBACK_NAMES", "SitePolicy", "host_name", "is_loopback"]

#: The names a server bound to loopback answers to by default (with any port).
LOOPBACK_NAMES = ("localhost", "127.0.0.1", "::1")
#: ``--allowed-hosts`` ``*``: any name.
ANY_HOST = "*"

# Host values already found allowed, kept to answer the busiest route without parsing (a
# client sends the same few values); at most this many, so that a flood of names grows nothing.
_KNOWN_HOSTS_KEPT = 64

# A browser's marks on a request: a client of the protocol sends none of them.
_BROWSER_HEADERS = frozenset((b"origin", b"referer", b"sec-fetch-site"))
_FORM_TYPES = frozenset((b"application/x-www-form-urlencoded", b"multipart/form-data"))
_DEFAULT_PORTS = {"http": ":80", "https": ":443"}


def is_loopback(address: str) -> bool:
    """Whether a bind address is loopback only (``127.0.0.0/8``, ``::1``, ``localhost``)."""
    if address.lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(address.strip("[]")).is_loopback
    except ValueError:
        return False


def host_name(value: str) -> str | None:
    """The name in a ``Host`` header's value or an allow-list entry, lowercase, without its port.

    ``[::1]:8000`` and ``::1`` give ``::1``; None if the value is no host name at all.
    """
    value = value.strip().lower()
    if value.startswith("["):
        end = value.find("]")
        rest = value[end + 1 :]
        if end < 0 or (rest and not _is_port(rest)):
            return None
        name = value[1:end]
    elif value.count(":") > 1:
        name = value  # a bare IPv6 address, as an allow-list may write it
    else:
        name, colon, port = value.partition(":")
        if colon and not _is_port(":" + port):
            return None
    if not name or any(c in name for c in " /\\@?#[]") or any(ord(c) < 33 for c in name):
        return None
    return name


def _is_port(text: str) -> bool:
    return len(text) > 1 and text[0] == ":" and text[1:].isascii() and text[1:].isdigit()


class SitePolicy:
    """The ``Host`` names a server answers to, and the checks on its POST requests.

    ``allowed_hosts``: names (``localhost``, ``10.0.0.5``, ``[::1]``), ``*.example.com`` for a
    name and its subdomains, or ``*`` for any name; None: any name. Ports are not compared.
    """

    def __init__(self, allowed_hosts: Iterable[str] | None) -> None:
        names: set[str] = set()
        suffixes: list[str] = []
        self._any = allowed_hosts is None
        for entry in allowed_hosts or ():
            if entry.strip() == ANY_HOST:
                self._any = True
            elif entry.strip().startswith("*."):
                suffixes.append(entry.strip().lower()[1:])  # ".example.com"
            else:
                name = host_name(entry)
                if name is None:
                    raise ValueError(f"allowed_hosts: {entry!r} is not a host name")
                names.add(name)
        self._names = frozenset(names)
        self._suffixes = tuple(suffixes)
        # Raw Host values found allowed (no lock: a set's add and lookup are atomic under the
        # GIL, and on a free-threaded build, which locks each set; a value added twice or
        # missed is only parsed again).
        self._known: set[bytes] = set()
        #: The names, as an error message lists them.
        self.described = ", ".join([*sorted(names), *(f"*{s}" for s in suffixes)]) or "none"

    @classmethod
    def for_address(cls, bind: str, allowed_hosts: Iterable[str] | None) -> SitePolicy:
        """The policy of a server bound to ``bind``: ``allowed_hosts``, else its default.

        The default: :data:`LOOPBACK_NAMES` and ``bind`` itself when it is a loopback
        address (``127.0.0.2``, say), else any name.
        """
        if allowed_hosts is None and is_loopback(bind):
            allowed_hosts = (*LOOPBACK_NAMES, bind)
        return cls(allowed_hosts)

    @property
    def any_host(self) -> bool:
        """Whether every ``Host`` is answered."""
        return self._any

    @property
    def entries(self) -> list[str] | None:
        """The names answered, as an allow-list writes them (``*.x`` for suffixes); None: any."""
        if self._any:
            return None
        return [*sorted(self._names), *(f"*{suffix}" for suffix in self._suffixes)]

    def allows(self, host: str) -> bool:
        """Whether a ``Host`` header's value names the server."""
        if self._any:
            return True
        name = host_name(host)
        if name is None:
            return False
        return name in self._names or any(
            name.endswith(suffix) or name == suffix[1:] for suffix in self._suffixes
        )

    def check_host(self, headers: list[tuple[bytes, bytes]]) -> None:
        """Raise :class:`HttpError` 421 if a ``Host`` header names another server.

        A request without ``Host`` (HTTP/1.0, say) comes from no browser: it is answered.
        ``headers`` are the request's, names lowercase.
        """
        if self._any:
            return
        for key, value in headers:
            if key == b"host":
                self._check_one_host(value)

    def check_post(self, headers: list[tuple[bytes, bytes]]) -> None:
        """Check a POST: its ``Host`` (:meth:`check_host`), ``Origin`` and ``Content-Type``.

        Raises :class:`HttpError`: 421 for another server's ``Host``, 403 for an ``Origin``
        other than the server's own, 415 for a type a browser sends without asking (see the
        module's doc). One pass over the headers: the busiest route pays it.
        """
        host: bytes | None = None
        origin: bytes | None = None
        content_type: bytes | None = None
        browser = False
        for key, value in headers:
            if key == b"host":
                host = value
                if not self._any:
                    self._check_one_host(value)
            elif key == b"content-type":
                content_type = value
            elif key in _BROWSER_HEADERS:
                browser = True
                if key == b"origin":
                    origin = value
        if origin is not None and not _same_origin(origin, host):
            shown = origin.decode("latin-1")
            raise HttpError(
                403,
                f"a request from the web page at {shown!r} (its Origin header) is refused: "
                "this server takes POST requests only from its own pages and from clients "
                "that are not browsers",
            )
        if content_type is not None:
            media = content_type.split(b";", 1)[0].strip().lower()
            if media == b"text/plain" or (browser and media in _FORM_TYPES):
                raise HttpError(
                    415,
                    f"Content-Type {media.decode('latin-1')} is not read here: send "
                    "application/json (or application/octet-stream with the binary "
                    "tensor extension), or no Content-Type",
                )

    def _check_one_host(self, value: bytes) -> None:
        if value in self._known:
            return
        host = value.decode("latin-1")
        if self.allows(host):
            if len(self._known) < _KNOWN_HOSTS_KEPT:
                self._known.add(value)
        else:
            raise HttpError(
                421,
                f"this server does not answer to the name {host!r} (its Host header); "
                f"it answers to {self.described} (allowed_hosts)",
            )


def _same_origin(origin: bytes, host: bytes | None) -> bool:
    # The server's own origin: http:// or https:// (a proxy may end TLS) and its Host.
    if host is None:
        return False
    text = origin.decode("latin-1").strip().lower()
    scheme, sep, authority = text.partition("://")
    default_port = _DEFAULT_PORTS.get(scheme)
    if not sep or default_port is None or not authority:
        return False  # "null", or no URL of a web page
    own = host.decode("latin-1").strip().lower()
    return authority.removesuffix(default_port) == own.removesuffix(default_port)
