"""Headless Debian Chromium through its own chromedriver (selenium), and screenshot artifacts.

No browser is downloaded: the test uses `/usr/bin/chromium` and `/usr/bin/chromedriver`
(`scripts/setup_browser.sh` installs them) and skips, saying why, when they are missing.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

CHROMIUM = os.environ.get("POLAR_MQ_CHROMIUM", "/usr/bin/chromium")
CHROMEDRIVER = os.environ.get("POLAR_MQ_CHROMEDRIVER", "/usr/bin/chromedriver")


def browser_missing() -> str | None:
    """Why the browser tests cannot run here, or None."""
    try:
        import selenium  # noqa: F401
    except ImportError:
        return "selenium is not installed (pip install -e '.[dev]')"
    for path in (CHROMIUM, CHROMEDRIVER):
        if not (Path(path).exists() or shutil.which(path)):
            return f"{path} not found (bash scripts/setup_browser.sh installs Debian's chromium)"
    return None


@contextmanager
def chromium(download_dir: Path) -> Iterator[object]:
    """A headless Chromium WebDriver, quit on exit."""
    from selenium import webdriver

    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for arg in (
        "--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--disable-gpu",
        "--window-size=1440,1100", "--no-first-run", "--disable-extensions",
        f"--user-data-dir={download_dir / 'profile'}",
    ):  # fmt: skip
        options.add_argument(arg)
    service = webdriver.ChromeService(executable_path=CHROMEDRIVER)
    driver = webdriver.Chrome(options=options, service=service)
    try:
        yield driver
    finally:
        driver.quit()


def artifacts_dir(tmp_path: Path) -> Path:
    """Where screenshots go: $POLAR_MQ_TEST_ARTIFACTS/ui-screenshots, else the test's tmp_path."""
    root = os.environ.get("POLAR_MQ_TEST_ARTIFACTS")
    out = (Path(root) if root else tmp_path) / "ui-screenshots"
    out.mkdir(parents=True, exist_ok=True)
    return out


def require_browser() -> None:
    reason = browser_missing()
    if reason is not None:
        pytest.skip(reason)
