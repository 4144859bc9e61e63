"""onnxruntime-web in headless Chromium (Days 27-28): the ONNX model run inside a real page.

load() serves web/runtime.html and the ONNX file on 127.0.0.1 (breakout_core.browser.server),
opens it in headless Chromium through Playwright and creates an onnxruntime-web session on
the requested provider, `wasm` or `webgpu`, and no other. infer() sends the states to the
page (base64 uint8) and reads back the Q-values the page computed; timed_runs() times
session.run inside the page with performance.now() (model load and the transfer from
Python excluded), the way a page would see its own latency.

describe() carries what the page read back: the provider that ran (for WebGPU, the
number of GPU kernels in a probe run, from onnxruntime-web's profiling), the WebGPU
adapter's vendor/architecture/description (SwiftShader is a CPU software adapter, flagged
`software`), the browser version, whether the page is cross-origin isolated, the WASM
thread count and performance.now()'s resolution.
"""

from __future__ import annotations

import base64
from dataclasses import fields
from pathlib import Path
from typing import Any

import numpy as np

from breakout_core.runtimes.actual import ActualRun
from breakout_core.runtimes.base import Option, Runtime, RuntimeUnavailable, installed_version

PAGE = "/runtime.html"
MODEL_ROUTE = "/artifact/model.onnx"
ACTUAL_FIELDS = {f.name for f in fields(ActualRun)}  # the page's keys that ActualRun's fields hold
PAGE_TIMEOUT_MS = 120_000  # model load and a WebGPU pipeline compile on SwiftShader take seconds


class BrowserRuntime(Runtime):
    name = "browser"
    artifact_types = ("onnx",)
    CALL_TIMER = "performance.now() around session.run in the page"
    OPTIONS = {
        "provider": Option("wasm", ("wasm", "webgpu"), description="onnxruntime-web execution provider"),
        "num_threads": Option(None, value_type=int, minimum=1, description="WASM threads (ort.env.wasm.numThreads); "
                              "None: onnxruntime-web's default"),
        "webgpu_adapter": Option("swiftshader", ("swiftshader", "default"), description="Chromium's WebGPU adapter: "
                                 "SwiftShader (software, on the CPU) or whatever Chromium picks"),
    }

    @classmethod
    def needs(cls, options: dict[str, Any]) -> frozenset[str]:
        """Chromium; and the machine's GPU where WebGPU takes Chromium's own adapter rather than
        SwiftShader, the software one."""
        hardware = options.get("provider") == "webgpu" and options.get("webgpu_adapter") == "default"
        return frozenset({"browser", "gpu"} if hardware else {"browser"})

    @classmethod
    def _available(cls, options: dict[str, Any]) -> tuple[bool, str]:
        from breakout_core.browser.chromium import browser_missing
        from breakout_core.browser.server import web_files_missing

        reason = browser_missing() or web_files_missing()
        try:
            import aiohttp  # noqa: F401
        except Exception as exc:
            reason = reason or f"aiohttp cannot be imported ({type(exc).__name__}: {exc})"
        return (not reason), reason

    def _load(self, path: Path) -> None:
        from breakout_core.browser import chromium
        from breakout_core.browser.server import PageServer

        self._server = PageServer(files={MODEL_ROUTE: path}).start()
        adapter = self.requested["webgpu_adapter"] if self.requested["provider"] == "webgpu" else None
        try:
            self._browser = chromium.launch(adapter)
        except BaseException:
            self._server.stop()
            raise
        try:
            self._page = self._browser.new_page()
            self._page.set_default_timeout(PAGE_TIMEOUT_MS)
            self._page.goto(self._server.url(PAGE))
            self._page.wait_for_function("window.breakoutRuntimeReady === true")
            result = self._page.evaluate(
                "([url, provider, threads]) => window.breakoutRuntime.load(url, provider, threads)",
                [MODEL_ROUTE, self.requested["provider"], self.requested["num_threads"]])
            if "info" not in result:
                if result.get("unavailable"):
                    raise RuntimeUnavailable(self.name, f"{self.requested['provider']} in Chromium "
                                             f"{self._browser.version}: {result['error']}")
                raise ValueError(f"{path}: onnxruntime-web cannot load this model: {result['error']}")
            self._page_info = result["info"]
            self._browser_version = self._browser.version
        except BaseException:
            self._close()
            raise

    def _infer(self, obs: np.ndarray) -> np.ndarray:
        q = self._page.evaluate("([data, batch]) => window.breakoutRuntime.qValues(data, batch)",
                                [base64.b64encode(obs.tobytes()).decode("ascii"), obs.shape[0]])
        return np.asarray(q, dtype=np.float32).reshape(obs.shape[0], -1)

    def timed_infer(self, obs: np.ndarray) -> tuple[np.ndarray, float]:
        """Q-values, and session.run's time by the page's performance.now() (the transfer from
        Python and the decoding excluded), as the page's own game loop would see it."""
        obs = self.checked_obs(obs)
        found = self._page.evaluate("([data, batch]) => window.breakoutRuntime.timedQValues(data, batch)",
                                    [base64.b64encode(obs.tobytes()).decode("ascii"), obs.shape[0]])
        return np.asarray(found["q"], dtype=np.float32).reshape(obs.shape[0], -1), found["ms"] / 1000.0

    def timed_runs(self, obs: np.ndarray, warmup: int, iterations: int):
        """In-page latency: session.run timed with performance.now(), its resolution recorded."""
        from breakout_core.diagnosis.latency import latency_result

        if not self._loaded:
            raise RuntimeError(f"runtime {self.name!r}: load() an artifact before timing it")
        samples = self._page.evaluate(
            "([data, batch, warmup, iterations]) => window.breakoutRuntime.timedRuns(data, batch, warmup, iterations)",
            [base64.b64encode(np.ascontiguousarray(obs).tobytes()).decode("ascii"), obs.shape[0], warmup, iterations])
        return latency_result(np.asarray(samples, dtype=np.float64), warmup=warmup,
                              timer="performance.now() in the page",
                              timer_resolution_s=float(self._page_info["timer_resolution_ms"]) / 1000.0)

    def _actual(self) -> ActualRun:
        details = {key: value for key, value in self._page_info.items() if key not in ACTUAL_FIELDS}
        # the page counts the nodes off the requested provider; it cannot name them
        details["nodes_off_requested_provider_count"] = self._page_info.get("nodes_not_on_requested_provider")
        adapter = details.get("adapter")
        software = bool(adapter and adapter.get("software"))
        return ActualRun(
            device=("webgpu software adapter (SwiftShader, runs on the CPU)" if software
                    else f"webgpu adapter {adapter}" if adapter else "cpu (WebAssembly)"),
            precision="fp32",
            provider=self._page_info["actual_provider"],
            software_device=software,
            nodes_by_provider=self._page_info.get("nodes_by_provider"),
            details={**details, "browser_version": self._browser_version},
        )

    def _versions(self) -> dict[str, str]:
        from breakout_core.browser.server import ort_web_version

        versions = {"numpy": np.__version__}
        for name, version in (("playwright", installed_version("playwright")), ("onnxruntime-web", ort_web_version())):
            if version:
                versions[name] = version
        if getattr(self, "_browser_version", None):
            versions["chromium"] = self._browser_version
        return versions

    def _close(self) -> None:
        from breakout_core.browser import chromium

        browser, server = getattr(self, "_browser", None), getattr(self, "_server", None)
        self._browser = self._server = self._page = None
        try:
            if browser is not None:
                browser.close()
                chromium.release()
        finally:
            if server is not None:
                server.stop()
