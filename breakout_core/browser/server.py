"""A local HTTP (and WebSocket) server for the project's pages, on 127.0.0.1 only.

It serves the `web/` folder (the pages and onnxruntime-web from its node_modules, installed
by `npm ci --prefix web`), named files such as the ONNX model under `/artifact/...`, and any
GET routes the caller adds (aiohttp handlers: JSON endpoints, WebSockets). Every response carries
COOP/COEP headers so the page is cross-origin isolated: SharedArrayBuffer, hence multi-threaded WASM, needs it, and
isolated pages get a finer performance.now().

It answers only its own pages. Listening on 127.0.0.1 keeps other machines out, not other
web sites: a page from anywhere, open in the same browser, may send requests here and open
WebSockets (browsers do not hold WebSockets to the same-origin policy), and a site whose
name resolves to 127.0.0.1 (DNS rebinding) is even same-origin with it. So every request
must name this server in `Host` (127.0.0.1:PORT or localhost:PORT), an `Origin`, where there
is one, must be this server's, and a WebSocket upgrade must carry one (browsers always
send it); anything else gets 403.

aiohttp runs on its own event loop in a daemon thread, so synchronous callers (the runtime,
the CLI) simply start() and stop() it.
"""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import Awaitable, Callable, Mapping
from pathlib import Path
from typing import Any, Self

WEB_ROOT = Path(__file__).resolve().parents[2] / "web"
ORT_WEB_DIST = WEB_ROOT / "node_modules" / "onnxruntime-web" / "dist"
ORT_WEB_BUNDLE = ORT_WEB_DIST / "ort.webgpu.min.mjs"
ISOLATION_HEADERS = {
    "Cross-Origin-Opener-Policy": "same-origin",
    "Cross-Origin-Embedder-Policy": "require-corp",
    "Cross-Origin-Resource-Policy": "same-origin",
    "Cache-Control": "no-store",
}


def web_files_missing() -> str:
    """'' when the pages and onnxruntime-web are in place, else what is missing and how to get it."""
    if not WEB_ROOT.is_dir():
        return f"the web folder {WEB_ROOT} is missing"
    if not ORT_WEB_BUNDLE.is_file():
        return (f"onnxruntime-web is not installed ({ORT_WEB_BUNDLE} is missing); "
                f"run `npm ci --prefix {WEB_ROOT}`")
    return ""


def ort_web_version() -> str | None:
    import json

    package = WEB_ROOT / "node_modules" / "onnxruntime-web" / "package.json"
    try:
        return json.loads(package.read_text())["version"]
    except (OSError, ValueError, KeyError):
        return None


log = logging.getLogger(__name__)

Handler = Callable[[Any], Awaitable[Any]]  # aiohttp: async def handler(request) -> Response


class PageServer:
    """Serves web/, named files and GET routes on 127.0.0.1 (port 0: any free port)."""

    def __init__(self, files: dict[str, Path] | None = None, routes: dict[str, Handler] | None = None,
                 host: str = "127.0.0.1", port: int = 0):
        self.files = {route: Path(path) for route, path in (files or {}).items()}
        self.routes = dict(routes or {})
        self.host, self.port = host, port
        self.loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._runner = None

    def _refusal(self, headers: Mapping[str, str]) -> str | None:
        """None when a request comes from this server's own pages, else why not, in one line."""
        hosts = (f"{self.host}:{self.port}", f"localhost:{self.port}")
        origins = tuple(f"http://{host}" for host in hosts)
        host, origin = headers.get("Host"), headers.get("Origin")
        if host is None or host.lower() not in hosts:
            return f"Host {host!r} is not this server ({' or '.join(hosts)})"
        if origin is None and headers.get("Upgrade", "").lower() == "websocket":
            return f"a WebSocket upgrade without Origin (send this server's: {origins[0]})"
        if origin is not None and origin not in origins:
            return f"Origin {origin!r} is not this server's page ({' or '.join(origins)})"
        return None

    def _app(self):
        from aiohttp import web

        @web.middleware
        async def own_pages_only(request, handler):
            refused = self._refusal(request.headers)
            if refused is not None:
                log.warning("refused %r: %s", request.path, refused)
                return web.Response(status=403, text=f"refused: {refused}\n")
            response = await handler(request)
            if not isinstance(response, web.WebSocketResponse):
                response.headers.update(ISOLATION_HEADERS)
            return response

        app = web.Application(middlewares=[own_pages_only])

        def file_route(path: Path):
            async def serve_file(request):
                return web.FileResponse(path)
            return serve_file

        for route, path in self.files.items():
            app.router.add_get(route, file_route(path))
        for route, handler in self.routes.items():
            app.router.add_get(route, handler)
        app.router.add_static("/", WEB_ROOT, follow_symlinks=False)
        return app

    def start(self) -> Self:
        from aiohttp import web

        started = threading.Event()
        failure: list[BaseException] = []

        async def serve() -> None:
            self._runner = web.AppRunner(self._app(), access_log=None)
            await self._runner.setup()
            site = web.TCPSite(self._runner, self.host, self.port)
            await site.start()
            self.port = self._runner.addresses[0][1]

        def run() -> None:
            self.loop = asyncio.new_event_loop()
            try:
                self.loop.run_until_complete(serve())
            except BaseException as exc:  # reported to start()'s caller
                failure.append(exc)
                started.set()
                return
            started.set()
            self.loop.run_forever()
            self.loop.run_until_complete(self._runner.cleanup())
            self.loop.close()

        self._thread = threading.Thread(target=run, name="page-server", daemon=True)
        self._thread.start()
        started.wait(timeout=30)
        if failure:
            raise OSError(f"cannot serve pages on {self.host}:{self.port}: {failure[0]}")
        return self

    def url(self, path: str = "/") -> str:
        return f"http://{self.host}:{self.port}{path}"

    def stop(self) -> None:
        if self.loop is not None and self._thread is not None:
            self.loop.call_soon_threadsafe(self.loop.stop)
            self._thread.join(timeout=10)
        self.loop = self._thread = None

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
