"""The documentation site: `mkdocs build --strict` from this tree, then its pages in headless Chromium."""

from __future__ import annotations

import functools
import subprocess
import sys
import threading
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from tests.e2e.helpers import cli_env

REPO = Path(__file__).resolve().parents[2]
MKDOCS = Path(sys.executable).parent / "mkdocs"
CHROMIUM = Path("/usr/bin/chromium")


class QuietHandler(SimpleHTTPRequestHandler):
    def log_message(self, format: str, *args: object) -> None:
        """Silent: a request log line per page asset would bury the test's own output."""


def test_start_page_and_configuration_reference_open_without_console_errors(tmp_path: Path):
    if not CHROMIUM.exists():
        pytest.skip(f"{CHROMIUM} is missing: install Debian's chromium (./install.sh does, as root)")
    sync_api = pytest.importorskip("playwright.sync_api", reason="playwright is missing: pip install -e '.[dev]'")
    site = tmp_path / "site"
    env = cli_env()
    build = [str(MKDOCS), "build", "--strict", "-d", str(site)]
    result = subprocess.run(build, cwd=REPO, env=env, capture_output=True, text=True, timeout=600, check=False)
    assert result.returncode == 0, (result.stdout + result.stderr)[-3000:]

    server = ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(QuietHandler, directory=str(site)))
    threading.Thread(target=server.serve_forever, daemon=True).start()
    base = f"http://127.0.0.1:{server.server_address[1]}"
    try:
        with sync_api.sync_playwright() as playwright:
            browser = playwright.chromium.launch(executable_path=str(CHROMIUM), args=["--headless", "--no-sandbox"])
            for path, heading in [("/", "agentgym-rl"), ("/reference/configuration/", "Configuration")]:
                page = browser.new_page()
                problems: list[str] = []
                page.on("console", lambda m, p=problems: p.append(m.text) if m.type == "error" else None)
                page.on("pageerror", lambda e, p=problems: p.append(str(e)))
                page.on("requestfailed", lambda r, p=problems: p.append(f"{r.url}: {r.failure}"))
                page.goto(base + path, wait_until="networkidle")
                sync_api.expect(page.locator("article h1").first).to_contain_text(heading)
                assert problems == [], path
                if path == "/reference/configuration/":
                    sync_api.expect(page.locator("h2#trainer")).to_be_visible()
                    assert page.locator("article table tr").count() > 150  # a row per key and per header
                page.close()
            browser.close()
    finally:
        server.shutdown()
