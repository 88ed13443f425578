"""The web view (specgen/serve/static/): `specgen serve` answers `/` with a chat page that
streams over the server's own API. Driven here in a real headless Chromium (Debian's
`chromium`, through Playwright) against the real server in a subprocess: the page's
answers must equal the API's, text from accepted drafts is highlighted, the live and final
statistics show, and a second turn, Stop, New chat, the API key form and errors work.

Skipped without chromium or playwright unless SPECGEN_REQUIRE_BROWSER=1 (then it fails).
The README's picture is not this tiny model's page: scripts/web_view_screenshot.py takes
it from `specgen serve` on the embedded default.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import httpx
import pytest

from support.serve import CPU, Server

# servers, subprocesses or whole CLI runs: not the quick tier
pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[1]
KEY = "web-view-test-key"
# Debian's chromium in a closed network: no sandbox (root in CI), and none of the background
# connections it would otherwise try (and wait on)
CHROMIUM_ARGS = [
    "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
    "--disable-background-networking", "--disable-component-update", "--disable-sync",
]  # fmt: skip
TURN = 60_000  # ms an answer may take in the browser


def _chromium() -> str | None:
    """Debian's chromium, or the browser SPECGEN_CHROMIUM names (None: not installed)."""
    given = os.environ.get("SPECGEN_CHROMIUM")
    path = given or shutil.which("chromium") or "/usr/bin/chromium"
    return path if os.path.isfile(path) else None


@pytest.fixture(scope="module")
def browser():
    missing = []
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        missing.append("playwright (pip install playwright)")
    if _chromium() is None:
        missing.append("chromium (apt-get install -y chromium)")
    if missing:
        why = f"the web view test needs {' and '.join(missing)}"
        if os.environ.get("SPECGEN_REQUIRE_BROWSER") == "1":
            pytest.fail(why + " (SPECGEN_REQUIRE_BROWSER=1)")
        pytest.skip(why)
    with sync_playwright() as p:
        chromium = p.chromium.launch(executable_path=_chromium(), args=CHROMIUM_ARGS)
        yield chromium
        chromium.close()


@pytest.fixture(scope="module")
def server(tiny_qwen3_deep, tiny_dflash, tmp_path_factory):
    """`specgen serve` on the tiny target with an API key: DFlash (the default; the tiny
    drafter's drafts are rarely accepted) and n-gram drafting (which copies the repeated
    answer of a repeated question), every draft verified (`full`: no timing decides)."""
    with pytest.MonkeyPatch.context() as env:  # module scope: conftest's isolation is not on
        env.setenv("SPECGEN_HOME", str(tmp_path_factory.mktemp("web-view-home") / "specgen"))
        env.setenv("HF_HUB_OFFLINE", "1")
        srv = Server(
            "--model", str(tiny_qwen3_deep), "--method", "dflash", "--drafter", str(tiny_dflash),
            "--methods", "dflash,ngram", "--verify-policy", "full", "--max-new-tokens", "24",
            *CPU, key=KEY,
        )  # fmt: skip
    try:
        assert httpx.get(srv.url + "/health", timeout=10).json()["status"] == "ok"
        yield srv
    finally:
        srv.stop()


@pytest.fixture
def page(browser, server):
    context = browser.new_context(viewport={"width": 1100, "height": 800})
    page = context.new_page()
    errors: list[str] = []
    page.on("pageerror", lambda e: errors.append(str(e)))
    page.goto(server.url + "/")
    yield page
    context.close()
    assert not errors, f"JavaScript errors on the page: {errors}"


# --- helpers -------------------------------------------------------------------------------


def api_answer(server: Server, messages: list[dict], method: str, max_tokens: int) -> str:
    """The same request as the page's, not streamed, through the API."""
    body = {"messages": messages, "max_tokens": max_tokens, "specgen": {"method": method}}
    with server.http() as http:
        r = http.post("/v1/chat/completions", json=body)
    assert r.status_code == 200, r.text
    return r.json()["choices"][0]["message"]["content"]


def enter_key(page) -> None:
    """The page finds /v1/models refused (401), shows the error and the key form."""
    page.wait_for_selector("#key-form:not([hidden])")
    assert "invalid_api_key" in page.inner_text("#error")
    assert page.evaluate("document.activeElement.id") == "api-key"  # focus went to the field
    page.fill("#api-key", KEY)
    page.click("#key-form button[type=submit]")
    page.wait_for_function("document.getElementById('method').options[0].value === 'dflash'")
    assert page.is_hidden("#error")


def ask(page, text: str) -> dict:
    """Send `text` and wait until its answer has streamed in; what the page then shows."""
    before = page.locator(".msg.assistant").count()
    page.fill("#prompt", text)
    page.press("#prompt", "Enter")
    page.wait_for_function(
        "n => document.querySelectorAll('.msg.assistant').length > n"
        " && document.body.dataset.state === 'idle'",
        arg=before,
        timeout=TURN,
    )
    return shown(page)


