"""The status page in a real browser, and ``corral status``, against one real ``corral serve``.

One server for the module: 2,000 models (hard links to one small model), a memory budget that
holds two of them, a model that cannot load, and a token. Loading three models evicts the
first; loading the broken one fails: both must show in the page's event feed. The browser is
Debian's headless Chromium driven by Playwright (no browser is downloaded), one per module;
each test saves a screenshot under its tmp dir.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import subprocess
import sys
import threading
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from corral.testing import build_linear
from tests.helpers import ROOT, add_model
from tests.processes import ServerProcess, start_server, stop_server

TOKEN = "status-page-secret"
MODELS = 2000
CHROMIUM = "/usr/bin/chromium"
# Each model is about 99 kB: the budget holds two.
BUDGET = "250kB"


def call(url: str, method: str = "GET", token: str | None = TOKEN) -> bytes:
    request = urllib.request.Request(url, method=method)
    if token is not None:
        request.add_header("Authorization", f"Bearer {token}")
    with urllib.request.urlopen(request, timeout=30) as answer:
        return answer.read()


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    root = tmp_path_factory.mktemp("status-page")
    repo = root / "models"
    first = add_model(repo, "m0000", build_linear(seed=1))
    for number in range(1, MODELS):
        folder = repo / f"m{number:04d}" / "1"
        folder.mkdir(parents=True)
        os.link(first, folder / "model.onnx")
    add_model(repo, "broken", b"this is not an ONNX model")
    served = start_server(
        repo,
        root / "server.log",
        "--memory-budget",
        BUDGET,
        "--model-control-mode",
        "explicit",
        # The estimates stay the charges: a measure arriving later would re-charge and
        # evict while the page is read (measured charges on the page: test_status.py).
        "--no-measure-charges",
        environment={"CORRAL_AUTH_TOKEN": TOKEN},
    )
    try:
        base = f"http://{served.http}"
        for name in ("m0001", "m0002", "m0003"):  # the third evicts m0001
            call(f"{base}/v2/repository/models/{name}/load", "POST")
        with pytest.raises(urllib.error.HTTPError):
            call(f"{base}/v2/repository/models/broken/load", "POST")
        yield served
    finally:
        stop_server(served)


# -- corral status -----------------------------------------------------------------------------


def corral(*args: str) -> subprocess.CompletedProcess[str]:
    command = [sys.executable, "-c", "import sys; from corral.cli import main; sys.exit(main())"]
    env = {**os.environ, "COLUMNS": "200"}
    return subprocess.run(
        [*command, *args], capture_output=True, text=True, timeout=60, env=env, check=False
    )


@pytest.mark.timeout(120)
def test_corral_status_shows_the_models_the_budget_and_the_events(server: ServerProcess):
    shown = corral("status", f"http://{server.http}", "--token", TOKEN)
    assert shown.returncode == 0, shown.stderr
    out = shown.stdout
    for name in ("m0002", "m0003"):
        assert re.search(rf"{name}\s.*ready", out), out
    assert "of 244.1 KiB" in out  # the budget, 250,000 bytes
    assert "eviction" in out
    assert "load_failure" in out
    assert f"models ({MODELS + 1}:" in out


@pytest.mark.timeout(120)
def test_corral_status_refuses_without_the_token_and_prints_json_with_it(server: ServerProcess):
    refused = corral("status", f"http://{server.http}")
    assert refused.returncode == 1
    assert "needs a token" in refused.stderr
    assert "--token" in refused.stderr
    shown = corral("status", f"http://{server.http}", "--token", TOKEN, "--json", "--top", "5")
    assert shown.returncode == 0, shown.stderr
    document = json.loads(shown.stdout)
    assert document["server"]["memory_budget_bytes"] == 250_000
    assert len(document["models"]["rows"]) == 5


@pytest.mark.timeout(30)
def test_corral_status_names_a_refused_token_and_an_error_answer(server: ServerProcess):
    from corral.cli.status import StatusUnavailable, fetch_status

    with pytest.raises(StatusUnavailable, match="refused the token given with --token"):
        fetch_status(f"http://{server.http}", "wrong", 5)
    with pytest.raises(StatusUnavailable, match="answered 404: no such endpoint: /nope/v2"):
        fetch_status(f"http://{server.http}/nope", TOKEN, 5)


# A child inherits its parent's ignored and blocked signals, and late in the suite this
# process has SIGINT one or the other (a library an earlier test loaded): the watcher takes
# SIGINT back as a terminal gives it, so that only its own handling of it is tested.
_AS_FROM_A_TERMINAL = (
    "import signal, sys; "
    "signal.signal(signal.SIGINT, signal.default_int_handler); "
    "signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT}); "
    "from corral.cli import main; sys.exit(main())"
)


def _sigint_state() -> str:
    """This process's ignored and blocked signal masks, and its Python SIGINT handler."""
    with open("/proc/self/status") as status:
        masks = [line.strip() for line in status if line.startswith(("SigIgn", "SigBlk"))]
    return f"{', '.join(masks)}, handler {signal.getsignal(signal.SIGINT)!r}"


