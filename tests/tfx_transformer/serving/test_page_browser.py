"""The serving page (`tfx_transformer/serving/static/index.html`) in a real browser.

Headless Chromium from the system's packages, driven by Selenium through the system's
chromedriver (Selenium downloads nothing), against ``scripts/serve.py`` serving the test
exports (conftest's shared `serving`). Skipped, saying how to install them, where Chromium,
chromedriver or Selenium is missing.
"""

import base64
import io
import math
import shutil
from pathlib import Path

import numpy as np
import pytest
from PIL import Image, ImageDraw

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
CHROMEDRIVER = shutil.which("chromedriver")
INSTALL = "apt-get install chromium chromium-driver"

pytestmark = [
    pytest.mark.skipif(
        not (CHROMIUM and CHROMEDRIVER),
        reason=f"no {'chromium' if not CHROMIUM else 'chromedriver'} on PATH: the page's browser "
               f"test needs Chromium and its driver from the system's packages ({INSTALL})"),
    pytest.mark.xdist_group("serving"),  # on the worker of the shared server
    pytest.mark.slow,  # the shared server takes a minute or more to start
]
webdriver = pytest.importorskip(
    "selenium.webdriver", reason="selenium is missing (pip install -e '.[test]')")
from selenium.common.exceptions import TimeoutException  # noqa: E402
from selenium.webdriver.common.by import By  # noqa: E402
from selenium.webdriver.common.keys import Keys  # noqa: E402
from selenium.webdriver.support.ui import WebDriverWait  # noqa: E402

SENTENCE = "I have three apples."
MAGENTA = np.array([255, 0, 255])
REQUEST_TIMEOUT = 60  # seconds for one request of the page to be answered
WINDOW = (1000, 700)


@pytest.fixture
def server(serving):
    """conftest's shared `serving` server, still running."""
    if serving.returncode is not None:
        pytest.fail("the shared server was stopped before this test (test_server_api.py's "
                    "SIGTERM test stops it: run this file before that one)")
    return serving


# --- The browser ---------------------------------------------------------------------------

@pytest.fixture(scope="module")
def browser(tmp_path_factory):
    """Headless Chromium at a 1000x700 window, device scale 1 (a CSS pixel is a pixel)."""
    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for flag in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                 "--disable-quic", "--no-first-run", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync", "--no-proxy-server",
                 "--force-device-scale-factor=1", "--force-color-profile=srgb",
                 f"--window-size={WINDOW[0]},{WINDOW[1]}",
                 f"--user-data-dir={tmp_path_factory.mktemp('chromium')}"):
        options.add_argument(flag)
    service = webdriver.ChromeService(executable_path=CHROMEDRIVER)
    driver = webdriver.Chrome(options=options, service=service)
    try:
        driver.set_page_load_timeout(REQUEST_TIMEOUT)
        yield driver
    finally:
        driver.quit()


def _wait_answered(driver, panel: str) -> str:
    """The panel's data-state once its request is answered ("done" or "error")."""
    try:
        WebDriverWait(driver, REQUEST_TIMEOUT, poll_frequency=0.05).until(
            lambda d: d.find_element(By.ID, panel).get_attribute("data-state")
            in ("done", "error"))
    except TimeoutException:
        state = driver.find_element(By.ID, panel).get_attribute("data-state")
        pytest.fail(f"#{panel} still {state} after {REQUEST_TIMEOUT} s")
    return driver.find_element(By.ID, panel).get_attribute("data-state")


def _text(driver, element_id: str) -> str:
    return driver.execute_script(f"return document.getElementById({element_id!r}).textContent")


def _open(driver, url: str):
    driver.get(url + "/")
    assert driver.title == "tfx-transformer"
    WebDriverWait(driver, REQUEST_TIMEOUT, poll_frequency=0.05).until(
        lambda d: _text(d, "models").startswith("Models:"))


# --- Translation ---------------------------------------------------------------------------

