"""The small HTML status page at `/`: versions, tiers, recent rounds and counters (no secrets)."""

from __future__ import annotations

from html import escape

from fastapi import APIRouter
from fastapi.responses import HTMLResponse
from harmony_mobile.server.state import StateDep

router = APIRouter(tags=["status"])

PAGE = """<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>harmony fallback server</title>
<style>body{{font-family:system-ui,sans-serif;margin:2em;max-width:60em}}
table{{border-collapse:collapse;margin-bottom:1.5em}}td,th{{border:1px solid #ccc;padding:.25em .6em;text-align:left}}
.ok{{color:#070}}.bad{{color:#a00}}</style></head>
<body><h1>harmony fallback server</h1>
<p>Status: {ready} &middot; model <code>{model}</code> &middot; default version <code>{default}</code></p>
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


@router.get("/", response_class=HTMLResponse, include_in_schema=False)
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
        ready='<span class="ok">ready</span>' if default else '<span class="bad">no back-end loaded</span>',
        model=escape(state.settings.model_name),
        default=escape(default.version if default else "none"),
        counters=_table(["counter", "value"], counters),
        versions=_table(["version", "source", "parent", "created", "sha256"], versions),
        tiers=_table(["tier"], [[t] for t in sorted(state.known_tiers)]),
        rounds=_table(["round", "status", "progress", "parent", "new version", "error"], rounds),
    )
    return HTMLResponse(html)
