"""The web dashboard (``swarm dashboard``) against a real SN: its JSON API, its access control with
certificates, and its page in a real headless Chromium (Debian's ``chromium`` and ``chromedriver``,
driven by selenium) with a screenshot.
"""

from __future__ import annotations

import json
import shutil
import signal
import ssl
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from certs import init_swarm
from daemons.broker import free_port
from tests.conftest import RunningSN, start_sn
from tests.test_swci_training import C, swarm_of

pytestmark = pytest.mark.timeout(120)

CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
CHROMEDRIVER = shutil.which("chromedriver") or "/usr/bin/chromedriver"
SCREENSHOT_DIR = Path(__file__).resolve().parent.parent / "runs" / "screenshots"


@contextmanager
def dashboard(sn: RunningSN, *extra: str) -> Iterator[str]:
    """Run ``swarm dashboard`` for ``sn``; yields the URL it printed (with its token, if any)."""
    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "daemons.cli", "dashboard", "--sn-api-port", str(sn.port), "--port", str(port),
         *extra],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True,
    )  # fmt: skip
    try:
        assert proc.stdout is not None
        lines = []
        for line in proc.stdout:
            lines.append(line)
            if line.startswith("Dashboard: "):
                yield line.split(" ", 1)[1].strip()
                break
        else:
            pytest.fail("swarm dashboard did not start:\n" + "".join(lines))
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(15)
        except subprocess.TimeoutExpired:
            proc.kill()
            pytest.fail("swarm dashboard did not stop on SIGTERM")


def get(url: str, context: ssl.SSLContext | None = None, headers: dict[str, str] | None = None) -> Any:
    request = urllib.request.Request(url, headers=headers or {})  # noqa: S310 - http(s) of the test
    with urllib.request.urlopen(request, context=context, timeout=10) as response:  # noqa: S310
        return json.loads(response.read())


def status_of(url: str, context: ssl.SSLContext | None = None, headers: dict[str, str] | None = None) -> int:
    try:
        get(url, context, headers)
    except urllib.error.HTTPError as exc:
        return exc.code
    return 200


async def test_the_api_reads_the_swarm(sn: RunningSN) -> None:
    async with swarm_of(sn, "sl1", "sl2") as swarm:
        await swarm.join()
        await swarm.round(init=True)
        await swarm.progress(1)
        with dashboard(sn) as url:
            overview = get(url + "api/overview")
            assert overview["sn"]["uid"] == "sn-1"
            assert {"sl1", "sl2"} <= {n["uid"] for n in overview["nodes"]}
            contract = get(url + f"api/contracts/{C}")
            assert [p["uid"] for p in contract["perfdata"]] == ["sl1", "sl2"]
            history = get(url + f"api/contracts/{C}/history")
            assert [r["kind"] for r in history["records"]] == ["round", "progress", "progress"]
            later = get(url + f"api/contracts/{C}/history?since={history['height']}")
            assert later["records"] == []
            assert status_of(url + "api/contracts/nope") == 404
            assert status_of(url + f"api/contracts/{C}/history?since=x") == 400


def test_with_certificates_it_serves_tls_and_wants_a_client_certificate_or_the_token(tmp_path: Path) -> None:
    pki = tmp_path / "pki"
    init_swarm(pki, sl=1)
    ids = [
        "--cert",
        str(pki / "sn-1-cert.pem"),
        "--key",
        str(pki / "sn-1-key.pem"),
        "--capath",
        str(pki / "ca"),
    ]
    sn = start_sn(tmp_path / "sn", extra=ids)
    try:
        swci = ["--cert", str(pki / "swci-1-cert.pem"), "--key", str(pki / "swci-1-key.pem")]
        with dashboard(sn, *swci, "--capath", str(pki / "ca"), "--token", "s3cret") as url:
            assert url.startswith("https://") and url.endswith("?token=s3cret")
            base = url.split("?")[0]
            trusting = ssl.create_default_context(cafile=str(pki / "ca" / "ca-cert.pem"))
            assert status_of(base + "api/overview", trusting) == 401
            assert status_of(base + "api/overview", trusting, {"Authorization": "Bearer wrong"}) == 401
            assert get(base + "api/overview", trusting, {"Authorization": "Bearer s3cret"})["sn"]["signed"]
            assert get(base + "api/overview?token=s3cret", trusting)["sn"]["uid"] == "sn-1"
            with_cert = ssl.create_default_context(cafile=str(pki / "ca" / "ca-cert.pem"))
            with_cert.load_cert_chain(pki / "sl-1-cert.pem", pki / "sl-1-key.pem")
            assert get(base + "api/overview", with_cert)["sn"]["uid"] == "sn-1"
            with pytest.raises((urllib.error.URLError, ConnectionError)):
                get(base.replace("https://", "http://") + "api/overview")
    finally:
        sn.stop()


# --- the page in a real browser -----------------------------------------------------------------


def _browser(tmp_path: Path) -> Any:
    if not (Path(CHROMIUM).exists() and Path(CHROMEDRIVER).exists()):
        pytest.skip(f"Debian's chromium and chromium-driver are not installed ({CHROMIUM}, {CHROMEDRIVER})")
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for flag in (
        "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
        "--disable-background-networking", "--disable-component-update", "--disable-sync",
        "--disable-dev-shm-usage", "--window-size=1400,1250", f"--user-data-dir={tmp_path / 'chromium'}",
    ):  # fmt: skip
        options.add_argument(flag)
    return webdriver.Chrome(options=options, service=Service(CHROMEDRIVER))


def _wait(check: Any, what: str, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            pytest.fail(f"the page never showed {what}")
        time.sleep(0.2)


@pytest.mark.browser
async def test_the_page_in_headless_chromium(sn: RunningSN, tmp_path: Path) -> None:
    async with swarm_of(sn, "sl1", "sl2", "sl3") as swarm:
        await swarm.join()
        await swarm.round(init=True)
        for epoch in (1, 2):
            await swarm.round()
            await swarm.progress(epoch)
        await swarm.round()
        with dashboard(sn) as url:
            browser = _browser(tmp_path)
            try:
                browser.get(url)
                _wait(lambda: browser.execute_script("return document.body.dataset.ready") == "1", "its data")
                _wait(lambda: len(browser.find_elements("css selector", "#perf tbody tr")) == 3, "3 nodes")
                _wait(lambda: len(browser.find_elements("css selector", ".chart canvas")) == 2, "2 charts")
                text = browser.find_element("tag name", "body").text
                assert "sl1" in text and "sl3" in text and "2/2" in text and "ACTIVE" in text
                assert "nodes online" in text.lower() and "Rounds and leaders" in text
                assert "cannot read the swarm" not in text
                SCREENSHOT_DIR.mkdir(parents=True, exist_ok=True)
                shot = SCREENSHOT_DIR / "dashboard.png"
                assert browser.save_screenshot(str(shot))
                assert shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
            finally:
                browser.quit()
