"""The status page's plots, drawn on the server with matplotlib as inline SVG (no script, no CDN):
fallback share and latency per tier over time, upload volume, alignment rounds with their slot
accuracy before and after, and the default version's history.

matplotlib is imported on the first page view (not at server start: it costs a worker's start
half a second and memory it may never need), draws with its object API (no pyplot state shared
between threads) and one figure at a time (the page is served from the thread pool)."""

from __future__ import annotations

import io
import threading
from collections.abc import Callable
from datetime import UTC, datetime
from html import escape

from harmony_mobile.server.core.status_history import Interval
from harmony_mobile.server.services.store import RoundRecord

_draw_lock = threading.Lock()
SIZE = (6.4, 2.7)
STATUS_COLOURS = {"published": "#2a7d2a", "rejected": "#b03030"}


def _when(stamp: str | float) -> datetime:
    if isinstance(stamp, int | float):
        return datetime.fromtimestamp(stamp, UTC)
    return datetime.strptime(stamp, "%Y-%m-%dT%H:%M:%S.%fZ").replace(tzinfo=UTC)


def _svg(plot_id: str, draw: Callable) -> str:
    """The figure `draw(figure)` fills, as an <svg> element; text stays text (searchable, small)."""
    import matplotlib
    from matplotlib.backends.backend_svg import FigureCanvasSVG
    from matplotlib.figure import Figure

    # a salt per plot keeps the element ids of two inline SVGs on one page apart
    style = {"svg.fonttype": "none", "svg.hashsalt": plot_id, "font.size": 8, "axes.grid": True}
    with _draw_lock, matplotlib.rc_context(style):
        figure = Figure(figsize=SIZE, layout="constrained")
        FigureCanvasSVG(figure)
        draw(figure)
        buffer = io.StringIO()
        figure.savefig(buffer, format="svg")
    text = buffer.getvalue()
    return text[text.index("<svg") :]


def _empty(figure, message: str) -> None:
    axes = figure.add_subplot()
    axes.set_axis_off()
    axes.text(0.5, 0.5, message, ha="center", va="center", transform=axes.transAxes, color="#666")


def _time_axis(axes) -> None:
    import matplotlib.dates as mdates

    axes.xaxis.set_major_formatter(mdates.ConciseDateFormatter(axes.xaxis.get_major_locator()))


def fallback_share(intervals: list[Interval], sample_seconds: float) -> str:
    def draw(figure) -> None:
        with_rows = [i for i in intervals if i.share]
        if not with_rows:
            _empty(figure, f"no fallback rows yet (sampled every {sample_seconds:g} s)")
            return
        tiers = sorted({tier for i in with_rows for tier in i.share})
        axes = figure.add_subplot()
        times = [_when(i.end) for i in with_rows]
        shares = [[i.share.get(tier, 0.0) for i in with_rows] for tier in tiers]
        axes.stackplot(times, shares, labels=tiers, step="pre", alpha=0.85)
        axes.set_ylim(0, 1)
        axes.set_ylabel("share of fallback rows")
        axes.legend(loc="upper left", fontsize=7, ncols=min(len(tiers), 4))
        _time_axis(axes)

    return _svg("fallback-share", draw)


def fallback_latency(intervals: list[Interval], sample_seconds: float) -> str:
    def draw(figure) -> None:
        tiers = sorted({tier for i in intervals for tier in i.p99})
        if not tiers:
            _empty(figure, f"no answered infer requests yet (sampled every {sample_seconds:g} s)")
            return
        axes = figure.add_subplot()
        for index, tier in enumerate(tiers):
            points = [(i.end, i.p50[tier], i.p99[tier]) for i in intervals if tier in i.p99]
            times = [_when(p[0]) for p in points]
            colour = f"C{index}"
            axes.plot(times, [1000 * p[2] for p in points], color=colour, marker=".", label=f"{tier} p99")
            axes.plot(times, [1000 * p[1] for p in points], color=colour, linestyle=":", label=f"{tier} p50")
        from matplotlib.ticker import LogLocator, NullFormatter, ScalarFormatter

        axes.set_yscale("log")  # p50 and p99 differ by orders of magnitude under load
        axes.yaxis.set_major_locator(LogLocator(subs=(1.0, 2.0, 5.0)))
        axes.yaxis.set_major_formatter(ScalarFormatter())
        axes.yaxis.set_minor_formatter(NullFormatter())
        axes.set_ylabel("latency, ms")
        axes.legend(loc="upper left", fontsize=7, ncols=2)
        _time_axis(axes)

    return _svg("fallback-latency", draw)


