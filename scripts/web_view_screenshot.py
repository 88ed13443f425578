"""The README's picture of the web view, taken from what `specgen serve` shows by default.

    python scripts/web_view_screenshot.py [--out docs/web-view.png] [-- SERVE FLAGS...]

Starts `specgen serve` on the embedded default with its default flags (or the ones given
after `--`, which the caption must then name), opens `/` in headless Chromium (Debian's
`chromium`, driven by Playwright), asks the questions below one after another in one
chat, and saves the page once the last answer is in. It prints the flags and questions,
for the caption.
"""

from __future__ import annotations

import argparse
import os
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parents[1]
QUESTIONS = [
    "What is speculative decoding, in two sentences?",
    "Repeat your last answer word for word.",  # text the n-gram drafter can copy
]
CHROMIUM_ARGS = [
    "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
    "--disable-background-networking", "--disable-component-update", "--disable-sync",
]  # fmt: skip


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default="docs/web-view.png")
    ap.add_argument("serve", nargs="*", help="flags for `specgen serve` (after --)")
    args = ap.parse_args()
    from playwright.sync_api import sync_playwright

    port = _free_port()
    command = [sys.executable, "-m", "specgen", "serve", "--port", str(port), *args.serve]
    server = subprocess.Popen(command, cwd=ROOT, stdout=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    try:
        for _ in range(600):
            try:
                if httpx.get(url + "/health", timeout=1).json().get("status") == "ok":
                    break
            except httpx.HTTPError:
                pass
            time.sleep(0.5)
        chromium = os.environ.get("SPECGEN_CHROMIUM") or shutil.which("chromium")
        with sync_playwright() as p:
            browser = p.chromium.launch(executable_path=chromium, args=CHROMIUM_ARGS)
            page = browser.new_page(viewport={"width": 1100, "height": 760})
            page.goto(url + "/")
            page.wait_for_function("document.getElementById('method').options.length > 0")
            for i, question in enumerate(QUESTIONS):
                page.fill("#prompt", question)
                page.press("#prompt", "Enter")
                page.wait_for_function(
                    "n => document.querySelectorAll('.msg.assistant').length > n"
                    " && document.body.dataset.state === 'idle'",
                    arg=i,
                    timeout=300_000,
                )
            out = Path(args.out)
            out = out if out.is_absolute() else ROOT / out
            page.screenshot(path=str(out))
            browser.close()
    finally:
        server.terminate()
        server.wait(timeout=30)
    flags = " ".join(args.serve) or "(its defaults)"
    print(f"wrote {args.out}: `specgen serve` {flags}; asked, in one chat: {QUESTIONS}")


if __name__ == "__main__":
    main()
