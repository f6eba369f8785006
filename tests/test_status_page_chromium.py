"""The status page in a real browser: headless Chromium loads `/` of a running `harmony serve
--workers 2` after phones of every tier inferred, uploaded and an alignment round published, and
finds each plot laid out (an SVG of real size) with what it must show: every tier in the fallback
share, p50 and p99 latency, the round's before/after accuracy, both default versions. It drives
Chromium over the DevTools protocol (websockets), as a person's browser would render the page.

Needs Debian's `chromium`: outside CI a machine without it skips (with the reason); in CI (`CI`
set, as .ci/run does, which installs it) a missing browser fails. With STATUS_PAGE_SCREENSHOT set
to a path the test also saves a screenshot there (docs/status-page.png was made so)."""

from __future__ import annotations

import base64
import itertools
import json
import os
import shutil
import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx
import pytest
from websockets.sync.client import connect

from tests.helpers.fallback_server import TIER_FAMILIES, enrol, make_model_dir
from tests.helpers.operator_traffic import phone_traffic, publish_a_round, store_uploads, wait_for
from tests.server_process import serve_process

PLOTS = ("fallback-share", "fallback-latency", "upload-volume", "round-accuracy", "default-history")
FIGURES = """JSON.stringify([...document.querySelectorAll('figure.plot')].map(f => {
  const svg = f.querySelector('svg'), box = svg ? svg.getBoundingClientRect() : {width: 0, height: 0};
  return {id: f.id, width: box.width, height: box.height, text: svg ? svg.textContent : '',
          marks: svg ? svg.querySelectorAll('path, rect, line, use').length : 0};
}))"""


def chromium_binary() -> str:
    binary = shutil.which("chromium") or shutil.which("chromium-browser")
    if binary is None:
        reason = "no chromium binary (apt-get install chromium)"
        if os.environ.get("CI"):
            pytest.fail(f"{reason} (required in CI)")
        pytest.skip(reason)
    return binary


class DevTools:
    """One page of a headless Chromium, driven by DevTools protocol commands."""

    def __init__(self, websocket):
        self.websocket, self.ids = websocket, itertools.count(1)

    def call(self, method: str, **params) -> dict:
        message_id = next(self.ids)
        self.websocket.send(json.dumps({"id": message_id, "method": method, "params": params}))
        while True:  # events arrive in between; the answer carries our id
            message = json.loads(self.websocket.recv(timeout=60))
            if message.get("id") == message_id:
                assert "error" not in message, message
                return message["result"]

    def load(self, url: str) -> None:
        self.call("Page.enable")
        self.call("Page.navigate", url=url)
        ready = "document.readyState === 'complete'"
        wait_for(lambda: self.evaluate(ready), f"{url} loaded in Chromium")

    def evaluate(self, expression: str):
        return self.call("Runtime.evaluate", expression=expression, returnByValue=True)["result"]["value"]


@contextmanager
def chromium(tmp_path: Path) -> Iterator[DevTools]:
    profile = tmp_path / "chromium-profile"
    command = [
        chromium_binary(), "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars",
        "--remote-debugging-port=0", f"--user-data-dir={profile}", "--window-size=1400,1800", "about:blank",
    ]  # fmt: skip
    process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        port_file = profile / "DevToolsActivePort"
        wait_for(lambda: port_file.is_file() and port_file.read_text().strip(), "Chromium's DevTools port")
        port = port_file.read_text().split()[0]
        pages = httpx.get(f"http://127.0.0.1:{port}/json/list").json()
        [page] = [p for p in pages if p["type"] == "page"]
        with connect(page["webSocketDebuggerUrl"], max_size=None) as websocket:
            yield DevTools(websocket)
    finally:
        process.terminate()
        process.wait(timeout=30)


def test_the_status_page_shows_its_plots_in_chromium(tmp_path):
    chromium_binary()
    env = {"HARMONY_STATUS_SAMPLE_SECONDS": "0.5"}  # several history points within the test
    model_dir = make_model_dir(tmp_path, fit_steps=20)
    with serve_process(tmp_path / "data", model_dir, "--workers", "2", env=env) as server:
        with httpx.Client(base_url=server.base, timeout=30) as client:
            tokens = {tier: enrol(client, tier=tier)["token"] for tier in TIER_FAMILIES}
            store_uploads(client, enrol(client, tier="mid-android"))
            publish_a_round(client)
            deadline = time.monotonic() + 4
            phone_traffic(server.base, tokens, lambda: time.monotonic() < deadline)
        with chromium(tmp_path) as browser:
            browser.load(server.base + "/")
            figures = {f["id"]: f for f in json.loads(browser.evaluate(FIGURES))}
            screenshot = os.environ.get("STATUS_PAGE_SCREENSHOT")
            if screenshot:
                shot = browser.call("Page.captureScreenshot", format="png", captureBeyondViewport=True)
                Path(screenshot).write_bytes(base64.b64decode(shot["data"]))
    assert sorted(figures) == sorted(f"plot-{name}" for name in PLOTS)
    for figure in figures.values():
        assert figure["width"] > 300 and figure["height"] > 100 and figure["marks"] > 20, figure
    share, latency = figures["plot-fallback-share"]["text"], figures["plot-fallback-latency"]["text"]
    assert all(tier in share and f"{tier} p99" in latency for tier in TIER_FAMILIES), (share, latency)
    rounds = figures["plot-round-accuracy"]["text"]
    assert "#1" in rounds and "published" in rounds and "→" in rounds, rounds
    assert {"v1", "v1-r1"} <= set(figures["plot-default-history"]["text"].split()), figures
    assert "no uploads" not in figures["plot-upload-volume"]["text"]


def test_chromium_is_not_fooled_by_a_page_without_plots(tmp_path):
    """The check above fails on a page without the figures (the page before plots existed)."""
    page = tmp_path / "page.html"
    page.write_text("<!doctype html><h1>harmony fallback server</h1><table><tr><td>1</td></tr></table>")
    with chromium(tmp_path) as browser:
        browser.load(page.as_uri())
        assert json.loads(browser.evaluate(FIGURES)) == []
