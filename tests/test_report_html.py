"""The report pages' inlined Vega script: bundled once per vl-convert version, then read from the cache."""

from __future__ import annotations

import vl_convert

from runner.report_html import vega_bundle


def test_the_vega_bundle_is_cached_per_vl_convert_version_and_made_where_no_cache_can_be(tmp_path, monkeypatch):
    blocked = tmp_path / "not-a-folder"
    blocked.write_text("")
    monkeypatch.setenv("XDG_CACHE_HOME", str(blocked))
    vega_bundle.cache_clear()
    bundle = vega_bundle()  # the cache folder cannot be made: bundled all the same
    assert "vegaEmbed" in bundle and blocked.read_text() == ""

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    vega_bundle.cache_clear()
    assert vega_bundle() == bundle
    (cached,) = (tmp_path / "cache" / "breakout-runner").iterdir()
    assert cached.name == f"vega-bundle-vl-convert-{vl_convert.__version__}.js"
    cached.write_text("// what a later report inlines")
    vega_bundle.cache_clear()
    assert vega_bundle() == "// what a later report inlines"
    vega_bundle.cache_clear()
