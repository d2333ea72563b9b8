"""The ``/ui`` page in a real headless browser (Selenium + Chromium) against a live server: the key is typed on the
page, a wrong one is refused with a clear message, a question's trace streams in with its answer and citations, the
three modes are searched side by side, and a graph result's evidence subgraph is drawn with its seeds, weights and
paths, labelled inside the drawing; passages open to their text, citations lead to them, the subgraph closes, and the
API docs render offline. The documents tab lists, searches, uploads and deletes documents, following each job. With
UPDATE_DOCS_SCREENSHOT=1 they save docs/img/ui.png and docs/img/ui-documents.png, the screenshots the docs show.

Skips, saying why, only where no browser can be started: selenium not installed, or no chromium/chromedriver."""

from __future__ import annotations

import base64
import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from routerag.config import Settings
from routerag.engine import Engine
from routerag.retrieval import Retriever
from server.app import create_app

from .helpers.server_helpers import RoutingPolicy, live_server

Q = "Where was Joran Veld born?"
KEY = "ui-key"
SCREENSHOT = Path(__file__).resolve().parents[1] / "docs" / "img" / "ui.png"
BROWSERS = ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable")
DRIVERS = ("chromedriver",)


def _found(names: tuple[str, ...], env: str) -> str | None:
    given = os.environ.get(env)
    if given:
        return given if Path(given).exists() else None
    return next((p for p in map(shutil.which, names) if p), None)


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    webdriver = pytest.importorskip("selenium.webdriver", reason="selenium is not installed (the `test` extra)")
    from selenium.common.exceptions import WebDriverException

    binary = _found(BROWSERS, "CHROME_BIN")
    driver_path = _found(DRIVERS, "CHROMEDRIVER_PATH")
    if binary is None or driver_path is None:
        pytest.skip(f"no browser to drive: chromium {'found' if binary else 'not found'}, chromedriver "
                    f"{'found' if driver_path else 'not found'} (Debian: apt-get install chromium chromium-driver; "
                    "or set CHROME_BIN and CHROMEDRIVER_PATH)")
    options = webdriver.ChromeOptions()
    options.binary_location = binary
    for arg in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--disable-gpu",
                "--window-size=1400,1000", "--force-device-scale-factor=1", "--lang=en-US"):
        options.add_argument(arg)
    try:
        driver = webdriver.Chrome(options=options, service=webdriver.ChromeService(executable_path=driver_path))
    except WebDriverException as exc:
        pytest.skip(f"chromium could not be started: {exc.msg or exc}".splitlines()[0])
    driver.set_page_load_timeout(60)
    try:
        yield driver
    finally:
        driver.quit()


@pytest.fixture(scope="module")
def ui_url(index: Path, retriever: Retriever) -> Iterator[str]:
    settings = Settings(server={"api_key": KEY})
    engine = Engine(index, settings, generator=RoutingPolicy("[graph]"), retriever=retriever)
    engine.warm_up()
    with live_server(create_app(engine, settings)) as url:
        yield url


def _wait(driver: Any, condition: Any, timeout: float = 60) -> Any:
    """``condition`` once it holds; an element the page replaced while it was read (a list re-rendered) is read
    again on the next poll."""
    from selenium.common.exceptions import StaleElementReferenceException
    from selenium.webdriver.support.ui import WebDriverWait

    return WebDriverWait(driver, timeout, ignored_exceptions=(StaleElementReferenceException,)).until(condition)