def shown(page) -> dict:
    return page.evaluate(
        """() => {
        const last = Array.from(document.querySelectorAll('.msg.assistant')).at(-1);
        const stat = (name) => {
            const dd = document.querySelector(`#final [data-stat="${name}"]`);
            return dd ? dd.textContent : null;
        };
        return {
            text: last.querySelector('.content').textContent,
            classes: last.className,
            drafted: Array.from(last.querySelectorAll('.drafted'))
                .reduce((n, e) => n + Array.from(e.textContent).length, 0),
            tau: document.getElementById('stat-tau').textContent,
            tps: document.getElementById('stat-tps').textContent,
            bars: document.querySelectorAll('#chart li').length,
            finish: stat('finish'), method: stat('method'), accepted: stat('accepted'),
            drafted_tokens: stat('drafted'), final_tau: stat('tau'),
        };
    }"""
    )


def check_stats(seen: dict) -> None:
    assert float(seen["tau"]) >= 1.0
    assert float(seen["tps"]) > 0
    assert float(seen["final_tau"]) >= 1.0
    assert seen["finish"] in ("stop", "length")
    accepted = int(seen["accepted"])
    if accepted:  # drafts were accepted: some of the answer is highlighted
        assert 0 < seen["drafted"] <= len(seen["text"])
    else:
        assert seen["drafted"] == accepted == 0
    if int(seen["drafted_tokens"]):
        assert seen["bars"] > 0  # acceptance per draft position


# --- tests ---------------------------------------------------------------------------------


def test_page_streams_answers_like_the_api(page, server):
    enter_key(page)
    page.fill("#max-tokens", "20")
    first = "The quick brown fox"
    seen = ask(page, first)
    assert seen["text"] and seen["method"] == "dflash"
    assert seen["text"] == api_answer(server, [{"role": "user", "content": first}], "dflash", 20)
    check_stats(seen)

    # the second turn resends the conversation; asked again, the model repeats itself,
    # which n-gram drafts from the first answer predict
    page.select_option("#method", "ngram")
    second = first
    again = ask(page, second)
    messages = [
        {"role": "user", "content": first},
        {"role": "assistant", "content": seen["text"]},
        {"role": "user", "content": second},
    ]
    assert again["method"] == "ngram"
    assert again["text"] == api_answer(server, messages, "ngram", 20)
    check_stats(again)
    assert page.locator(".msg.user").count() == 2
    assert int(again["accepted"]) > 0 and again["drafted"] > 0, "no drafted text highlighted"



def test_stop_then_new_chat(page, server):
    enter_key(page)
    page.fill("#max-tokens", "200")  # long enough to be stopped halfway
    page.fill("#prompt", "Speculative decoding")
    page.press("#prompt", "Enter")
    page.wait_for_function(
        "() => (document.querySelector('.msg.assistant .content')?.textContent ?? '') !== ''",
        timeout=TURN,
    )
    page.click("#stop")
    page.wait_for_function("document.body.dataset.state === 'idle'", timeout=TURN)
    seen = shown(page)
    assert seen["finish"] == "stopped" and "stopped" in seen["classes"]
    assert seen["text"]  # the part that came is kept
    assert page.is_enabled("#send") and page.is_disabled("#stop")

    page.click("#new-chat")
    assert page.locator(".msg").count() == 0
    page.fill("#max-tokens", "12")
    seen = ask(page, "The quick brown fox")  # the server answers again after the stop
    assert page.locator(".msg").count() == 2
    messages = [{"role": "user", "content": "The quick brown fox"}]
    assert seen["text"] == api_answer(server, messages, "dflash", 12)


def test_errors_are_shown(page, server):
    enter_key(page)
    long = "fox " * 400  # beyond the tiny model's 256-token context: a 413
    page.fill("#prompt", long)
    page.press("#prompt", "Enter")
    page.wait_for_selector("#error:not([hidden])", timeout=TURN)
    assert "context_length_exceeded" in page.inner_text("#error")
    assert page.locator(".msg").count() == 0  # the failed turn is dropped...
    assert page.input_value("#prompt") == long  # ...and its text given back to edit

    page.fill("#api-key", "wrong")
    page.click("#key-form button[type=submit]")
    page.wait_for_function("document.getElementById('error').textContent.includes('401')")
    assert page.evaluate("sessionStorage.getItem('specgen.apiKey')") == "wrong"


def test_events_are_parsed_wherever_the_bytes_split(page):
    """The page's SSE reader on a body cut at every byte (inside a character, a CRLF, a
    line, an event), with comments, CRLF and CR line ends and an unterminated last event."""
    got = page.evaluate(
        """async () => {
        const text = ': a comment\\r\\ndata: {"a": "🙂 é"}\\r\\n\\r\\ndata:{"b":1}\\r\\r'
            + 'event: x\\ndata: two\\ndata: lines\\n\\ndata: [DONE]';
        const bytes = new TextEncoder().encode(text);
        const results = [];
        for (let cut = 0; cut <= bytes.length; cut++) {
            const parts = [bytes.slice(0, cut), bytes.slice(cut)];
            const body = new ReadableStream({
                pull(controller) {
                    const part = parts.shift();
                    if (part === undefined) controller.close();
                    else controller.enqueue(part);
                },
            });
            const seen = [];
            await readEvents(body, (data) => seen.push(data));
            results.push(JSON.stringify(seen));
        }
        return results;
    }"""
    )
    want = ['{"a": "🙂 é"}', '{"b":1}', "two\nlines", "[DONE]"]
    assert all(r == json.dumps(want, ensure_ascii=False, separators=(",", ":")) for r in got)
