"""Every router has its own look in the report figures, and keeps it from figure to figure."""

from __future__ import annotations

from matplotlib.colors import to_hex
from matplotlib.lines import Line2D

from longroute.metrics.plots import cdf_figure, endpoint_figure
from longroute.metrics.records import RequestRecord
from longroute.metrics.router_styles import (
    NUM_DISTINCT_STYLES,
    ROUTER_ORDER,
    router_styles,
    style_at,
)
from longroute.routing import ROUTERS

FOURTEEN = ROUTER_ORDER[:14]


def _record(router: str, i: int, r: int) -> RequestRecord:
    return RequestRecord(
        request_id=f"{router}-{i}", session_id=None, router=router,
        endpoint=f"endpoint-{i % 3}", model="m", region=None, arrival_s=0.0,
        dispatch_s=0.0, first_token_s=0.01 * (1 + i + r), finish_s=0.02 * (1 + i + r),
        num_prompt_tokens=100, num_cached_tokens=0, num_output_tokens=8,
    )  # fmt: skip


def _records(routers: tuple[str, ...]) -> dict[str, list[RequestRecord]]:
    return {router: [_record(router, i, r) for i in range(30)] for r, router in enumerate(routers)}


def test_every_registered_router_has_a_fixed_place() -> None:
    assert len(set(ROUTER_ORDER)) == len(ROUTER_ORDER)
    assert set(ROUTERS.names()) <= set(ROUTER_ORDER), "append new routers to ROUTER_ORDER"


def test_fourteen_routers_never_share_a_colour_and_line_style() -> None:
    styles = router_styles(FOURTEEN)
    assert len({(s.color, s.linestyle) for s in styles.values()}) == 14
    assert len({(s.color, s.hatch) for s in styles.values()}) == 14
    every = [style_at(i) for i in range(NUM_DISTINCT_STYLES)]
    assert len({(s.color, s.linestyle) for s in every}) == NUM_DISTINCT_STYLES == 40


def test_a_router_keeps_its_style_whatever_is_plotted_beside_it() -> None:
    alone = router_styles(["ttca"])["ttca"]
    assert router_styles(reversed(ROUTER_ORDER))["ttca"] == alone
    assert router_styles(["aibrix-prefix-cache", "ttca"])["ttca"] == alone
    assert router_styles(["aibrix-prefix-cache"])["aibrix-prefix-cache"].color != alone.color


def test_other_names_take_the_first_styles_no_plotted_router_holds() -> None:
    styles = router_styles(["gateway", "direct"])  # bench targets: the two first styles
    assert (styles["direct"], styles["gateway"]) == (style_at(0), style_at(1))
    mixed = router_styles(["ttca", "x-variant"])  # ttca holds place 0
    assert mixed["x-variant"] == style_at(1) != mixed["ttca"]


def test_cdf_lines_and_endpoint_bars_of_fourteen_routers_are_told_apart() -> None:
    records = _records(FOURTEEN)
    cdf = cdf_figure("s", "TTFT", lambda r: r.first_token_s, records)
    lines = [line for line in cdf.axes[0].get_lines() if isinstance(line, Line2D)]
    looks = {(to_hex(line.get_color()), line.get_linestyle()) for line in lines}
    assert len(lines) == len(looks) == 14
    bars = endpoint_figure("s", records).axes[0].patches
    bar_looks = {(to_hex(bar.get_facecolor()), bar.get_hatch()) for bar in bars}
    assert len(bar_looks) == 14  # one look per router, repeated over the endpoints
