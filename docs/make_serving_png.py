"""Writes docs/serving.png: the serving page after a translation and a detection.

    python docs/make_serving_png.py --translator DIR --detector DIR [--out docs/serving.png]

Starts ``scripts/serve.py`` with the two exports on a free port, opens the page in headless
Chromium (the system's chromium and chromedriver, driven by Selenium), translates a sentence,
detects the objects of a built-in shapes image (`vision.data.shapes`) and saves a screenshot
of the page's window.
"""

import argparse
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

from PIL import Image
from selenium import webdriver
from selenium.webdriver.common.by import By
from selenium.webdriver.support.ui import WebDriverWait

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from vision.data.shapes import ShapesGenerator  # noqa: E402

FLAGS = ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
         "--disable-quic", "--no-first-run", "--disable-background-networking",
         "--disable-component-update", "--disable-sync", "--no-proxy-server",
         "--force-device-scale-factor=1", "--force-color-profile=srgb")


def _start_server(translator: str, detector: str, timeout: float) -> tuple[subprocess.Popen, str]:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    process = subprocess.Popen(
        [sys.executable, "-u", str(ROOT / "scripts" / "serve.py"), "--translator", translator,
         "--detector", detector, "--port", str(port)], cwd=ROOT, stdout=subprocess.PIPE,
        text=True)
    deadline = time.monotonic() + timeout
    for line in process.stdout:  # the server prints "ready: ..." once both exports are loaded
        if line.startswith("ready:"):
            threading.Thread(target=process.stdout.read, daemon=True).start()  # never blocks it
            return process, f"http://127.0.0.1:{port}"
        if time.monotonic() > deadline:
            break
    process.kill()
    sys.exit(f"serve.py did not get ready (exit status {process.wait()})")


def _wait_done(driver, panel: str, timeout: float):
    WebDriverWait(driver, timeout, poll_frequency=0.05).until(
        lambda d: d.find_element(By.ID, panel).get_attribute("data-state") in ("done", "error"))
    if driver.find_element(By.ID, panel).get_attribute("data-state") != "done":
        sys.exit(f"#{panel}: " + driver.find_element(By.CSS_SELECTOR, f"#{panel} .status").text)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--translator", required=True, help="translator export directory")
    parser.add_argument("--detector", required=True, help="detector export directory")
    parser.add_argument("--out", default=str(ROOT / "docs" / "serving.png"))
    parser.add_argument("--sentence", default="We bought twenty-nine letters on June 30, 1962.")
    parser.add_argument("--image-index", type=int, default=13, help="valid-split shapes image")
    parser.add_argument("--image-size", type=int, default=224)
    parser.add_argument("--threshold", type=float, default=0.5, help="the slider's value")
    parser.add_argument("--window", default="1000,700", help="the page's size: WIDTH,HEIGHT")
    args = parser.parse_args()

    with tempfile.TemporaryDirectory() as tmp:
        image = Path(tmp) / "shapes.png"
        shapes = ShapesGenerator(seed=0, split="valid", image_size=args.image_size,
                                 max_objects=4)
        Image.fromarray(shapes.example(args.image_index)["image"]).save(image)
        process, url = _start_server(args.translator, args.detector, timeout=600)
        options = webdriver.ChromeOptions()
        options.binary_location = "/usr/bin/chromium"
        for flag in (*FLAGS, f"--user-data-dir={tmp}/profile"):
            options.add_argument(flag)
        driver = webdriver.Chrome(options=options,
                                  service=webdriver.ChromeService("/usr/bin/chromedriver"))
        try:
            width, height = (int(v) for v in args.window.split(","))
            driver.get(url + "/")
            extra = driver.execute_script(
                "return [outerWidth - innerWidth, outerHeight - innerHeight]")
            driver.set_window_size(width + extra[0], height + extra[1])  # the page gets WxH
            source = driver.find_element(By.ID, "source")
            source.clear()
            source.send_keys(args.sentence)
            driver.find_element(By.ID, "translate").click()
            _wait_done(driver, "translate-panel", 120)
            driver.find_element(By.ID, "image").send_keys(str(image))
            _wait_done(driver, "detect-panel", 120)
            driver.execute_script(
                "const s = document.getElementById('threshold'); s.value = arguments[0];"
                "s.dispatchEvent(new Event('input'));", args.threshold)
            driver.save_screenshot(args.out)
        finally:
            driver.quit()
            process.send_signal(signal.SIGTERM)
            process.wait(timeout=30)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
