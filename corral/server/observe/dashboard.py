"""The status page's files: a small HTML/CSS/JS bundle shipped in ``corral/server/observe/static/``.

No build step and nothing from a CDN: the page is three files of corral's own, read once when
the server starts and answered from memory. Every answer carries a strict
Content-Security-Policy (scripts and styles from the server only, nothing inline, no frames)
so that the page can show names and error texts from a repository without any of them ever
running as code. The page holds no data: it fetches ``/v2/corral/status`` with the token the
operator types in, which is why these files are served without one.

Example::

    files = DashboardFiles.load()
    body, headers = files.answer("/dashboard")
"""

from __future__ import annotations

from dataclasses import dataclass
from importlib import resources

__all__ = ["CONTENT_SECURITY_POLICY", "PAGE_PATHS", "DashboardFiles"]

#: The paths that answer the page itself.
PAGE_PATHS = ("/", "/dashboard")

#: Sent with every file of the page.
CONTENT_SECURITY_POLICY = (
    "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self'; "
    "connect-src 'self'; object-src 'none'; base-uri 'none'; form-action 'none'; "
    "frame-ancestors 'none'"
)

# The bundle's files, by the path they are served at, with their content types.
_ASSETS = {
    "/static/dashboard.js": ("dashboard.js", "text/javascript; charset=utf-8"),
    "/static/dashboard.css": ("dashboard.css", "text/css; charset=utf-8"),
}
_PAGE = ("index.html", "text/html; charset=utf-8")

Headers = tuple[tuple[bytes, bytes], ...]


@dataclass(frozen=True)
class DashboardFiles:
    """The bundle in memory: each path's body and headers."""

    files: dict[str, tuple[bytes, Headers]]

    @classmethod
    def load(cls) -> DashboardFiles:
        """Read the bundle from the installed package."""
        folder = resources.files("corral.server.observe").joinpath("static")
        files: dict[str, tuple[bytes, Headers]] = {}
        page = folder.joinpath(_PAGE[0]).read_bytes()
        for path in PAGE_PATHS:
            # The page names its assets by path; revalidated each time, so an upgrade shows.
            files[path] = (page, _headers(_PAGE[1], "no-cache"))
        for path, (name, content_type) in _ASSETS.items():
            body = folder.joinpath(name).read_bytes()
            files[path] = (body, _headers(content_type, "public, max-age=300"))
        return cls(files)

    def answer(self, path: str) -> tuple[bytes, Headers] | None:
        """The body and headers for ``path``; None if the bundle has no such file."""
        return self.files.get(path)


def _headers(content_type: str, cache: str) -> Headers:
    return (
        (b"content-type", content_type.encode()),
        (b"cache-control", cache.encode()),
        (b"content-security-policy", CONTENT_SECURITY_POLICY.encode()),
        (b"x-content-type-options", b"nosniff"),
        (b"referrer-policy", b"no-referrer"),
    )
