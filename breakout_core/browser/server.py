"""A local HTTP (and WebSocket) server for the project's pages, on 127.0.0.1 only.

It serves the `web/` folder (the pages and onnxruntime-web from its node_modules, installed
by `npm ci --prefix web`), named files such as the ONNX model under `/artifact/...`, and any
GET routes the caller adds (aiohttp handlers: JSON endpoints, WebSockets). Every response carries COOP/COEP headers so the page is
cross-origin isolated: SharedArrayBuffer, hence multi-threaded WASM, needs it, and
isolated pages get a finer performance.now().

aiohttp runs on its own event loop in a daemon thread, so synchronous callers (the runtime,
the CLI) simply start() and stop() it.
"""

from __future__ import annotations

import asyncio
import threading
from pathlib import Path
from typing import Any, Awaitable, Callable

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

    def _app(self):
        from aiohttp import web

        @web.middleware
        async def isolation(request, handler):
            response = await handler(request)
            if not isinstance(response, web.WebSocketResponse):
                response.headers.update(ISOLATION_HEADERS)
            return response

        app = web.Application(middlewares=[isolation])
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

    def start(self) -> "PageServer":
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

    def __enter__(self) -> "PageServer":
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
