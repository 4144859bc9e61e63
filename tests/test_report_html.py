"""The report pages' inlined Vega script: bundled once per vl-convert version, then read from the cache."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest
import vl_convert

from runner.report import html as report_html
from runner.report.html import cache_folder, vega_bundle


@pytest.fixture
def fresh_bundle():
    vega_bundle.cache_clear()
    yield
    vega_bundle.cache_clear()


def test_the_vega_bundle_is_cached_checked_and_made_afresh_where_the_cache_fails(tmp_path, monkeypatch, fresh_bundle):
    blocked = tmp_path / "not-a-folder"
    blocked.write_text("")
    monkeypatch.setenv("XDG_CACHE_HOME", str(blocked))
    bundle = vega_bundle()  # the cache folder cannot be made: bundled all the same, nothing left behind
    assert "vegaEmbed" in bundle and blocked.read_text() == ""

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    vega_bundle.cache_clear()
    assert vega_bundle() == bundle
    (cached,) = (tmp_path / "cache" / "breakout-runner").iterdir()
    assert cached.name == f"vega-bundle-vl-convert-{vl_convert.__version__}.js"

    other = "// what a later report inlines: π ≥ 3"
    cached.write_text(f"// sha256 {hashlib.sha256(other.encode()).hexdigest()}\n{other}", encoding="utf-8")
    vega_bundle.cache_clear()
    assert vega_bundle() == other  # read from the cache, not bundled

    cached.write_text(cached.read_text(encoding="utf-8")[:-5], encoding="utf-8")  # cut short
    vega_bundle.cache_clear()
    assert vega_bundle() == bundle
    assert cached.read_text(encoding="utf-8").endswith(bundle)  # and written again whole


def test_the_cache_folder_follows_xdg_and_needs_a_home_otherwise(monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", "/var/cache/someone")
    assert cache_folder() == Path("/var/cache/someone/breakout-runner")
    monkeypatch.setenv("XDG_CACHE_HOME", "relative/cache")  # not absolute: ignored, as the XDG spec says
    monkeypatch.setenv("HOME", "/home/someone")
    assert cache_folder() == Path("/home/someone/.cache/breakout-runner")

    def no_home():
        raise RuntimeError("Could not determine home directory.")

    monkeypatch.setattr(report_html.Path, "home", staticmethod(no_home))
    assert cache_folder() is None
