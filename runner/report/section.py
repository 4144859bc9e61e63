"""The unit of every report page: a title, HTML and Vega-Lite charts."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class Section:
    """One part of a report page: a title, optional HTML and Vega-Lite chart specs."""

    title: str
    html: str = ""
    charts: list[dict] = field(default_factory=list)