def test_translate_panel_shows_the_servers_nbest_list(browser, server):
    _open(browser, server.url)
    source = browser.find_element(By.ID, "source")
    source.clear()
    source.send_keys(SENTENCE)
    browser.find_element(By.ID, "translate").click()
    assert _wait_answered(browser, "translate-panel") == "done", _text(browser, "translate-status")

    status, direct = server.post("/v1/models/translator:predict",
                                 {"signature_name": "translate_nbest", "instances": [SENTENCE]})
    assert status == 200, direct
    hypotheses = direct["predictions"][0]["hypotheses"]
    scores = direct["predictions"][0]["scores"]
    shown = browser.execute_script("return window.lastTranslation")
    assert shown["predictions"][0]["hypotheses"] == hypotheses
    assert shown["predictions"][0]["scores"] == pytest.approx(scores, abs=1e-5)
    assert _text(browser, "translation") == hypotheses[0]
    status, plain = server.post("/v1/models/translator:predict", {"instances": [SENTENCE]})
    assert (status, plain["predictions"]) == (200, [hypotheses[0]])
    rows = browser.execute_script(
        "return [...document.querySelectorAll('#nbest tbody tr')]"
        ".map(row => [...row.cells].map(cell => cell.textContent))")
    assert rows == [[str(i + 1), text, f"{score:.3f}"]
                    for i, (text, score) in enumerate(zip(hypotheses, scores))]
    assert len(rows) > 1


# --- Detection -----------------------------------------------------------------------------

def _shapes_png(path: Path) -> np.ndarray:
    """A 160x120 PNG of three solid shapes (no colour near magenta); returns its pixels."""
    image = Image.new("RGB", (160, 120), (40, 90, 60))
    draw = ImageDraw.Draw(image)
    draw.ellipse((12, 14, 52, 54), fill=(230, 200, 30))
    draw.rectangle((80, 20, 130, 60), fill=(30, 140, 230))
    draw.polygon([(40, 110), (70, 64), (100, 110)], fill=(240, 240, 240))
    image.save(path)
    return np.asarray(image)


def _edges(box, width: int, height: int) -> tuple[int, int, int, int]:
    """Edge pixels (left, top, right, bottom) of a box clipped to the image: pixel c covers
    [c, c + 1), so the right edge of x1 = 10 is column 9 (coordinates rounded half up)."""
    x0, y0, x1, y1 = (math.floor(v + 0.5) for v in box)
    left, top = min(max(x0, 0), width - 1), min(max(y0, 0), height - 1)
    return left, top, min(max(x1 - 1, left), width - 1), min(max(y1 - 1, top), height - 1)


def _canvas_pixels(driver) -> np.ndarray:
    canvas = driver.find_element(By.ID, "canvas")
    return np.asarray(Image.open(io.BytesIO(canvas.screenshot_as_png)).convert("RGB"))


