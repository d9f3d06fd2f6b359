"""One look per router, the same in every report figure: a colour, a line style, a hatch.

matplotlib's default cycle has 10 colours, so with 12 or more routers two of
them share one (``ttca`` and ``aibrix-prefix-cache`` were both blue). Here a
router's place in :data:`ROUTER_ORDER` picks its style: the first 10 get the
dark shades of the tab20 map with solid lines, the next 10 the light shades
with dashed lines, then dark dotted and light dash-dotted, so the first 40 are
pairwise distinct in (colour, line style) and in (colour, hatch). A router
keeps its style whatever else is plotted beside it, across figures, reports
and runs. New routers are appended to :data:`ROUTER_ORDER`, never inserted
(tests/test_router_styles.py checks every registered router is there); names not in it
(bench targets, engine variants' labels, a benchmark's own router) take, in
sorted order, the first places that no router of the same figure holds.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable
from dataclasses import dataclass

#: every registered router, the most often compared first; append, never insert
ROUTER_ORDER = (
    "ttca",
    "laar",
    "gorgo",
    "prefix-cache",
    "least-load",
    "session-affinity",
    "aibrix-prefix-cache",
    "round-robin",
    "random",
    "least-request",
    "load-aware",
    "vllm-lb",
    "chimera",
    "mlfq",
    "ltr",
    "oracle-stjf",
    "oracle-sjf",
)

#: matplotlib's tab20 as (dark, light) pairs of one hue, grey last (the palest light shade)
_HUE_PAIRS = (
    ("#1f77b4", "#aec7e8"),  # blue
    ("#ff7f0e", "#ffbb78"),  # orange
    ("#2ca02c", "#98df8a"),  # green
    ("#d62728", "#ff9896"),  # red
    ("#9467bd", "#c5b0d5"),  # purple
    ("#8c564b", "#c49c94"),  # brown
    ("#e377c2", "#f7b6d2"),  # pink
    ("#bcbd22", "#dbdb8d"),  # olive
    ("#17becf", "#9edae5"),  # cyan
    ("#7f7f7f", "#c7c7c7"),  # grey
)
#: per block of 10 styles: line style, hatch (bars), and whether the shade is the light one
_BLOCKS = (("-", "", False), ("--", "//", True), (":", "..", False), ("-.", "xx", True))
#: styles that are pairwise distinct; beyond this many routers in one figure they repeat
NUM_DISTINCT_STYLES = len(_HUE_PAIRS) * len(_BLOCKS)


@dataclass(frozen=True, slots=True)
class RouterStyle:
    """How one router is drawn: ``color`` (hex), ``linestyle`` and ``linewidth`` (lines; the
    light shades are drawn wider, so they read as well as the dark ones), ``hatch`` (bars)."""

    color: str
    linestyle: str
    hatch: str
    linewidth: float


def style_at(index: int) -> RouterStyle:
    """The style in place ``index`` (0-based) of the fixed sequence described above."""
    index %= NUM_DISTINCT_STYLES
    dark, light = _HUE_PAIRS[index % len(_HUE_PAIRS)]
    linestyle, hatch, is_light = _BLOCKS[index // len(_HUE_PAIRS)]
    if is_light:
        return RouterStyle(light, linestyle, hatch, linewidth=2.2)
    return RouterStyle(dark, linestyle, hatch, linewidth=1.5)


def router_styles(names: Iterable[str]) -> dict[str, RouterStyle]:
    """A style per name: a router's by its place in ROUTER_ORDER; other names (in sorted
    order) the first places no router among ``names`` holds."""
    names = list(dict.fromkeys(names))
    known = {name: i for i, name in enumerate(ROUTER_ORDER)}
    place = {name: known[name] for name in names if name in known}
    taken = set(place.values())
    free = (i for i in itertools.count() if i not in taken)
    for name in sorted(n for n in names if n not in known):
        place[name] = next(free)
    return {name: style_at(place[name]) for name in names}


__all__ = ["NUM_DISTINCT_STYLES", "ROUTER_ORDER", "RouterStyle", "router_styles", "style_at"]