@pytest.mark.timeout(60)
def test_corral_status_watch_redraws_until_interrupted(server: ServerProcess):
    command = [sys.executable, "-c", _AS_FROM_A_TERMINAL]
    # A terminal as rich sees it, so that each redraw is written at once.
    env = {**os.environ, "COLUMNS": "200", "TTY_COMPATIBLE": "1"}
    watching = subprocess.Popen(
        [*command, "status", f"http://{server.http}", "--token", TOKEN, "--watch"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=env,
    )
    drain: threading.Thread | None = None
    try:
        seen = b""
        while b"m0003" not in seen:  # the first redraw (pytest-timeout bounds the wait)
            line = watching.stdout.readline()
            assert line, watching.stderr.read().decode()
            seen += line
        # Read on until it exits: a redraw into a full pipe would block it, interrupt or not.
        drain = threading.Thread(target=watching.stdout.read, name="drain-watch-stdout")
        drain.start()
        watching.send_signal(signal.SIGINT)
        try:
            code = watching.wait(timeout=30)
        except subprocess.TimeoutExpired:
            watching.kill()
            watching.wait(timeout=10)
            pytest.fail(
                "corral status --watch did not exit within 30 s of SIGINT; its stderr: "
                f"{watching.stderr.read().decode(errors='replace')}; the test's process: "
                f"{_sigint_state()}"
            )
        assert code == 130
        assert b"interrupted" in watching.stderr.read()
    finally:
        if watching.poll() is None:
            watching.kill()
            watching.wait(timeout=10)
        if drain is not None:
            drain.join(timeout=10)  # the pipe's end came with the process's
            assert not drain.is_alive()
        watching.stdout.close()
        watching.stderr.close()


# -- the page in a browser ---------------------------------------------------------------------


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    if not Path(CHROMIUM).exists():
        pytest.skip(f"{CHROMIUM} is missing: `make tools` installs Debian's chromium")
    playwright_api = pytest.importorskip("playwright.sync_api", reason="pip install playwright")
    with playwright_api.sync_playwright() as playwright:
        launched = playwright.chromium.launch(executable_path=CHROMIUM, headless=True)
        try:
            yield launched
        finally:
            launched.close()


@pytest.fixture
def page(browser: Any, server: ServerProcess, tmp_path: Path) -> Iterator[Any]:
    context = browser.new_context(viewport={"width": 1400, "height": 1000})
    opened = context.new_page()
    errors: list[str] = []
    opened.on("pageerror", lambda error: errors.append(str(error)))
    opened.on(
        "console",
        lambda message: errors.append(message.text) if message.type == "error" else None,
    )
    opened.goto(f"http://{server.http}/")
    try:
        yield opened
    finally:
        # Written here: with path=, Playwright writes on threads of its own loop that outlive
        # the test (and fail the leaked-thread check).
        (tmp_path / "status-page.png").write_bytes(opened.screenshot(full_page=True))
        context.close()
    # A 401 before the token is typed is logged by the browser; nothing else may be.
    assert [e for e in errors if "401" not in e] == []


def expect(locator: Any) -> Any:
    from playwright.sync_api import expect as playwright_expect

    return playwright_expect(locator)


def log_in(page: Any) -> None:
    page.fill("#token", TOKEN)
    page.click("#login-form button")
    page.wait_for_selector("#models tbody tr")


@pytest.mark.timeout(60)
def test_without_the_token_the_page_asks_for_it_and_shows_no_data(page: Any):
    page.wait_for_selector("#login", state="visible")
    assert page.is_hidden("#dashboard")
    assert page.locator("#models tbody tr").count() == 0
    assert page.locator("#events li").count() == 0
    assert page.evaluate("sessionStorage.length") == 0


@pytest.mark.timeout(60)
def test_the_table_lists_the_models_with_their_states_and_the_events(page: Any):
    log_in(page)
    assert page.evaluate("sessionStorage.getItem('corral-token')") == TOKEN
    assert page.evaluate("localStorage.length") == 0  # the session only
    page.click("th[data-sort='state']")  # ready first
    page.wait_for_selector("#models tbody tr:first-child[data-model='m0002']")
    states = {
        row.get_attribute("data-model"): row.locator("td.state").inner_text()
        for row in page.locator("#models tbody tr").all()[:2]
    }
    assert states == {"m0002": "ready", "m0003": "ready"}
    page.fill("#filter", "broken")
    # expect(), not wait_for_function: the page's CSP forbids evaluating strings as script.
    expect(page.locator("#models tbody tr")).to_have_count(1)
    row = page.locator("#models tbody tr")
    assert row.locator("td.state").inner_text() == "failed"
    assert "not an ONNX model" in row.locator("td.error").inner_text()
    feed = page.locator("#events")
    eviction = feed.locator("li[data-kind='eviction']").first.inner_text()
    assert "m0001" in eviction
    assert "make room for m0003" in eviction
    assert "broken" in feed.locator("li[data-kind='load_failure']").first.inner_text()
    row.click()
    page.wait_for_selector("#detail", state="visible")
    assert '"fix": "replace' in page.locator("#detail-body").inner_text()
    # It never loaded: no configuration yet, and a line saying when there will be one.
    expect(page.locator("#detail-config .note")).to_contain_text("shown once the model loads")
    assert page.locator("#detail-config table").count() == 0
    page.fill("#filter", "m0002")
    page.click("#models tbody tr[data-model='m0002']")
    expect(page.locator("#detail-config h3")).to_have_text("Configuration — corral's defaults")
    setting = "#detail-config table.config tr[data-key='{}'] td"
    expect(page.locator(setting.format("max_batch_size"))).to_have_text("64")
    expect(page.locator(setting.format("batching"))).to_contain_text("batched (probed)")


@pytest.mark.timeout(60)
def test_the_budget_bar_matches_the_metrics(page: Any, server: ServerProcess):
    log_in(page)
    metrics = call(f"http://{server.http}/metrics").decode()
    used = re.search(r"^corral_memory_used_bytes (\S+)$", metrics, re.M)
    budget = re.search(r"^corral_memory_budget_bytes (\S+)$", metrics, re.M)
    assert used
    assert budget
    bar = page.locator("#budget")
    assert int(bar.get_attribute("data-used")) == int(float(used[1]))
    assert int(bar.get_attribute("data-budget")) == int(float(budget[1])) == 250_000
    share = int(float(used[1])) / 250_000
    width = page.evaluate("document.getElementById('budget-fill').style.width")
    # Set as the share to one decimal; a browser reads "63.0%" back as "63%".
    assert width.endswith("%")
    assert float(width[:-1]) == pytest.approx(round(share * 100, 1))


@pytest.mark.timeout(60)
def test_sorting_and_filtering_2000_models(page: Any, tmp_path: Path):
    log_in(page)
    assert page.inner_text("#page-info") == f"page 1 of 41 · {MODELS + 1} matching"
    first = "#models tbody tr:first-child"
    assert page.get_attribute(first, "data-model") == "broken"  # names ascending
    page.click("th[data-sort='name']")  # now descending
    page.wait_for_selector(f"{first}[data-model='m1999']")
    assert page.locator("th.sorted-desc").inner_text() == "name"
    page.click("#next")
    page.wait_for_selector(f"{first}[data-model='m1949']")
    page.fill("#filter", "m19")
    expect(page.locator("#page-info")).to_have_text(re.compile(r" 100 matching$"))
    names = [row.get_attribute("data-model") for row in page.locator("#models tbody tr").all()]
    assert names == [f"m{n:04d}" for n in range(1999, 1949, -1)]
    (tmp_path / "filtered.png").write_bytes(page.screenshot())


def test_a_screenshot_is_committed_for_the_readme():
    shot = ROOT / "docs" / "status-page.png"
    assert shot.exists()
    assert shot.stat().st_size < 300_000
    assert "docs/status-page.png" in (shot.parent.parent / "README.md").read_text()


def _infer(server: ServerProcess, model: str, count: int) -> None:
    body = {"inputs": [{"name": "X", "datatype": "FP32", "shape": [1, 4], "data": [1, 2, 3, 4]}]}
    for _ in range(count):
        request = urllib.request.Request(
            f"http://{server.http}/v2/models/{model}/infer",
            data=json.dumps(body).encode(),
            method="POST",
            headers={"Authorization": f"Bearer {TOKEN}", "Content-Type": "application/json"},
        )
        with urllib.request.urlopen(request, timeout=30) as answer:
            assert answer.status == 200


# "in the bucket from 0.50 ms to 1.0 ms, estimated linearly within it, as Prometheus' ..."
_BUCKET_TITLE = re.compile(r"in the bucket from ([\d.]+) ms to ([\d.]+) ms, estimated linearly")


@contextlib.contextmanager
def _steady_traffic(server: ServerProcess, model: str) -> Iterator[None]:
    """Requests to ``model``, about 20 a second, while the block runs.

    The figures are over a window (the server's last 10 s, a model's last 10 s window): a
    burst sent before a slow page shows them could leave the window first.
    """
    done = threading.Event()
    failures: list[BaseException] = []

    def send() -> None:
        try:
            while not done.wait(0.05):
                _infer(server, model, 1)
        except BaseException as exc:  # reported on the test's thread below
            failures.append(exc)

    sender = threading.Thread(target=send, name="steady-traffic")
    sender.start()
    try:
        yield
    finally:
        done.set()
        sender.join(timeout=60)
    assert not sender.is_alive()
    assert not failures, failures


def _in_its_bucket(figure: Any, title_and_value: str, timeout_s: int) -> None:
    """Wait for ``figure``'s title to name a bucket; its value must lie in that bucket.

    ``title_and_value`` reads both in one evaluation: the page redraws them together.
    """
    expect(figure).to_have_attribute("title", _BUCKET_TITLE, timeout=timeout_s * 1000)
    title, value = figure.evaluate(title_and_value)
    bucket = _BUCKET_TITLE.search(title)
    assert bucket is not None, title
    assert float(bucket[1]) <= float(value) <= float(bucket[2]), (title, value)


@pytest.mark.timeout(90)
def test_quantiles_name_their_bucket_on_hover_and_the_charts_have_a_scale(
    page: Any, server: ServerProcess
):
    """Issue 33, item 8: p50/p99 were bucket bounds with nothing to say so; no chart scale."""
    with _steady_traffic(server, "m0002"):
        log_in(page)
        # The server's figures: sampled every 2 s; the title names the bucket, the value is
        # in it (both read at once: the page redraws them together every 2 s).
        card = page.locator("#figures .card[data-figure='p50 ms']")
        _in_its_bucket(card, "card => [card.title, card.querySelector('.value').innerText]", 20)
        # Each chart has a scale: three y ticks with the unit, the first and last times below.
        units = {
            "chart-rate": r" req/s$",
            "chart-p99": r" ms$",
            "chart-memory": r" (B|KiB|MiB|GiB)$",
        }
        for chart, unit in units.items():
            ticks = page.locator(f"#{chart} text.tick-y")
            expect(ticks).to_have_count(3, timeout=20_000)
            labels = ticks.all_text_contents()  # SVG text has no innerText
            assert all(re.search(unit, label) for label in labels), (chart, labels)
            assert labels[0].startswith("0"), labels  # the axis starts at 0
            expect(page.locator(f"#{chart} text.tick-x")).to_have_count(2)
        # A model's row: its figures come every 10 s (the model window).
        page.fill("#filter", "m0002")
        cell = page.locator("#models tbody tr[data-model='m0002'] td.p99")
        _in_its_bucket(cell, "cell => [cell.title, cell.innerText]", 40)
