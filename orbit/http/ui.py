"""The web console, served at ``/ui`` (docs/ui.md).

The console is a static single-page application (plain JavaScript modules, no build step)
that calls the JSON API (``/v1``) from the browser with the operator's API key. This module
only serves its files; it reads no key, opens no database connection and renders no data.

| path | answer |
| --- | --- |
| ``/ui`` | redirect to ``/ui/`` (Starlette's slash redirect) |
| ``/ui/`` (and any ``/ui/<view>`` deep link) | the HTML shell, ``Cache-Control: no-cache`` |
| ``/ui/assets/<build>/<file>`` | a static file; ``<build>`` is a hash of every asset, so the answer is ``immutable`` for a year; another build answers 404 |

Every answer carries a strict Content-Security-Policy (:data:`CSP`): scripts and styles only
from this origin (no inline code), API calls only to this origin, no frames, no plugins, and
Trusted Types enforced, so a string can never reach ``innerHTML`` or another HTML sink even
by mistake. Plus ``X-Content-Type-Options: nosniff``, ``Referrer-Policy: no-referrer``,
``X-Frame-Options: DENY`` and ``Cross-Origin-Opener-Policy: same-origin``.

The routes are one :class:`~starlette.routing.Mount` around a small ASGI app, so they stay out
of ``/openapi.json`` (which documents the API only). Mount them with the other packages'
routes: the composition root lists ``routes()`` in ``routes(node)`` (``cmd/orbit_cmd/server.py``).
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from functools import cache
from pathlib import Path

from starlette._utils import get_route_path
from starlette.datastructures import Headers
from starlette.responses import Response
from starlette.routing import BaseRoute, Mount
from starlette.types import Receive, Scope, Send

#: Where the console's files live (shipped as package data next to this module).
STATIC_DIR = Path(__file__).with_name("ui_static")

#: URL prefix of the console.
PREFIX = "/ui"

#: Placeholder in ``index.html`` replaced by the versioned asset base URL.
ASSET_BASE_MARK = "{{ASSET_BASE}}"

#: Content types by file suffix; files with other suffixes are not served.
CONTENT_TYPES: dict[str, str] = {
    ".html": "text/html; charset=utf-8",
    ".js": "text/javascript; charset=utf-8",
    ".css": "text/css; charset=utf-8",
    ".svg": "image/svg+xml",
}

#: The console's Content-Security-Policy. ``connect-src 'self'``: the browser talks only to
#: the server that served the console. ``require-trusted-types-for 'script'`` with
#: ``trusted-types 'none'``: no string ever reaches an HTML/script sink.
CSP = "; ".join(
    (
        "default-src 'none'",
        "script-src 'self'",
        "style-src 'self'",
        "img-src 'self'",
        "connect-src 'self'",
        "base-uri 'none'",
        "form-action 'none'",
        "frame-ancestors 'none'",
        "require-trusted-types-for 'script'",
        "trusted-types 'none'",
    )
)

SECURITY_HEADERS: dict[str, str] = {
    "Content-Security-Policy": CSP,
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "X-Frame-Options": "DENY",
    "Cross-Origin-Opener-Policy": "same-origin",
    "Cross-Origin-Resource-Policy": "same-origin",
    "Permissions-Policy": "camera=(), microphone=(), geolocation=(), payment=(), usb=()",
}

#: The HTML shell is revalidated on every load (it names the current build).
SHELL_CACHE = "no-cache"
#: Assets live under a build hash: cache them for a year, never revalidate.
ASSET_CACHE = "public, max-age=31536000, immutable"


@dataclass(frozen=True)
class Asset:
    """One static file, in memory."""

    body: bytes
    content_type: str
    etag: str


@dataclass(frozen=True)
class Bundle:
    """Every file of the console, loaded once: the build hash, the shell, the assets."""

    build: str
    shell: Asset
    assets: dict[str, Asset]


def _etag(body: bytes) -> str:
    return '"' + hashlib.sha256(body).hexdigest()[:32] + '"'


def load_bundle(directory: Path = STATIC_DIR) -> Bundle:
    """Read the console's files. The build hash covers every asset (name and bytes), so any
    change to any file gives new asset URLs and old cached copies are never used."""
    files: dict[str, bytes] = {}
    for path in sorted(directory.rglob("*")):
        if path.is_file() and path.suffix in CONTENT_TYPES:
            files[path.relative_to(directory).as_posix()] = path.read_bytes()
    if "index.html" not in files:
        raise FileNotFoundError(f"the console's index.html is missing from {directory}")
    h = hashlib.sha256()
    for name, body in files.items():
        h.update(name.encode() + b"\0" + hashlib.sha256(body).digest())
    build = h.hexdigest()[:16]
    base = f"{PREFIX}/assets/{build}/"
    shell_body = files.pop("index.html").replace(ASSET_BASE_MARK.encode(), base.encode())
    assets = {
        name: Asset(body, CONTENT_TYPES[Path(name).suffix], _etag(body))
        for name, body in files.items()
    }
    return Bundle(build, Asset(shell_body, CONTENT_TYPES[".html"], _etag(shell_body)), assets)


@cache
def bundle() -> Bundle:
    """The bundle of :data:`STATIC_DIR`, read on first use."""
    return load_bundle()


def _response(status: int, body: bytes, content_type: str, cache_control: str) -> Response:
    headers = {**SECURITY_HEADERS, "Cache-Control": cache_control}
    return Response(body, status_code=status, headers=headers, media_type=content_type)


def _not_found() -> Response:
    return _response(404, b"not found\n", "text/plain; charset=utf-8", "no-store")


def _serve(asset: Asset, cache_control: str, request_headers: Headers, head: bool) -> Response:
    if request_headers.get("if-none-match") == asset.etag:
        response = _response(304, b"", asset.content_type, cache_control)
    else:
        response = _response(200, b"" if head else asset.body, asset.content_type, cache_control)
        if head:
            response.headers["Content-Length"] = str(len(asset.body))
    response.headers["ETag"] = asset.etag
    return response


class ConsoleApp:
    """ASGI app mounted at :data:`PREFIX`: the shell for page paths, files under assets."""

    def __init__(self, source: Bundle | None = None) -> None:
        self._source = source

    @property
    def files(self) -> Bundle:
        return self._source or bundle()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return  # no WebSocket under /ui: the server closes the handshake
        method = scope["method"]
        if method not in ("GET", "HEAD"):
            response = _response(405, b"method not allowed\n", "text/plain", "no-store")
            response.headers["Allow"] = "GET, HEAD"
        else:
            response = self._resolve(get_route_path(scope), Headers(scope=scope), method == "HEAD")
        await response(scope, receive, send)

    def _resolve(self, path: str, headers: Headers, head: bool) -> Response:
        files = self.files
        rest = path[len(PREFIX) :] if path.startswith(PREFIX + "/") else path
        if rest.startswith("/assets/"):
            parts = rest.split("/", 3)  # "", "assets", build, name
            if len(parts) != 4 or parts[2] != files.build:
                return _not_found()
            asset = files.assets.get(parts[3])
            return _not_found() if asset is None else _serve(asset, ASSET_CACHE, headers, head)
        # Any other path is a page of the single-page app: the shell routes it in the browser.
        if "." in rest.rsplit("/", 1)[-1]:
            return _not_found()  # a file name that is not an asset
        return _serve(files.shell, SHELL_CACHE, headers, head)


def routes() -> list[BaseRoute]:
    """The console's routes (mount at the application root)."""
    return [Mount(PREFIX, app=ConsoleApp(), name="ui")]


__all__ = ["CSP", "PREFIX", "SECURITY_HEADERS", "ConsoleApp", "load_bundle", "routes"]
