"""The status page and /docs as a person sees them: a real headless Chromium (Debian's, offline,
nothing but loopback) against a running daemon with the real Triton.

GPU utilisation comes from the test exporter (Triton here has no GPU); every deploy, rollback
and reload is real. The page is never reloaded by the test: what changes on it after a deploy
got there through its own refresh, which a marker left in the page's window proves.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from selenium import webdriver
from selenium.webdriver.common.by import By

from tests.integration.conftest import DaemonFactory
from tests.support.browser import (
    WINDOW,
    chromium,
    console_errors,
    loaded_from,
    remote,
    screenshot,
    viewport,
)
from tests.support.daemon import Daemon
from tests.support.gpu_exporter import GpuExporter
from tests.support.models import write_scale_release
from tests.support.polling import eventually

pytestmark = pytest.mark.triton

WINDOW_SECONDS = 3.0
INTERVAL = 0.5
MIN_PNG_BYTES = 20_000
MIN_COLOURS = 16


@pytest.fixture
def browser(tmp_path: Path) -> Iterator[webdriver.Chrome]:
    with chromium(tmp_path / "chromium-profile") as driver:
        yield driver


def _config(exporter: GpuExporter, model: str) -> str:
    return (
        "rollback:\n"
        f"  metrics_url: {exporter.url}\n"
        f"  window_seconds: {WINDOW_SECONDS}\n"
        f"  interval_seconds: {INTERVAL}\n"
        "models:\n"
        f"  {model}:\n"
        "    retire_after_seconds: 600\n"
    )


# The page's script swaps its content every 2 s, so an element found now may be gone a moment
# later (selenium's StaleElementReferenceException): each read is one script in the page.
_READ = """
const found = document.querySelector(arguments[0]);
if (!found) { return null; }
return arguments[1] ? found.getAttribute(arguments[1]) : found.textContent.trim();
"""


def _read(driver: webdriver.Chrome, selector: str, attribute: str = "") -> str:
    """The text (or ``attribute``) of the first element ``selector`` finds; '' without one."""
    value = driver.execute_script(_READ, selector, attribute)
    return "" if value is None else str(value)


def _field(driver: webdriver.Chrome, model: str, field: str) -> str:
    """The text of one field of the model's section, as the browser shows it now."""
    return _read(driver, f'section[data-model="{model}"] [data-field="{field}"]')


def _plot(driver: webdriver.Chrome, model: str, attribute: str) -> int:
    return int(_read(driver, f'section[data-model="{model}"] svg.gpu-plot', attribute) or 0)


def _deployed(daemon: Daemon, model: str, release: str) -> None:
    response = daemon.deploy(model, release)
    assert response.status_code == 200, response.text


def test_the_page_shows_releases_and_the_gpu_plot_and_follows_a_rollback_and_a_deploy(
    daemons: DaemonFactory,
    store: Path,
    model_name: str,
    browser: webdriver.Chrome,
    tmp_path: Path,
) -> None:
    for release, k in (("r1", 1.0), ("r2", 2.0), ("r3", 3.0)):
        write_scale_release(store, model_name, release, k=k)
    with GpuExporter() as exporter:
        exporter.set(gpu0=0.30)
        daemon = daemons(store, config=_config(exporter, model_name))
        _deployed(daemon, model_name, "r1")
        _deployed(daemon, model_name, "r2")

        site = remote(daemon.url)
        browser.get(f"{site}/")
        section = f'section[data-model="{model_name}"]'
        assert _read(browser, f"{section} h2").startswith(model_name)
        assert _field(browser, model_name, "desired").startswith("r2")
        assert _field(browser, model_name, "serving") == "r2"
        assert _field(browser, model_name, "member-serving") == "r2"
        assert _read(browser, f"{section} svg.gpu-plot line.threshold", "class") == "threshold"
        header = browser.find_element(By.TAG_NAME, "header")
        assert header.value_of_css_property("background-color") == "rgba(38, 50, 56, 1)"
        browser.execute_script("window.notReloaded = true;")
        eventually(
            lambda: _plot(browser, model_name, "data-samples") >= 3,
            20,
            "GPU samples drawn on the page's plot",
        )

        # Held overload: the watcher rolls back to r1; the page marks it on the plot.
        exporter.set(gpu0=0.99)
        eventually(
            lambda: (
                _plot(browser, model_name, "data-rollbacks") == 1
                and _field(browser, model_name, "serving") == "r1"
            ),
            WINDOW_SECONDS + 30,
            "the rollback to r1 on the page",
            every=0.2,
        )
        exporter.set(gpu0=0.30)
        assert "r2" in _field(browser, model_name, "degraded")

        picture = tmp_path / "status-page.png"
        size, colours = screenshot(browser, picture)
        assert size == viewport(browser)
        assert size[0] == WINDOW[0]
        assert picture.stat().st_size > MIN_PNG_BYTES
        assert colours >= MIN_COLOURS  # text, tables and the plot, not a blank page

        _deployed(daemon, model_name, "r3")
        eventually(
            lambda: (
                _field(browser, model_name, "serving") == "r3"
                and _field(browser, model_name, "desired").startswith("r3")
            ),
            15,
            "r3 shown by the page's own refresh",
            every=0.2,
        )
        assert browser.execute_script("return window.notReloaded === true;")
        assert console_errors(browser) == []  # nothing refused by the page's policy
        assert {url.split("?")[0] for url in loaded_from(browser)} <= {
            f"{site}/ui/refresh.js",
            f"{site}/ui/status",
        }


