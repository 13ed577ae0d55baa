"""A real headless browser for tests: Debian's Chromium driven by selenium through Debian's
chromedriver, both given by path, so Selenium Manager never looks for (or downloads) either.

The browser reaches nothing but loopback: its own background connections (updates, sync,
safe browsing) are switched off, and every host name resolves to nothing but
:data:`REMOTE_HOST`, which is 127.0.0.1, so a page that needs a CDN renders as it would on an
air-gapped cluster. Tests open the daemon by that name (:func:`remote`), as a person opens a
daemon on another host: nothing that browsers or Swagger UI allow loopback alone is relied on.
What the page loaded is read back from the Resource Timing entries (:func:`loaded_from`).
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from PIL import Image
from selenium import webdriver
from selenium.webdriver.chrome.service import Service
from selenium.webdriver.remote.command import Command

CHROMIUM = "/usr/bin/chromium"
CHROMEDRIVER = "/usr/bin/chromedriver"
WINDOW = (1280, 1000)
REMOTE_HOST = "controlplane.test"
FLAGS = (
    "--headless=new",
    "--no-sandbox",
    "--disable-gpu",
    # Without these Chromium opens connections of its own, which this machine refuses.
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
    "--disable-dev-shm-usage",
    f"--window-size={WINDOW[0]},{WINDOW[1]}",
    # No network but loopback, whatever the machine has.
    f"--host-resolver-rules=MAP {REMOTE_HOST} 127.0.0.1, MAP * ~NOTFOUND, EXCLUDE 127.0.0.1",
)


@contextmanager
def chromium(profile: Path) -> Iterator[webdriver.Chrome]:
    """A headless Chromium with a fresh profile under ``profile``; quit on exit."""
    for path in (CHROMIUM, CHROMEDRIVER):
        if not os.access(path, os.X_OK):
            raise RuntimeError(
                f"{path} is missing: the browser tests need Debian's chromium and "
                "chromium-driver (tools/system-deps.sh installs them)"
            )
    os.environ["SE_OFFLINE"] = "true"  # Selenium Manager, were it ever asked, stays offline
    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for flag in FLAGS:
        options.add_argument(flag)
    profile.mkdir(parents=True, exist_ok=True)
    options.add_argument(f"--user-data-dir={profile}")
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})  # for console_errors
    driver = webdriver.Chrome(options=options, service=Service(CHROMEDRIVER))
    try:
        driver.set_page_load_timeout(60)
        yield driver
    finally:
        driver.quit()


def remote(url: str) -> str:
    """``url`` (a daemon on 127.0.0.1) by the name the browser resolves to it."""
    return url.replace("//127.0.0.1:", f"//{REMOTE_HOST}:", 1)


def loaded_from(driver: webdriver.Chrome) -> list[str]:
    """Every URL the current page loaded (scripts, styles, fetches, images)."""
    names: list[str] = driver.execute_script(
        "return performance.getEntriesByType('resource').map(function (e) { return e.name; })"
    )
    return names


def console_errors(driver: webdriver.Chrome) -> list[str]:
    """What the page logged as errors since the last call: failed loads, refused content (a
    Content-Security-Policy violation), script errors."""
    entries: list[dict[str, str]] = driver.execute(Command.GET_LOG, {"type": "browser"})["value"]
    return [e["message"] for e in entries if e.get("level") == "SEVERE"]


def viewport(driver: webdriver.Chrome) -> tuple[int, int]:
    """The size in device pixels of what the window shows (the window less its frame)."""
    width, height = driver.execute_script(
        "return [Math.round(window.innerWidth * window.devicePixelRatio),"
        " Math.round(window.innerHeight * window.devicePixelRatio)];"
    )
    return int(width), int(height)


def screenshot(driver: webdriver.Chrome, path: Path) -> tuple[tuple[int, int], int]:
    """Save the viewport as PNG at ``path``; its size in pixels and its number of colours."""
    assert driver.save_screenshot(str(path)), f"no screenshot written to {path}"
    with Image.open(path) as image:
        assert image.format == "PNG", image.format
        colours = image.convert("RGB").getcolors(maxcolors=1 << 24) or []
        return image.size, len(colours)
