"""The report pages' structure, read back from the HTML they write: the spec's question and its
verdicts first, text left-aligned and numbers right-aligned, latency on a log axis with titled
axes, ratios as dots against a rule at 1.0, the compare chart's box drawn above its samples,
identical environment rows folded away, and a verdicts page that links runs to their reports."""

from __future__ import annotations

import json
import re
from html.parser import HTMLParser

import numpy as np
import pytest
from test_compare import add_latency, add_run, latencies, latency_spec

from runner.compare.page import build_compare_report
from runner.compare.runs import compare_runs
from runner.report.run_report import build_run_report, build_verdicts_report
from runner.store.database import Store, utcnow

QUESTION = "Is ORT on the CPU faster than the reference at batch 1?"


class Page(HTMLParser):
    """What a test reads from a page: its elements in order (tag, attributes, text), and its charts."""

    def __init__(self, text: str):
        super().__init__()
        self.elements: list[tuple[str, dict, str]] = []
        self._open: list[int] = []
        self.feed(text)
        self.charts = []
        decoder = json.JSONDecoder()
        for match in re.finditer(r"vegaEmbed\('#chart-\d+-\d+', ", text):
            self.charts.append(decoder.raw_decode(text, match.end())[0])

    def handle_starttag(self, tag, attrs):
        self.elements.append((tag, dict(attrs), ""))
        if tag not in ("br", "meta", "link", "img"):
            self._open.append(len(self.elements) - 1)

    def handle_endtag(self, tag):
        while self._open:
            i = self._open.pop()
            if self.elements[i][0] == tag:
                break

    def handle_data(self, data):
        for i in self._open:
            tag, attrs, text = self.elements[i]
            self.elements[i] = (tag, attrs, text + data)

    def first(self, tag: str, **attrs) -> int:
        return next(i for i, (t, a, _) in enumerate(self.elements) if t == tag
                    and all(a.get(k) == v for k, v in attrs.items()))

    def texts(self, tag: str) -> list[str]:
        return [text for t, _, text in self.elements if t == tag]


def _with_question(spec_text: str) -> str:
    return spec_text.replace("contract:", f"description: {QUESTION}\ncontract:", 1)


@pytest.fixture
def store(tmp_path) -> Store:
    return Store(tmp_path / "r.duckdb")


def _latency_runs(store: Store) -> None:
    """Two runs of a spec with a question: two runtimes near 0.25 and 0.56 ms, a 20 ms outlier."""
    rng = np.random.default_rng(11)
    for run_id in ("A", "B"):
        fast, slow = latencies(rng, 0.25, n=400), latencies(rng, 0.56, n=400)
        slow[0] = 20.0
        add_latency(store, add_run(store, run_id, _with_question(latency_spec(["ort", "ref"], 400, 4))),
                    {"ort": fast, "ref": slow}, rounds=4)
        store.append_rows("verdicts", [{
            "run_id": run_id, "verdict": "ort_faster", "measurement": "lat", "candidate": "ort", "baseline": "ref",
            "outcome": "deployment-worthy", "reason": "latency_p50_ratio = 0.45 < 1.0", "evidence": "{}",
            "decided_at": utcnow()}])


def test_a_run_report_opens_with_its_question_and_verdicts_and_aligns_text_left(store, tmp_path):
    _latency_runs(store)
    text = build_run_report(store, tmp_path, run_id="B").read_text()
    page = Page(text)
    question = page.first("p", **{"class": "question"})
    assert QUESTION in page.elements[question][2]
    assert question < page.first("table") and page.texts("h2")[0] == "Verdicts"
    assert page.texts("h2")[1] == "How this run was made"
    assert "th, td { border: 1px solid #ccc; padding: 0.25rem 0.6rem; text-align: left;" in text
    cells = [(a.get("class"), body) for t, a, body in page.elements if t == "td"]
    assert ("num", "1000") not in cells and (None, "ort") in cells  # a runtime's name is text
    assert all(re.fullmatch(r"-?[\d.e+-]+|nan", body) for cls, body in cells if cls == "num")
    assert any(cls == "num" and body == "400" for cls, body in cells)  # n: a number, right-aligned


