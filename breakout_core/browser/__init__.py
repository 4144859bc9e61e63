"""The browser side: a local page server and headless Chromium driven through Playwright.

Nothing here is imported by `breakout_core` at import time: aiohttp and playwright are
imported when a page is served or a browser launched, so a machine without them can still
list the `browser` runtime and say why it cannot run.
"""
