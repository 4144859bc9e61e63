"""A self-contained HTML page: Vega-Lite charts with their JavaScript inlined (opens offline)."""

from __future__ import annotations

import hashlib
import html
import json
import numbers
import os
from contextlib import suppress
from functools import lru_cache
from pathlib import Path

from breakout_core.common.files import write_whole
from runner.report.section import Section

MAX_CHART_POINTS = 20_000  # rows a chart embeds; tables and intervals use every row


@lru_cache(maxsize=1)
def altair():
    """Altair with its 5,000-row guard lifted: queries cap chart data at MAX_CHART_POINTS themselves."""
    import altair as alt

    alt.data_transformers.disable_max_rows()
    return alt


@lru_cache(maxsize=1)
def vega_bundle() -> str:
    """vega, vega-lite and vega-embed as one script, from vl-convert's bundled copies.

    Bundling them takes vl-convert ~3 s, about a third of a report over a million rows, so
    the script is kept in a cache folder (`cache_folder`), one file per vl-convert version,
    behind a line with its SHA-256: a file that does not match (cut short, emptied, edited)
    is bundled and written again. Where no cache folder can be written, every report
    bundles the script itself.
    """
    import vl_convert

    folder = cache_folder()
    file = folder / f"vega-bundle-vl-convert-{vl_convert.__version__}.js" if folder else None
    if file is not None:
        with suppress(OSError, UnicodeDecodeError):
            header, _, bundle = file.read_text(encoding="utf-8").partition("\n")
            if header == _digest_line(bundle):
                return bundle
    bundle = vl_convert.javascript_bundle()
    if file is not None:
        with suppress(OSError):  # a cache, not a result: without it every report bundles the script
            write_whole(file, f"{_digest_line(bundle)}\n{bundle}".encode())
    return bundle


def cache_folder() -> Path | None:
    """`$XDG_CACHE_HOME/breakout-runner` (an absolute XDG_CACHE_HOME only, as the XDG spec
    says), else `~/.cache/breakout-runner`; None where there is no home folder either."""
    base = os.environ.get("XDG_CACHE_HOME", "")
    if not os.path.isabs(base):
        try:
            base = str(Path.home() / ".cache")
        except RuntimeError:  # no HOME and no password entry for this user
            return None
    return Path(base) / "breakout-runner"


def _digest_line(text: str) -> str:
    return "// sha256 " + hashlib.sha256(text.encode("utf-8")).hexdigest()


def blank_nulls(frame):
    """A DataFrame with NULLs shown as empty cells, whatever the column types."""
    return frame.astype(object).where(frame.notna(), "")


def _is_number(value) -> bool:
    return isinstance(value, numbers.Number) and not isinstance(value, bool)


def _is_blank(value) -> bool:
    """An empty cell: "", None, NaN, NaT or pandas' NA (whose `== ""` cannot be asked)."""
    import pandas as pd

    return value == "" if isinstance(value, str) else pd.api.types.is_scalar(value) and bool(pd.isna(value))


def table_html(frame, *, float_format: str = "{:.3f}") -> str:
    """A pandas DataFrame as an HTML table (values escaped): text left-aligned, numbers right-aligned
    in class `num` cells, so that their digits line up; a column of numbers has a `num` header too."""
    numeric = [any(_is_number(v) for v in values) and all(_is_number(v) or _is_blank(v) for v in values)
               for values in (frame[c].tolist() for c in frame.columns)]
    head = "".join(f"<th class='num'>{html.escape(str(c))}</th>" if n else f"<th>{html.escape(str(c))}</th>"
                   for c, n in zip(frame.columns, numeric))
    body = []
    for row in frame.itertuples(index=False):
        cells = []
        for value in row:
            if _is_number(value):
                text = float_format.format(value) if isinstance(value, float) else str(value)
                cells.append(f"<td class='num'>{html.escape(text)}</td>")
            else:
                cells.append(f"<td>{html.escape(str(value))}</td>")
        body.append("<tr>" + "".join(cells) + "</tr>")
    return f"<table><thead><tr>{head}</tr></thead><tbody>{''.join(body)}</tbody></table>"


def gif_figure(label: str, path: str) -> str:
    """A GIF inlined as data (the page stays one file), with its caption."""
    import base64

    file = Path(path)
    if not file.is_file():
        return f"<p>{html.escape(label)}: file {html.escape(path)} is gone</p>"
    data = base64.b64encode(file.read_bytes()).decode()
    return (f"<figure style='display:inline-block;margin:0 1rem 1rem 0'><img alt='{html.escape(label)}' "
            f"src='data:image/gif;base64,{data}'><figcaption>{html.escape(label)}</figcaption></figure>")


STYLE = """
body { font-family: system-ui, sans-serif; margin: 2rem; max-width: 1100px; color: #222; }
table { border-collapse: collapse; margin: 0.5rem 0 1.5rem; font-size: 0.9rem; }
th, td { border: 1px solid #ccc; padding: 0.25rem 0.6rem; text-align: left; vertical-align: top; }
th { background: #f3f3f3; } td.num, th.num { text-align: right; font-variant-numeric: tabular-nums; }
table.verdicts td:nth-last-child(-n+2), table.verdicts td b { white-space: nowrap; }
.question { font-size: 1.1rem; border-left: 4px solid #888; padding: 0.3rem 0.8rem; background: #f6f6f6; }
.deployment-worthy { background: #d8f5d8; } .rejected { background: #f9d6d6; }
.inconclusive { background: #fff2c4; } .unavailable { background: #e6e6e6; }
code, pre { background: #f6f6f6; padding: 0.1rem 0.3rem; } pre { padding: 0.6rem; overflow-x: auto; }
"""


def render_page(title: str, intro_html: str, sections: list[Section]) -> str:
    parts, scripts = [], []
    for i, section in enumerate(sections):
        parts.append(f"<h2>{html.escape(section.title)}</h2>{section.html}")
        for j, chart in enumerate(section.charts):
            div = f"chart-{i}-{j}"
            parts.append(f'<div id="{div}"></div>')
            scripts.append(f"vegaEmbed('#{div}', {json.dumps(chart)}, {{actions: false}});")
    charts_js = ""
    if scripts:
        charts_js = f"<script>{vega_bundle()}</script><script>{''.join(scripts)}</script>"
    return (
        f"<!doctype html><html><head><meta charset='utf-8'><title>{html.escape(title)}</title>"
        f"<style>{STYLE}</style></head><body><h1>{html.escape(title)}</h1>{intro_html}{''.join(parts)}{charts_js}</body></html>"
    )