def test_latency_is_a_log_binned_distribution_with_titled_axes_and_ratios_are_dots_at_a_rule(store, tmp_path):
    _latency_runs(store)
    page = Page(build_run_report(store, tmp_path, run_id="A").read_text())
    (histogram,) = [c for c in page.charts if "facet" in c and c["spec"]["mark"]["type"] == "bar"]
    encoding = histogram["spec"]["encoding"]
    assert encoding["x"]["scale"] == {"type": "log"} and encoding["x"]["title"].startswith("ms per call (log scale")
    assert encoding["y"]["title"] == "calls in bin"
    transforms = histogram["spec"]["transform"]
    assert transforms[1] == {"calculate": "log(datum.ms) / LN10", "as": "log_value"}
    assert transforms[2]["field"] == "log_value" and transforms[2]["bin"] == {"maxbins": 60}
    # 60 bins over log10 of 0.2 to 20 ms are 0.033 wide: 0.25 and 0.56 ms are 0.35 apart, ten bins
    assert (np.log10(0.56) - np.log10(0.25)) / ((np.log10(20) - np.log10(0.2)) / 60) > 10

    (dots,) = [c for c in page.charts
               if "layer" in c and any(part["mark"].get("type") == "rule" for part in c["layer"])]
    rule, points = dots["layer"]
    assert rule["mark"]["type"] == "rule" and dots["datasets"][rule["data"]["name"]] == [{"ratio": 1.0}]
    assert points["mark"]["type"] == "point" and points["encoding"]["x"]["scale"] == {"type": "log"}
    assert "< 1: faster" in points["encoding"]["x"]["title"]
    ratios = dots["datasets"][points["data"]["name"]]
    # against the first runtime, the baseline where the spec names none
    assert {(r["pair"], r["statistic"]) for r in ratios} == {("ref b=1", f"wall {s}")
                                                            for s in ("p50", "p95", "p99", "mean")}


def test_the_compare_page_draws_its_box_above_the_samples_and_folds_identical_rows(store, tmp_path):
    _latency_runs(store)
    comparison = compare_runs(store, "A", "B")
    page = Page(build_compare_report(store, comparison, tmp_path).read_text())
    (chart,) = page.charts
    ticks, box = chart["spec"]["layer"]
    assert ticks["mark"]["type"] == "tick" and box["mark"]["type"] == "boxplot"  # the box last: on top
    assert box["mark"]["box"]["stroke"] == "black" and box["mark"]["median"]["color"] == "black"
    assert box["mark"]["opacity"] > ticks["mark"]["opacity"]
    same = page.first("details", **{"class": "same"})
    summary = page.elements[same + 1][2]
    assert summary.startswith(f"{len(comparison.environment)} the same in both runs: host, cpu, gpu")
    where = page.texts("h2").index("Where each run was made")
    assert "Nothing differs" in text_after(page, "h2", where)
    assert page.texts("b")[1] == "0 worse, 0 better, 2 unchanged, 4 not comparable; verdicts: 0 of 1 flipped"


def text_after(page: Page, tag: str, index: int) -> str:
    """The text of the element that follows the index-th `tag`."""
    position = [i for i, (t, _, _) in enumerate(page.elements) if t == tag][index]
    return page.elements[position + 1][2]


def test_the_verdicts_page_links_runs_to_their_reports_and_names_contracts_and_times(store, tmp_path):
    _latency_runs(store)
    with store.writer() as con:
        con.execute("UPDATE runs SET contract = '{\"name\": \"breakout-v2\"}'")
    report = build_run_report(store, tmp_path, run_id="B")
    page = Page(build_verdicts_report(store, tmp_path)[0].read_text())
    assert page.texts("h2") == ["host box · contract breakout-v2 c2"]
    links = [(a["href"], text) for t, a, text in page.elements if t == "a"]
    assert links == [(report.name, "B")]
    header = [text for t, _, text in page.elements if t == "th"]
    assert header[-2:] == ["run_id", "decided"]
    decided = [text for t, _, text in page.elements if t == "td"][-1]
    assert re.fullmatch(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d", decided)
