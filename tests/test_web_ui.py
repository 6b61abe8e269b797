"""llama-server's web UI in a real browser: headless Chromium (Debian's `chromium` and `chromium-driver`, driven
through selenium) opens / of `pyllm serve` on SmolLM2-135M-Instruct, enters the API key the server asks for,
asks a question and reads the model's answer off the page. A screenshot of the last state is kept."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import threading
import time
from pathlib import Path

import httpx
import pytest

from conftest import PYLLM, REPO

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
CHROMEDRIVER = shutil.which("chromedriver")
# Screenshots are copied here (git-ignored build/), so they outlive pytest's temporary folders.
ARTIFACTS = Path(os.environ.get("PYLLM_TEST_ARTIFACTS", REPO / "build" / "test-artifacts"))
API_KEY = "web-ui-test-key-4d1f"
QUESTION = "What is the capital of France?"
SYSTEM_MESSAGE = "You are a helpful assistant."

pytestmark = pytest.mark.skipif(
    CHROMIUM is None or CHROMEDRIVER is None,
    reason="needs Chromium and its WebDriver: apt install chromium chromium-driver (.ci/run installs them)",
)


class ServeProcess:
    """`pyllm serve` in the foreground, as a user runs it; its output is collected for failure messages."""

    def __init__(self, *args: str) -> None:
        self.lines: list[str] = []
        self.ready = threading.Event()
        self.url: str | None = None
        self.proc = subprocess.Popen([str(PYLLM), "serve", *args], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                     text=True, start_new_session=True)
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.lines.append(line.rstrip("\n"))
            found = re.match(r"ready.*?: (http://\S+)/v1\b", line)
            if found:
                self.url = found.group(1)
                self.ready.set()
        self.ready.set()

    def wait_ready(self, timeout: float) -> str:
        self.ready.wait(timeout)
        assert self.url, "pyllm serve did not get ready:\n" + self.output()
        return self.url

    def output(self) -> str:
        return "\n".join(self.lines[-40:])

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)  # pyllm stops its llama-server, as on Ctrl-C
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)


@pytest.fixture
def browser(tmp_path: Path):
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for arg in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--disable-gpu",
                "--window-size=1280,900", f"--user-data-dir={tmp_path / 'chromium-profile'}"):
        options.add_argument(arg)
    # The driver Debian installs beside its chromium: never Selenium Manager (it would download one).
    driver = webdriver.Chrome(service=Service(executable_path=CHROMEDRIVER, log_output=str(tmp_path / "chromedriver.log")),
                              options=options)
    driver.set_page_load_timeout(60)
    yield driver
    driver.quit()


def _screenshot(driver, tmp_path: Path, name: str) -> Path:
    """Save the page as ``tmp_path/name`` and copy it to ARTIFACTS (the stable path failure messages give)."""
    shot = tmp_path / name
    driver.save_screenshot(str(shot))
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    stable = ARTIFACTS / name
    shutil.copyfile(shot, stable)
    return stable


def test_the_web_ui_asks_for_the_api_key_and_answers_a_question(browser, smollm2: Path, info: dict, tmp_path: Path) -> None:
    from selenium.common.exceptions import TimeoutException
    from selenium.webdriver.common.by import By
    from selenium.webdriver.common.keys import Keys
    from selenium.webdriver.support import expected_conditions as EC
    from selenium.webdriver.support.ui import WebDriverWait

    assert info.get("ui"), (f"this build has no web UI (build info: {info.get('ui_detail')!r}): GET / answers 404. "
                            "Build with npm installed (PYLLM_UI=AUTO) or from `pyllm vendor pack --with-ui`")
    # The UI takes the server's sampling defaults (/props): --temp 0 makes the answer deterministic. With no system
    # message SmolLM2-135M answers this question with French nonsense even at temperature 0; with one it says
    # "The capital of France is Paris." --ui-config is the admin's default UI settings for a new browser.
    serve = ServeProcess(str(smollm2), "--host", "127.0.0.1", "--port", "0", "--api-key", API_KEY, "--ctx-size", "2048",
                         "--", "--temp", "0", "--ui-config", json.dumps({"systemMessage": SYSTEM_MESSAGE}))
    shot = ARTIFACTS / "web-ui.png"
    try:
        url = serve.wait_ready(300)
        page = httpx.get(url + "/", timeout=30)
        assert page.status_code == 200 and "<html" in page.text.lower(), f"GET / answered {page.status_code}"
        assert httpx.get(url + "/props", timeout=30).status_code == 401, "the server should want the API key"

        wait = WebDriverWait(browser, 60)
        try:
            browser.get(url + "/")
            # No key stored in this browser yet: /props answers 401 and the UI shows its API key splash.
            wait.until(EC.element_to_be_clickable((By.XPATH, "//button[contains(., 'Enter API Key')]"))).click()
            wait.until(EC.visibility_of_element_located((By.ID, "api-key-input"))).send_keys(API_KEY)
            _screenshot(browser, tmp_path, "web-ui-api-key.png")
            browser.find_element(By.XPATH, "//button[contains(., 'Save & Retry')]").click()
            box = wait.until(EC.element_to_be_clickable((By.TAG_NAME, "textarea")))
            box.send_keys(QUESTION)
            box.send_keys(Keys.ENTER)
            WebDriverWait(browser, 180).until(
                lambda d: "Paris" in d.find_element(By.TAG_NAME, "body").text.replace(QUESTION, ""))
            time.sleep(1)  # let the rest of the answer stream in for the screenshot
            shot = _screenshot(browser, tmp_path, "web-ui.png")
        except TimeoutException as exc:
            shot = _screenshot(browser, tmp_path, "web-ui.png")
            body = browser.find_element(By.TAG_NAME, "body").text
            pytest.fail(f"the web UI did not get there ({exc.msg or 'timeout'}); screenshot: {shot}\n"
                        f"page text:\n{body[-1500:]}\npyllm serve:\n{serve.output()}")
        text = browser.find_element(By.TAG_NAME, "body").text
        assert "Paris" in text, f"screenshot: {shot}"
        print(f"web UI screenshot: {shot}")
    finally:
        serve.stop()