def test_the_page_streams_an_answer_and_draws_its_evidence(browser: Any, ui_url: str, retriever: Retriever) -> None:
    from selenium.webdriver.common.by import By

    def find(css: str) -> Any:
        return browser.find_element(By.CSS_SELECTOR, css)

    def all_of(css: str) -> list[Any]:
        return browser.find_elements(By.CSS_SELECTOR, css)

    def use_key(key: str) -> None:
        field = find("#api-key")
        field.clear()
        field.send_keys(key)
        find("#key-save").click()

    browser.get(f"{ui_url}/ui")
    assert browser.title == "RouteRAG — see why"
    expected = retriever.search([Q], mode="graph", k=3)[0].docs

    # a wrong key: refused, and the page says so
    use_key("not-the-key")
    _wait(browser, lambda d: "401" in find("#status").text)
    assert "refused the API key" in find("#status").text and "error" in find("#status").get_attribute("class")
    find("#question").send_keys(Q)
    find("#ask-button").click()
    _wait(browser, lambda d: "401" in find("#status").text and not find("#ask-button").get_property("disabled"))
    assert not all_of("#trace li") and find("#answer").get_property("hidden")

    # the right key: the index list loads, the key is kept for this tab only
    use_key(KEY)
    _wait(browser, lambda d: "Key accepted" in find("#status").text)
    assert [o.text for o in all_of("#index option")] == ["idx"]
    assert browser.execute_script("return sessionStorage.getItem('routerag.apiKey')") == KEY
    assert browser.execute_script("return localStorage.length") == 0

    # ask: the streamed trace, then the answer with its citations
    find("#ask-button").click()
    _wait(browser, lambda d: find("#answer").is_displayed())
    steps = [li.get_attribute("class") for li in all_of("#trace > li")]
    assert steps == ["step step-think", "step step-search", "step step-information", "step step-think",
                     "step step-draft", "step step-final"], steps
    # one answer, labelled: the policy's draft in the trace, the final answer (and who wrote it) in the box
    draft, final = find("#trace .step-draft"), find("#trace .step-final")
    assert draft.find_element(By.CSS_SELECTOR, ".tag").text == "DRAFT" and "the policy's draft" in draft.text
    assert final.find_element(By.CSS_SELECTOR, ".tag").text == "FINAL"
    assert f"{expected[0].title} the final answer, by the policy" in final.text
    assert find("#answer-by").text == "by the policy" and not find("#answer-draft").is_displayed()
    assert f"[graph] {Q}" in find("#trace .step-search").text
    assert [li.find_element(By.CSS_SELECTOR, ".doc-title").text for li in all_of("#trace .step-information .doc")] \
        == [d.title for d in expected]
    assert find("#answer-text").text == expected[0].title
    citations = all_of("#citations .citation")
    assert citations and citations[0].get_attribute("data-id") == expected[0].id
    assert "Tarsk" in citations[0].text and "1 search(es)" in find("#answer-meta").text
    # a passage opens to its whole text; a citation leads to its passage in the trace
    first = all_of("#trace .step-information .doc")[0]
    passage = first.find_element(By.CSS_SELECTOR, "details.passage-text")
    assert passage.get_property("open") is False
    passage.find_element(By.TAG_NAME, "summary").click()
    assert passage.get_property("open") and passage.find_element(By.TAG_NAME, "p").text == expected[0].text
    passage.find_element(By.TAG_NAME, "summary").click()  # closed again
    citations[0].find_element(By.CSS_SELECTOR, "a.cite-link").click()
    cited = all_of("#trace .doc.cited")
    assert [d.get_attribute("data-id") for d in cited] == [expected[0].id]
    assert cited[0].find_element(By.CSS_SELECTOR, "details").get_property("open")

    # search every mode side by side
    find("#search-query").send_keys(Q)
    find("#search-button").click()
    for mode in ("passage", "graph", "hybrid"):
        _wait(browser, lambda d, m=mode: len(all_of(f'.column[data-mode="{m}"] li.doc')) == 3)
    graph_titles = [e.text for e in all_of('.column[data-mode="graph"] .doc-title')]
    assert graph_titles == [d.title for d in expected]
    assert not all_of('.column[data-mode="passage"] .why') and len(all_of('.column[data-mode="hybrid"] .why')) == 3

    # the evidence subgraph of the graph search's third result (Tarsk: reached through the entity "tarsk")
    all_of('.column[data-mode="graph"] .why')[2].click()
    _wait(browser, lambda d: find("#explain-panel").is_displayed() and len(all_of("#graph .node")) > 0)
    nodes = all_of("#graph .node")
    assert 3 < len(nodes) <= 40
    kinds = {n.get_attribute("data-kind") for n in nodes}
    assert kinds == {"entity", "passage"}
    tops = all_of("#graph .node.top")
    assert len(tops) == 3 and all(n.get_attribute("data-kind") == "passage" for n in tops)
    focus = find("#graph .node.focus")
    assert focus.find_element(By.CSS_SELECTOR, ".node-label").text == "#3 Tarsk"
    # the seeds, with their weights, in the drawing and beside it
    seed_weights = [w.text for w in all_of("#graph .node.seed .seed-weight")]
    assert seed_weights and all(w.startswith("seed ") and float(w.split()[1]) > 0 for w in seed_weights)
    listed = [e.text for e in all_of("#seed-entities .seed-entity")]
    assert any(t.startswith("joran veld ") and "fact, query" in t for t in listed), listed
    assert "joran veld — born in → tarsk" in find("#seed-facts").text
    # the strongest path to each top passage, drawn as highlighted edges
    focused = find("#paths li.passage.focus")
    assert focused.find_element(By.CSS_SELECTOR, ".doc-title").text == "Tarsk"
    paths = focused.find_elements(By.CSS_SELECTOR, "li.path")
    assert paths and paths[0].text.startswith("tarsk → Tarsk")
    assert all_of("#graph .edge.on-path") and all_of("#graph .edge.relation")
    assert "graph nodes drawn (limit 40)" in find("#explain-note").text
    # node size follows PageRank mass: the heaviest drawn vertex is the largest
    sizes = browser.execute_script("""
        return [...document.querySelectorAll('#graph .node')].map(g => {
          const shape = g.querySelector('circle, rect');
          const r = shape.tagName === 'circle' ? +shape.getAttribute('r') : +shape.getAttribute('width') / 2;
          return [Number(g.dataset.mass), r];
        });""")
    assert max(sizes)[1] == max(r for _, r in sizes)
    # every label whole inside the drawing (its viewBox is 960 x 600)
    outside = browser.execute_script("""
        return [...document.querySelectorAll('#graph text')].map(t => [t.textContent, t.getBBox()])
          .filter(([, b]) => b.x < 0 || b.y < 0 || b.x + b.width > 960 || b.y + b.height > 600)
          .map(([name]) => name);""")
    assert outside == [], outside

    # the screenshot for the docs: the whole page, beyond the window (Chromium's DevTools protocol)
    assert _screenshot(browser, SCREENSHOT.name).stat().st_size > 10_000

    # the subgraph panel closes
    find("#explain-close").click()
    assert not find("#explain-panel").is_displayed() and find("#ask-panel").is_displayed()

    # the API docs render offline: every file they load comes from this server (the machine has no network)
    browser.get(f"{ui_url}/docs")
    _wait(browser, lambda d: "RouteRAG server" in (all_of(".swagger-ui .info .title") or [None])[0].text
          if all_of(".swagger-ui .info .title") else False)
    loaded = browser.execute_script("return performance.getEntriesByType('resource').map(e => e.name)")
    assert loaded and all(u.startswith(ui_url) for u in loaded), loaded


