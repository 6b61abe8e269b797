"""llama-server's web UI in a real browser: headless Chromium (Debian's `chromium` and `chromium-driver`, driven
through selenium) opens / of `pyllm serve` on SmolLM2-135M-Instruct, enters the API key the server asks for,
asks a question and reads the model's answer off the page. Screenshots are kept. And `pyllm vendor pack --with-ui`
puts the built assets into the offline archive (with a stand-in npm: seconds, no registry)."""

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

from conftest import PYLLM, REPO, run_pyllm

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
CHROMEDRIVER = shutil.which("chromedriver")
# Screenshots are copied here (git-ignored build/), so they outlive pytest's temporary folders.
ARTIFACTS = Path(os.environ.get("PYLLM_TEST_ARTIFACTS", REPO / "build" / "test-artifacts"))
API_KEY = "web-ui-test-key-4d1f"
QUESTION = "What is the capital of France?"
SYSTEM_MESSAGE = "You are a helpful assistant."

needs_chromium = pytest.mark.skipif(
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


@needs_chromium
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


# --- pyllm vendor pack --with-ui ------------------------------------------------------------

FAKE_NPM = """#!/bin/sh
# stand-in npm: `ci` fills node_modules, `run build` writes the assets where llama.cpp's build asks for them
case "$1" in
  --version) echo 0.0-stand-in ;;
  ci) mkdir -p node_modules/some-package && echo x > node_modules/some-package/index.js ;;
  run) mkdir -p "$LLAMA_UI_OUT_DIR/_app" && echo '<html>stand-in UI</html>' > "$LLAMA_UI_OUT_DIR/index.html" \
         && echo 'js' > "$LLAMA_UI_OUT_DIR/_app/bundle.js" ;;
esac
"""


def _tree_with_ui(root: Path) -> Path:
    for rel, text in {"CMakeLists.txt": "project(stand_in)\n", "include/llama.h": "// llama.h\n", "ggml/CMakeLists.txt": "#\n",
                      "tools/ui/package.json": "{}\n", "tools/ui/src/app.html": "<div></div>\n",
                      "tools/ui/node_modules/left-over/index.js": "x\n", "tools/ui/dist/index.html": "stale\n"}.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text)
    return root


def test_vendor_pack_with_ui_puts_the_built_assets_into_the_archive(tmp_path: Path) -> None:
    import tarfile

    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "npm").write_text(FAKE_NPM)
    (bin_dir / "npm").chmod(0o755)
    tree = _tree_with_ui(tmp_path / "tree")
    archive = tmp_path / "src.tar.gz"
    result = run_pyllm("vendor", "pack", str(archive), "--source", str(tree), "--with-ui",
                       env={"PATH": f"{bin_dir}:{os.environ['PATH']}"})
    assert result.returncode == 0, result.stderr
    assert "with the web UI" in result.stdout and "npm run build" in result.stderr
    with tarfile.open(archive) as tar:
        names = set(tar.getnames())
        index = tar.extractfile("llama.cpp/tools/ui/dist/index.html").read().decode()
    assert "stand-in UI" in index, "the tree's stale dist must be replaced by the fresh build"
    assert {"llama.cpp/tools/ui/dist/_app/bundle.js", "llama.cpp/tools/ui/src/app.html"} <= names
    assert not any("node_modules" in n for n in names), "npm's work folders are never packed"
    assert not (tree / "tools" / "ui" / "dist" / "_app").exists(), "the source tree is never written to"


def test_vendor_pack_with_ui_without_npm_is_one_line(tmp_path: Path) -> None:
    empty = tmp_path / "bin"
    empty.mkdir()
    result = run_pyllm("vendor", "pack", str(tmp_path / "src.tar.gz"), "--source", str(_tree_with_ui(tmp_path / "tree")),
                       "--with-ui", env={"PATH": str(empty)})
    assert result.returncode == 1
    assert result.stderr.count("\n") == 1 and "npm" in result.stderr, result.stderr
    assert not (tmp_path / "src.tar.gz").exists()


def test_serve_prints_the_web_ui_address_when_the_build_has_it(tiny_models, info) -> None:
    """`pyllm serve` says where the UI is (and that it asks for the key) only when build-info says it is in."""
    proc = subprocess.Popen([str(PYLLM), "serve", str(tiny_models["tiny-llama"]), "--port", "0", "--api-key", "k"],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        lines = []
        for line in proc.stdout:
            lines.append(line)
            if line.startswith("  curl "):
                break
        ui = proc.stdout.readline() if info.get("ui") else ""
    finally:
        proc.terminate()
        proc.wait(60)
    if info.get("ui"):
        assert ui.startswith("  web UI: http://127.0.0.1:") and ui.rstrip().endswith("/  (it asks for the API key)"), ui
    else:
        assert not any("web UI" in line for line in lines)
