"""Charts that several report pages draw: a latency distribution on log-width bins, and ratios
as dots against a rule at 1.0."""

from __future__ import annotations

import pandas as pd

from runner.report.html import altair


def log_histogram(samples: pd.DataFrame, *, value: str = "ms", group: str = "series", unit: str = "ms per call",
                  maxbins: int = 60) -> dict:
    """One row of bars per `group`, on a shared log x axis: bins of equal width in log10(value), so
    a series at 0.25 ms and one at 0.56 ms fall in bins of their own, and a 20 ms outlier keeps
    them from being squeezed into one bin."""
    alt = altair()
    span = f"{unit} (log scale; each bin the same width in log {unit.split()[0]})"
    chart = (alt.Chart(samples[[value, group]])
             .transform_filter(f"datum.{value} > 0")
             .transform_calculate(log_value=f"log(datum.{value}) / LN10")
             .transform_bin(["log_from", "log_to"], "log_value", bin=alt.Bin(maxbins=maxbins))
             .transform_aggregate(calls="count()", groupby=["log_from", "log_to", group])
             .transform_calculate(bin_from="pow(10, datum.log_from)", bin_to="pow(10, datum.log_to)")
             .mark_bar(opacity=0.8)
             .encode(x=alt.X("bin_from:Q", scale=alt.Scale(type="log"), title=span), x2="bin_to:Q",
                     y=alt.Y("calls:Q", title="calls in bin"), y2=alt.datum(0),
                     color=alt.Color(f"{group}:N", legend=None),
                     tooltip=[alt.Tooltip(f"{group}:N"),
                              alt.Tooltip("bin_from:Q", title=f"from ({unit})", format=".4g"),
                              alt.Tooltip("bin_to:Q", title=f"to ({unit})", format=".4g"), alt.Tooltip("calls:Q")])
             .properties(width=640, height=70)
             .facet(row=alt.Row(f"{group}:N", title=None, header=alt.Header(labelAngle=0, labelAlign="left"))))
    return chart.to_dict()


def ratio_dots(ratios: pd.DataFrame, *, subject: str, statistic: str, ratio: str, title: str) -> dict:
    """Each ratio as a dot on a log axis, a dashed rule at 1.0 (no change), its value on hover."""
    alt = altair()
    x = alt.X(f"{ratio}:Q", scale=alt.Scale(type="log"), title=title)
    dots = alt.Chart(ratios).mark_point(filled=True, size=80).encode(
        x=x, y=alt.Y(f"{subject}:N", title=None), color=alt.Color(f"{statistic}:N", title="statistic"),
        shape=alt.Shape(f"{statistic}:N", title="statistic"),
        tooltip=[alt.Tooltip(f"{subject}:N"), alt.Tooltip(f"{statistic}:N"), alt.Tooltip(f"{ratio}:Q", format=".4f")])
    rule = alt.Chart(pd.DataFrame({ratio: [1.0]})).mark_rule(color="black", strokeDash=[4, 3]).encode(x=x)
    return alt.layer(rule, dots).properties(width=640).to_dict()