def _screenshot(browser: Any, name: str) -> Path:
    """The whole page as a PNG (Chromium's DevTools protocol: beyond the window too): docs/img/NAME with
    UPDATE_DOCS_SCREENSHOT=1, else a temporary file (a test run leaves the tree clean)."""
    width, height = browser.execute_script(
        "return [document.documentElement.scrollWidth, document.documentElement.scrollHeight]")
    shot = browser.execute_cdp_cmd("Page.captureScreenshot", {
        "format": "png", "captureBeyondViewport": True,
        "clip": {"x": 0, "y": 0, "width": width, "height": min(height, 3000), "scale": 1}})
    target = (SCREENSHOT.parent if os.environ.get("UPDATE_DOCS_SCREENSHOT") else Path(tempfile.mkdtemp())) / name
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_bytes(base64.b64decode(shot["data"]))
    return target


def test_the_documents_tab_lists_uploads_and_deletes(browser: Any, tmp_path: Path, minilm, spacy_extractor) -> None:
    from selenium.webdriver.common.by import By

    from .helpers.server_helpers import build_small_index
    from .test_ingestion import make_app as make_writable_app

    def find(css: str) -> Any:
        return browser.find_element(By.CSS_SELECTOR, css)

    def all_of(css: str) -> list[Any]:
        return browser.find_elements(By.CSS_SELECTOR, css)

    def search(text: str) -> None:
        field = find("#doc-search")
        field.clear()
        if text:
            field.send_keys(text)
        find("#doc-search-button").click()

    def rows() -> list[str]:  # read in one script: the list may be re-rendered between two element reads
        return browser.execute_script(
            "return [...document.querySelectorAll('#doc-list tr.document')].map(r => r.dataset.id)")

    app, _ = make_writable_app({"idx": build_small_index(tmp_path / "idx", minilm, spacy_extractor)}, minilm,
                               spacy_extractor, api_key=KEY)
    upload = tmp_path / "luthiers.jsonl"
    upload.write_text('{"id": "lute-1", "title": "Orla Brisk", "text": "Orla Brisk builds lutes in Harrow."}\n'
                      '{"id": "lute-2", "title": "Harrow", "text": "Harrow is a town of lute makers and bells."}\n')
    with live_server(app) as url:
        browser.get(f"{url}/ui")
        find("#api-key").clear()
        find("#api-key").send_keys(KEY)
        find("#key-save").click()
        _wait(browser, lambda d: "Key accepted" in find("#status").text)
        find('#tabs .tab[data-tab="documents"]').click()
        _wait(browser, lambda d: len(rows()) == 10)
        assert find("#doc-count").text == "1–10 of 10 in idx"
        assert not find("#ask-panel").is_displayed() and find("#doc-next").get_property("disabled")

        # search by title, and a document's whole text on a click
        search("joran")
        _wait(browser, lambda d: len(rows()) == 2)
        assert 'matching “joran”' in find("#doc-count").text
        first = all_of("#doc-list tr.document")[0]
        first.find_element(By.TAG_NAME, "summary").click()
        assert "glassblower" in first.find_element(By.CSS_SELECTOR, "details p").text

        # upload a JSONL file: a job, followed to done, and the new documents listed
        find("#doc-file").send_keys(str(upload))
        find("#doc-upload").click()
        _wait(browser, lambda d: all_of('#doc-jobs li[data-state="done"]'), timeout=120)
        assert "2 added" in find("#doc-jobs li").text
        search("")
        _wait(browser, lambda d: "of 12 in idx" in find("#doc-count").text)
        search("brisk")
        _wait(browser, lambda d: rows() == ["lute-1"])

        # delete it (the page asks first): a second job, then it is gone
        all_of("#doc-list tr.document button.delete")[0].click()
        _wait(browser, lambda d: d.switch_to.alert).accept()
        _wait(browser, lambda d: len(all_of('#doc-jobs li[data-state="done"]')) == 2, timeout=120)
        _wait(browser, lambda d: rows() == [] and "none matching" in find("#doc-count").text)
        search("")
        _wait(browser, lambda d: "of 11 in idx" in find("#doc-count").text)
        assert "lute-2" in rows() and "lute-1" not in rows()
        assert _screenshot(browser, "ui-documents.png").stat().st_size > 10_000

        # back to asking: the tab shows the ask and search panels again, the subgraph panel stays closed
        find('#tabs .tab[data-tab="ask"]').click()
        assert find("#ask-panel").is_displayed() and not find("#documents-panel").is_displayed()
        assert not find("#explain-panel").is_displayed()
