"""The chat page in a real browser (Debian's headless Chromium driven by Playwright) against
``nightjar up`` serving the bundled target with a drafter at γ = 2: a message is sent, the
answer streams in with some tokens marked accepted drafts and some the target's own, equal to
what the API answers; the planner tab shows the decision per batch size. Screenshots of both
tabs are saved (``NIGHTJAR_TEST_ARTIFACTS``, default: the test's tmp dir)."""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.live_gateway import DRAFTER, nightjar_up

pytestmark = pytest.mark.slow

CHROMIUM = os.environ.get("NIGHTJAR_CHROMIUM", "/usr/bin/chromium")
# No browser download exists here: Debian's Chromium, launched by path (.ci/run installs it).
ARGS = [
    "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
    "--disable-background-networking", "--disable-component-update", "--disable-sync",
]  # fmt: skip
MESSAGE = "Tell me a story about a king"


@pytest.fixture(scope="module")
def live(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    with nightjar_up(gamma=2, log=tmp_path_factory.mktemp("up") / "nightjar-up.log") as base:
        yield base


@pytest.fixture
def artifacts(tmp_path: Path) -> Path:
    out = Path(os.environ.get("NIGHTJAR_TEST_ARTIFACTS", tmp_path))
    out.mkdir(parents=True, exist_ok=True)
    return out


def test_the_chat_page_marks_drafted_tokens_and_shows_the_planner(live: str, artifacts: Path) -> None:
    if not Path(CHROMIUM).is_file():
        pytest.fail(f"no Chromium at {CHROMIUM}: apt-get install -y chromium (.ci/run does)")
    from playwright.sync_api import sync_playwright

    answer = httpx.post(
        live + "/v1/chat/completions",
        json={"messages": [{"role": "user", "content": MESSAGE}], "max_tokens": 128, "temperature": 0},
        timeout=120,
    ).json()["choices"][0]["message"]["content"]
    profile = tempfile.mkdtemp(prefix="nightjar-chromium-")
    try:
        with sync_playwright() as pw:
            browser = pw.chromium.launch_persistent_context(
                profile,
                executable_path=CHROMIUM,
                headless=True,
                args=ARGS,
                viewport={"width": 1100, "height": 800},
            )
            page = browser.new_page()
            errors: list[str] = []
            page.on("pageerror", lambda e: errors.append(str(e)))
            page.goto(live + "/")
            # selectors, not wait_for_function: the page's CSP forbids the eval that would need
            page.wait_for_selector("#model option", state="attached", timeout=30_000)
            page.fill("#prompt", MESSAGE)
            page.click("#send")
            page.wait_for_selector(".msg.assistant[data-done='true']", timeout=120_000)

            bubble = page.locator(".msg.assistant")
            drafted = bubble.locator(".tok.drafted").count()
            target = bubble.locator(".tok.target").count()
            assert drafted > 0 and target > 0, (drafted, target)
            shown = "".join(bubble.locator(".tok").all_text_contents())
            assert shown == answer  # the page shows exactly what the API answers (greedy)
            assert page.inner_text("#stat-drafter") == DRAFTER.name
            steps = int(page.inner_text("#stat-steps"))
            assert steps > 0 and page.locator("#steps .step").count() == steps
            assert page.locator("#steps .step.hit").count() > 0
            assert "%" in page.inner_text("#stat-accept") and page.inner_text("#stat-tps") != "-"
            # a drafted token whose text another completed (a split character) shows no span
            assert int(page.inner_text("#stat-drafted")) >= drafted_tokens(page) > 0
            assert page.get_attribute(".msg.assistant", "data-finish") in ("stop", "length")
            page.screenshot(path=str(artifacts / "chat.png"), full_page=True)

            page.click("#tab-planner")
            page.wait_for_selector("#gamma-table tbody tr.bucket", timeout=30_000)
            assert page.is_hidden("#panel-chat") and page.is_visible("#panel-planner")
            row = page.locator("#gamma-table tbody tr.bucket").first.locator("td").all_text_contents()
            assert row[1] == "2", row  # static gamma=2: decided γ for every batch size
            assert "policy static" in page.inner_text("#planner-summary")
            workers = page.locator("#workers-table tbody tr").first.locator("td").all_text_contents()
            assert workers[7] == DRAFTER.name, workers
            page.screenshot(path=str(artifacts / "planner.png"), full_page=True)
            assert not errors, errors
            browser.close()
    finally:
        shutil.rmtree(profile, ignore_errors=True)
    assert (artifacts / "chat.png").stat().st_size > 0 and (artifacts / "planner.png").stat().st_size > 0


def drafted_tokens(page: object) -> int:
    """Distinct output tokens the page marked as accepted drafts."""
    return int(
        page.evaluate(  # type: ignore[attr-defined]
            "new Set([...document.querySelectorAll('.msg.assistant .tok.drafted')]"
            ".map(e => e.dataset.token)).size"
        )
    )
