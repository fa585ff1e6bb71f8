"""The HTML report as a reader sees it: the written file opened from disk (file://) in a real
headless Chromium through Playwright. Skips with the reason where the playwright package (the
``browser`` extra) or a Chromium binary is missing; Playwright's own browser download is never
used (Debian: ``apt-get install chromium``; elsewhere set NUMCHECK_CHROMIUM to a binary)."""
from __future__ import annotations

import os
import shutil

import pytest

from numcheck.report.html import html_report

from test_report_html import EVIL, PROV, REPRO, sample

sync_api = pytest.importorskip(
    "playwright.sync_api", reason="browser test: the playwright package is not installed "
                                  "(pip install -e '.[browser]')")
CHROMIUM = os.environ.get("NUMCHECK_CHROMIUM") or shutil.which("chromium") or \
    shutil.which("chromium-browser") or shutil.which("google-chrome")
if not CHROMIUM:
    pytest.skip("browser test: no Chromium binary (apt-get install chromium, or set "
                "NUMCHECK_CHROMIUM)", allow_module_level=True)


@pytest.fixture(scope="module")
def opened(tmp_path_factory):
    """(page, what the browser reported while loading it: console messages, page errors,
    dialogs, requests, the file's URL)."""
    path = tmp_path_factory.mktemp("report") / "report.html"
    path.write_text(html_report(sample(), PROV), encoding="utf-8")
    seen = {"console": [], "errors": [], "dialogs": [], "requests": [], "url": path.as_uri()}
    with sync_api.sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM)
        page = browser.new_page()
        page.on("console", lambda m: seen["console"].append(f"{m.type}: {m.text}"))
        page.on("pageerror", lambda e: seen["errors"].append(str(e)))
        page.on("dialog", lambda d: (seen["dialogs"].append(d.message), d.dismiss()))
        page.on("request", lambda r: seen["requests"].append(r.url))
        page.goto(seen["url"], wait_until="load")
        yield page, seen
        browser.close()


def test_title(opened):
    page, _ = opened
    assert page.title() == "numcheck report: cpu 2026-01-01"


def test_failures_show_the_repro_command(opened):
    page, _ = opened
    failures = page.locator("#failures")
    assert REPRO in failures.inner_text()
    assert page.locator("#failures pre.repro").filter(has_text=REPRO).is_visible()
    assert EVIL in failures.inner_text()  # the kernel's name shown as text, never run


def test_svgs_render_with_nonzero_size(opened):
    page, _ = opened
    svgs = page.locator("svg")
    assert svgs.count() == 2  # the failing case's histogram, the mlp curves
    for i in range(svgs.count()):
        box = svgs.nth(i).bounding_box()
        assert box is not None and box["width"] > 0 and box["height"] > 0
    bars = page.locator("#failures svg rect")
    heights = [bars.nth(i).bounding_box()["height"] for i in range(bars.count())]
    counts = [int(bars.nth(i).get_attribute("data-count")) for i in range(bars.count())]
    assert [h > 0 for h in heights] == [c > 0 for c in counts]
    lines = page.locator("#convergence polyline")
    assert lines.count() == 4 and all(lines.nth(i).bounding_box()["width"] > 0
                                      for i in range(lines.count()))


def test_no_console_errors_no_network(opened):
    _, seen = opened
    assert seen["console"] == [] and seen["errors"] == [] and seen["dialogs"] == []
    assert seen["requests"] == [seen["url"]]
