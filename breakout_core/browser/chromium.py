"""Headless Chromium through Playwright, using the system's Chromium (Debian's `chromium`).

Playwright's own browser downloads are never used: the executable is $BREAKOUT_CHROMIUM, or
`chromium` / `chromium-browser` on PATH. One Playwright driver is shared by every browser
this process opens (the sync API allows one per thread), started on first use and
stopped when the last browser closes.

WebGPU: `--enable-unsafe-webgpu` exposes it in headless Linux Chromium; with
adapter="swiftshader" Chromium's software Vulkan adapter (SwiftShader) is used, which works
without a GPU. The page records the adapter's own description, so a software adapter is
never reported as a GPU.
"""

from __future__ import annotations

import os
import shutil
import threading
from typing import Any

CHROMIUM_ENV = "BREAKOUT_CHROMIUM"
WEBGPU_ARGS = {
    "swiftshader": ["--enable-unsafe-webgpu", "--enable-features=Vulkan", "--use-webgpu-adapter=swiftshader"],
    "default": ["--enable-unsafe-webgpu", "--enable-features=Vulkan"],
}

_lock = threading.Lock()
_driver: dict[str, Any] = {"playwright": None, "users": 0}


def chromium_executable() -> str | None:
    configured = os.environ.get(CHROMIUM_ENV)
    if configured:
        return configured if os.access(configured, os.X_OK) else None
    return shutil.which("chromium") or shutil.which("chromium-browser")


def browser_missing() -> str:
    """'' when Playwright and a Chromium executable are here, else the reason."""
    try:
        import playwright.sync_api  # noqa: F401
    except Exception as exc:
        return f"playwright cannot be imported ({type(exc).__name__}: {exc})"
    if chromium_executable() is None:
        where = os.environ.get(CHROMIUM_ENV)
        if where:
            return f"${CHROMIUM_ENV}={where} is not an executable file"
        return "no Chromium on PATH (`chromium` or `chromium-browser`; Debian: apt-get install chromium)"
    return ""


def launch(webgpu_adapter: str | None = None):
    """A headless Chromium (Playwright Browser); webgpu_adapter: None, 'swiftshader' or 'default'."""
    args = list(WEBGPU_ARGS[webgpu_adapter]) if webgpu_adapter else []
    with _lock:
        if _driver["playwright"] is None:
            from playwright.sync_api import sync_playwright

            _driver["playwright"] = sync_playwright().start()
        _driver["users"] += 1
    try:
        return _driver["playwright"].chromium.launch(executable_path=chromium_executable(), headless=True, args=args)
    except BaseException:
        release()
        raise


def release() -> None:
    """Called once per launch() after its browser is closed; the last one stops the driver."""
    with _lock:
        _driver["users"] -= 1
        if _driver["users"] <= 0 and _driver["playwright"] is not None:
            _driver["playwright"].stop()
            _driver["playwright"], _driver["users"] = None, 0