def test_detect_panel_draws_the_servers_boxes(browser, server, tmp_path):
    _open(browser, server.url)
    source = _shapes_png(tmp_path / "shapes.png")
    height, width = source.shape[:2]
    browser.find_element(By.ID, "image").send_keys(str(tmp_path / "shapes.png"))
    assert _wait_answered(browser, "detect-panel") == "done", _text(browser, "detect-status")

    encoded = base64.b64encode((tmp_path / "shapes.png").read_bytes()).decode()
    status, direct = server.post("/v1/models/detector:predict",
                           {"signature_name": "serving_bytes", "instances": [{"b64": encoded}]})
    assert status == 200, direct
    detections = browser.execute_script("return window.lastDetections")
    prediction = detections["predictions"][0]
    assert np.allclose(prediction["boxes"], direct["predictions"][0]["boxes"], atol=1e-3)
    boxes, scores, labels = (prediction[k] for k in ("boxes", "scores", "labels"))
    names = browser.execute_script(
        "return fetch('v1/models').then(r => r.json())"
        ".then(j => j.models.find(m => m.kind === 'detector').class_names)")
    assert browser.execute_script("return [canvas.width, canvas.height]") == [width, height]

    # The default threshold shows the boxes scoring at least 0.5.
    assert _text(browser, "threshold-value") == "0.50"
    assert len(browser.execute_script("return window.drawnBoxes")) == sum(s >= 0.5 for s in scores)
    # Threshold 0 shows every box, redrawn without a new request.
    browser.execute_script("window.lastDetections.seen = true")
    browser.find_element(By.ID, "threshold").send_keys(Keys.HOME)
    assert _text(browser, "threshold-value") == "0.00"
    assert browser.execute_script("return window.lastDetections.seen") is True
    drawn = browser.execute_script("return window.drawnBoxes")
    assert sorted(d["index"] for d in drawn) == list(range(len(scores)))
    items = browser.execute_script(
        "return [...document.querySelectorAll('#detections li')].map(li => li.textContent)")
    best = int(np.argmax(scores))
    left, top, right, bottom = _edges(boxes[best], width, height)
    assert items[0] == (f"{names[labels[best]]} {scores[best]:.2f} at ({left}, {top})–"
                        f"({right + 1}, {bottom + 1})")
    assert len(items) == len(scores)

    pixels = _canvas_pixels(browser).astype(int)
    assert pixels.shape[:2] == (height, width)
    labelled = np.zeros((height, width), bool)  # under a label: its text is not magenta
    for x, y, w, h in (d["label"] for d in drawn):
        assert w * h < width * height / 8, "a label covers too much of the image"
        labelled[max(y, 0):y + h, max(x, 0):x + w] = True
    magenta = np.abs(pixels - MAGENTA).max(axis=-1) <= 2
    strips = np.zeros((height, width), bool)  # the 3-pixel strips centred on every edge
    checked = 0
    for box in boxes:
        left, top, right, bottom = _edges(box, width, height)
        line = np.zeros((height, width), bool)
        line[top, left:right + 1] = line[bottom, left:right + 1] = True
        line[top:bottom + 1, left] = line[top:bottom + 1, right] = True
        wrong = line & ~labelled & ~magenta
        assert not wrong.any(), (f"box {box}: {wrong.sum()} edge pixels are not magenta, e.g. "
                                 f"(row, column) {tuple(np.argwhere(wrong)[0].tolist())}")
        checked += (line & ~labelled).sum()
        rows, cols = slice(max(top - 1, 0), bottom + 2), slice(max(left - 1, 0), right + 2)
        for edge_rows, edge_cols in ((slice(max(top - 1, 0), top + 2), cols),
                                     (slice(max(bottom - 1, 0), bottom + 2), cols),
                                     (rows, slice(max(left - 1, 0), left + 2)),
                                     (rows, slice(max(right - 1, 0), right + 2))):
            strips[edge_rows, edge_cols] = True
    assert checked >= 2 * (width + height), "too few edge pixels were checked"
    free = ~strips & ~labelled
    assert free.sum() > 0.25 * width * height
    # Everywhere else the canvas is the image itself, at its natural size.
    assert not magenta[free].any(), f"{magenta[free].sum()} magenta pixels off every edge"
    differs = free & (np.abs(pixels - source).max(axis=-1) > 2)
    assert not differs.any(), (f"{differs.sum()} pixels differ from the image, e.g. (row, "
                               f"column) {tuple(np.argwhere(differs)[0].tolist())}")


def test_detect_panel_shows_the_servers_error(browser, server, tmp_path):
    _open(browser, server.url)
    (tmp_path / "broken.png").write_bytes(b"not an image")
    browser.find_element(By.ID, "image").send_keys(str(tmp_path / "broken.png"))
    assert _wait_answered(browser, "detect-panel") == "error"
    status, direct = server.post("/v1/models/detector:predict",
                           {"signature_name": "serving_bytes",
                            "instances": [{"b64": "bm90IGFuIGltYWdl"}]})  # "not an image"
    assert 400 <= status < 600 and direct["error"]
    assert browser.find_element(By.ID, "detect-status").is_displayed()
    assert _text(browser, "detect-status") == direct["error"]