def upload_volume(uploads: list[tuple[str, int, int]]) -> str:
    def draw(figure) -> None:
        if not uploads:
            _empty(figure, "no uploads stored yet")
            return
        import matplotlib.dates as mdates

        times = mdates.date2num([_when(u[0]) for u in uploads])
        span = max(times[-1] - times[0], 1 / 1440)  # days; at least a minute
        bins = min(40, max(1, len(uploads)))
        edges = [times[0] + span * k / bins for k in range(bins + 1)]
        axes = figure.add_subplot()
        axes.hist(times, bins=edges, weights=[u[1] for u in uploads], color="#3465a4", label="feature rows")
        axes.set_ylabel("rows per bar")
        volume = axes.twinx()
        volume.grid(False)
        sizes = [u[2] for u in uploads]
        volume.plot(times, [sum(sizes[: k + 1]) / 1e6 for k in range(len(sizes))], color="#c4a000")
        volume.set_ylim(bottom=0)
        volume.set_ylabel("envelope MB, cumulative")
        axes.xaxis_date()
        _time_axis(axes)

    return _svg("upload-volume", draw)


def round_accuracy(rounds: list[RoundRecord]) -> str:
    def draw(figure) -> None:
        scored = [
            r
            for r in sorted(rounds, key=lambda r: r.id)
            if "holdout_slot_accuracy_before" in r.metrics and "holdout_slot_accuracy_after" in r.metrics
        ]
        if not scored:
            _empty(figure, "no alignment round has a publish check yet")
            return
        axes = figure.add_subplot()
        for position, r in enumerate(scored):
            before, after = (
                r.metrics["holdout_slot_accuracy_before"],
                r.metrics["holdout_slot_accuracy_after"],
            )
            colour = STATUS_COLOURS.get(r.status, "#555")
            axes.annotate(
                "", (position, after), (position, before), arrowprops={"arrowstyle": "->", "color": colour}
            )
            axes.plot([position], [before], "o", color="#999", markersize=4)
            axes.plot([position], [after], "o", color=colour, markersize=5)
            axes.annotate(
                f"{before:.2f} → {after:.2f}",
                (position, after),
                (6, -3),
                textcoords="offset points",
                fontsize=7,
            )
        axes.set_xticks(range(len(scored)), [f"#{r.id}\n{r.status}" for r in scored])
        axes.set_xlim(-0.6, len(scored) - 0.4)
        axes.set_ylim(0, 1.05)
        axes.set_ylabel("held-out slot accuracy")
        axes.set_title("grey: before the round, coloured: after (green published, red rejected)", fontsize=7)

    return _svg("round-accuracy", draw)


def default_history(changes: list[tuple[str, str]], current: str | None, now: float) -> str:
    def draw(figure) -> None:
        points = list(changes) or (
            [(datetime.fromtimestamp(now, UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ"), current)] if current else []
        )
        if not points:
            _empty(figure, "no default version yet")
            return
        versions = list(dict.fromkeys(v for _, v in points))
        axes = figure.add_subplot()
        times = [_when(t) for t, _ in points] + [_when(now)]
        levels = [versions.index(v) for _, v in points]
        axes.step(times, levels + levels[-1:], where="post", color="#3465a4", marker="o", markersize=4)
        axes.set_yticks(range(len(versions)), versions)
        axes.set_ylim(-0.5, len(versions) - 0.5)
        axes.set_ylabel("default version")
        _time_axis(axes)

    return _svg("default-history", draw)


def figure_html(plot_id: str, svg: str, caption: str) -> str:
    return (
        f'<figure id="plot-{plot_id}" class="plot">{svg}<figcaption>{escape(caption)}</figcaption></figure>'
    )
