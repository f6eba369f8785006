"""The HTML status page at `/`: plots (fallback share and latency per tier over time, upload
volume, alignment rounds' slot accuracy before and after, the default version's history), then
counters, versions, tiers and recent rounds. No secrets; no script (plots are inline SVG)."""

from __future__ import annotations

import time
from html import escape

from fastapi import APIRouter
from fastapi.responses import HTMLResponse
from harmony_mobile.server.routes.deps import StateDep
from harmony_mobile.server.services import status_plots
from harmony_mobile.server.services.state import ServerState

router = APIRouter(tags=["status"])

PAGE = """<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>harmony fallback server</title>
<style>body{{font-family:system-ui,sans-serif;margin:2em;max-width:90em}}
table{{border-collapse:collapse;margin-bottom:1.5em}}td,th{{border:1px solid #ccc;padding:.25em .6em;text-align:left}}
.ok{{color:#070}}.bad{{color:#a00}}
.plots{{display:grid;grid-template-columns:repeat(auto-fill,minmax(34em,1fr));gap:1em;margin-bottom:1.5em}}
.plot{{margin:0;border:1px solid #ddd;padding:.5em}}.plot svg{{width:100%;height:auto}}
figcaption{{font-size:.85em;color:#444}}</style></head>
<body><h1>harmony fallback server</h1>
<p>Status: {ready} &middot; model <code>{model}</code> &middot; default version <code>{default}</code></p>
<h2>Over time</h2><div class="plots">{plots}</div>
<h2>Counters</h2>{counters}
<h2>Back-end versions</h2>{versions}
<h2>Tiers</h2>{tiers}
<h2>Recent alignment rounds</h2>{rounds}
<p><a href="/metrics">Prometheus metrics</a> &middot; <a href="/docs">API docs</a></p>
</body></html>"""


def _table(header: list[str], rows: list[list[object]]) -> str:
    if not rows:
        return "<p>none</p>"
    head = "".join(f"<th>{escape(h)}</th>" for h in header)
    body = "".join("<tr>" + "".join(f"<td>{escape(str(c))}</td>" for c in row) + "</tr>" for row in rows)
    return f"<table><tr>{head}</tr>{body}</table>"


@router.api_route("/", methods=["GET", "HEAD"], response_class=HTMLResponse, include_in_schema=False)
def status_page(state: StateDep) -> HTMLResponse:
    default = state.registry.default()
    metrics = state.metrics
    totals = metrics.snapshot()  # every worker's counts, read once
    uploads = state.store.upload_stats()
    counters = [
        ["devices", len(state.store.devices())],
        ["stored uploads", uploads["uploads"]],
        ["stored feature rows", uploads["rows"]],
        ["inferred rows", int(totals.counter(metrics.inferred_rows))],
        ["micro-batches", int(totals.counter(metrics.batches))],
        ["uploads rejected", int(totals.counter(metrics.uploads, outcome="rejected"))],
        ["requests refused: queue full (503)", int(totals.counter(metrics.queue_full))],
        ["requests refused: rate limit (429)", int(totals.counter(metrics.rate_limited))],
    ]
    versions = [
        [v.version, v.source, v.parent or "", v.created_at, v.sha256[:12]]
        for v in reversed(state.store.versions())
    ]
    rounds = [
        [r.id, r.status, f"{r.progress:.0%}", r.parent_version or "", r.new_version or "", r.error or ""]
        for r in state.store.rounds(limit=10)
    ]
    html = PAGE.format(
        plots=_plots(state),
        ready='<span class="ok">ready</span>' if default else '<span class="bad">no back-end loaded</span>',
        model=escape(state.settings.model_name),
        default=escape(default.version if default else "none"),
        counters=_table(["counter", "value"], counters),
        versions=_table(["version", "source", "parent", "created", "sha256"], versions),
        tiers=_table(["tier"], [[t] for t in sorted(state.known_tiers)]),
        rounds=_table(["round", "status", "progress", "parent", "new version", "error"], rounds),
    )
    return HTMLResponse(html)


def _plots(state: ServerState) -> str:
    """The plots' HTML, redrawn at most once per status_sample_seconds (drawing costs CPU the
    inference shares; the history does not change faster than that anyway)."""
    history = state.metrics.history
    every = state.settings.status_sample_seconds
    now = time.time()
    if history.plots is not None and now - history.plots[0] < min(every, 5.0):
        return history.plots[1]
    intervals = history.intervals()
    store = state.store
    default = state.registry.default()
    figures = [
        ("fallback-share", status_plots.fallback_share(intervals, every),
         "Each tier's share of the fallback rows the server answered, per sampling interval."),
        ("fallback-latency", status_plots.fallback_latency(intervals, every),
         "Latency of answered infer requests per tier (p99 solid, p50 dotted), per sampling interval."),
        ("upload-volume", status_plots.upload_volume(store.upload_volume()),
         "Feature rows in stored uploads over time (bars) and their sealed envelope bytes (line)."),
        ("round-accuracy", status_plots.round_accuracy(store.rounds(limit=50)),
         "Alignment rounds: held-out slot accuracy of the teacher (before) and the trained student (after)."),
        ("default-history", status_plots.default_history(
            store.default_history(), default.version if default else None, now),
         "The default back-end version over time (every change: publish, set default, rollback)."),
    ]  # fmt: skip
    html = "".join(status_plots.figure_html(plot_id, svg, caption) for plot_id, svg, caption in figures)
    history.plots = (now, html)
    return html
