"""The HTTP plumbing of the bundled sites: a threaded stdlib server on 127.0.0.1 and a page layout.

A site is an object with ``handle(request) -> Response`` and ``reset()``; ``SiteServer`` serves one
site on a free port in a daemon thread. Two routes exist on every site for tests of page errors:
``/slow?seconds=N`` answers after N seconds (at most 30), and any unknown path is a 404 page.
"""

from __future__ import annotations

import contextlib
import html
import threading
import time
import urllib.parse
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Protocol

MAX_SLOW_SECONDS = 30.0


@dataclass(frozen=True)
class Request:
    """A parsed request: ``form`` holds the urlencoded POST body (empty for GET)."""

    method: str
    path: str
    query: dict[str, str]
    form: dict[str, str]


@dataclass
class Response:
    """A response; ``location`` makes it a 303 redirect."""

    status: int = 200
    body: str = ""
    location: str | None = None
    headers: dict[str, str] = field(default_factory=dict)


class Site(Protocol):
    """What ``SiteServer`` serves."""

    name: str

    def handle(self, request: Request) -> Response: ...

    def reset(self) -> None: ...


def esc(text: object) -> str:
    """HTML-escape ``text`` (quotes included)."""
    return html.escape(str(text), quote=True)


def page(site_title: str, title: str, nav: list[tuple[str, str]], body: str) -> str:
    """A complete HTML page: ``<title>`` is "<title> - <site>", a navigation bar, then ``body``."""
    links = "".join(f'<a href="{esc(href)}">{esc(text)}</a> ' for href, text in nav)
    return (
        "<!doctype html><html lang='en'><head><meta charset='utf-8'>"
        f"<title>{esc(title)} - {esc(site_title)}</title>"
        "<style>body{font-family:sans-serif;margin:0;background:#f6f7fb;color:#222}"
        "header{background:#274c77;color:#fff;padding:12px 24px}header a{color:#fff;margin-right:16px}"
        "main{padding:16px 24px;max-width:960px}.card{background:#fff;border:1px solid #dde;border-radius:6px;"
        "padding:10px 14px;margin:8px 0}.price{color:#b5382f;font-weight:bold}button{background:#e07a1f;"
        "color:#fff;border:0;border-radius:4px;padding:6px 12px}</style></head><body>"
        f"<header><strong>{esc(site_title)}</strong> <nav aria-label='Main'>{links}</nav></header>"
        f"<main>{body}</main></body></html>"
    )


def not_found(site_title: str, nav: list[tuple[str, str]], path: str) -> Response:
    """The 404 page of a site."""
    body = f"<h1>404 Not Found</h1><p>There is no page at {esc(path)}.</p>"
    return Response(status=404, body=page(site_title, "404 Not Found", nav, body))


class SiteServer:
    """Serves one ``Site`` on ``127.0.0.1`` at a free port, in a daemon thread, until ``close``."""

    def __init__(self, site: Site, host: str = "127.0.0.1") -> None:
        self.site = site
        self._lock = threading.Lock()  # one request at a time touches the site's state
        self._closing = threading.Event()
        self._httpd = ThreadingHTTPServer((host, 0), self._handler_class())
        self._httpd.daemon_threads = True
        self._thread = threading.Thread(target=self._httpd.serve_forever, name=f"web-site-{site.name}", daemon=True)
        self._thread.start()

    @property
    def base_url(self) -> str:
        """``http://127.0.0.1:<port>`` of this server."""
        host, port = self._httpd.server_address[:2]
        return f"http://{host}:{port}"

    def close(self) -> None:
        """Stop serving, wake slow requests and release the socket."""
        self._closing.set()
        self._httpd.shutdown()
        self._httpd.server_close()
        self._thread.join(timeout=10)

    def _handler_class(self) -> type[BaseHTTPRequestHandler]:
        server = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                self._serve("GET", {})

            def do_POST(self) -> None:
                length = int(self.headers.get("content-length") or 0)
                raw = self.rfile.read(length).decode("utf-8", "replace")
                self._serve("POST", dict(urllib.parse.parse_qsl(raw, keep_blank_values=True)))

            def _serve(self, method: str, form: dict[str, str]) -> None:
                parts = urllib.parse.urlsplit(self.path)
                query = dict(urllib.parse.parse_qsl(parts.query, keep_blank_values=True))
                request = Request(method=method, path=parts.path or "/", query=query, form=form)
                if request.path == "/slow":
                    response = server._slow(request)
                else:
                    with server._lock:
                        response = server.site.handle(request)
                # A browser that navigated away mid-response has closed the socket: nobody to answer.
                with contextlib.suppress(BrokenPipeError, ConnectionResetError):
                    self._send(response)

            def _send(self, response: Response) -> None:
                data = response.body.encode("utf-8")
                self.send_response(303 if response.location else response.status)
                if response.location:
                    self.send_header("Location", response.location)
                self.send_header("Content-Type", "text/html; charset=utf-8")
                self.send_header("Content-Length", str(len(data)))
                for key, value in response.headers.items():
                    self.send_header(key, value)
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, format: str, *args: object) -> None:
                # Browsers fetch a page per step; the default stderr log line per request is noise.
                return

        return Handler

    def _slow(self, request: Request) -> Response:
        try:
            seconds = min(max(float(request.query.get("seconds", "5")), 0.0), MAX_SLOW_SECONDS)
        except ValueError:
            seconds = 5.0
        started = time.monotonic()
        self._closing.wait(seconds)  # returns early when the server closes
        waited = time.monotonic() - started
        body = f"<h1>Slow page</h1><p>This page took {waited:.1f} seconds to answer.</p>"
        return Response(body=page(self.site.name, "Slow page", [("/", "Home")], body))