@pytest.mark.parametrize("credentials", ["", "ops:secret@"], ids=["plain", "user-in-address"])
def test_docs_render_offline_with_the_apis_operations(
    daemons: DaemonFactory,
    store: Path,
    browser: webdriver.Chrome,
    tmp_path: Path,
    credentials: str,
) -> None:
    """Also from an address that carries HTTP Basic (``http://ops:TOKEN@cp/docs``, as the status
    page's link is then): the document is fetched without them in its URL, or the browser
    refuses the fetch and Swagger UI shows no operation."""
    daemon = daemons(store)
    document = daemon.get("/openapi.json").json()
    deploy = document["paths"]["/v1/models/{name}/deploy"]["post"]

    site = remote(daemon.url)
    browser.get(site.replace("//", f"//{credentials}", 1) + "/docs")
    eventually(
        lambda: any(
            block.find_element(By.CSS_SELECTOR, ".opblock-summary-path").text
            == "/v1/models/{name}/deploy"
            for block in browser.find_elements(By.CSS_SELECTOR, ".opblock-post")
        ),
        30,
        "the deploy operation in Swagger UI",
    )
    summaries = [e.text for e in browser.find_elements(By.CSS_SELECTOR, ".opblock-summary")]
    assert any(deploy["summary"] in text for text in summaries), summaries
    assert deploy["summary"] == "Deploy a release of a model."  # a sentence, not "Deploy"
    # The bearer scheme is declared even on a daemon without a token: Authorize is there.
    authorize = browser.find_elements(By.CSS_SELECTOR, "button.authorize")
    assert [button.is_displayed() for button in authorize] == [True]
    loaded = [url.replace(credentials, "", 1) for url in loaded_from(browser)]
    assert all(url.startswith(f"{site}/") for url in loaded), loaded
    assert console_errors(browser) == []
    size, colours = screenshot(browser, tmp_path / "docs.png")
    assert size == viewport(browser)
    assert colours >= MIN_COLOURS


def test_the_page_refreshes_when_its_address_carries_a_user_and_password(
    daemons: DaemonFactory, store: Path, browser: webdriver.Chrome
) -> None:
    """HTTP Basic in the address (``http://user:token@host/``), as a person may open a daemon
    behind the read token: the page's own fetches must not carry them in their URLs (the
    browser refuses such a fetch), yet reach the daemon."""
    daemon = daemons(store)
    site = remote(daemon.url)
    browser.get(site.replace("//", "//ops:secret@", 1) + "/")

    def refreshed() -> bool:
        return any(url.endswith("/ui/status") for url in loaded_from(browser))

    eventually(refreshed, 15, "a refresh of the page's content")
    note = browser.find_element(By.ID, "refresh-note").text
    assert "failed" not in note, note
    assert all("secret" not in url for url in loaded_from(browser) if "/ui/status" in url)
