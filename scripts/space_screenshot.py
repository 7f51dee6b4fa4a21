"""Screenshot of the NIAH Space answering one passkey query, driven by headless Chromium.

    python scripts/space_screenshot.py runs/main results/space_niah.png --context 1024

Starts spaces/niah/app.py on a free local port with the given model folder(s), sets the context length,
clicks "Find the needle", waits for the answer and saves a PNG. Needs `chromium` and `chromium-driver`
(apt). tests/test_space.py drives the browser through the helpers below.
"""

import argparse
import shutil
import socket
import sys
import tempfile
from pathlib import Path

from selenium import webdriver
from selenium.webdriver.common.by import By
from selenium.webdriver.common.keys import Keys
from selenium.webdriver.support.ui import WebDriverWait

from linzoo.spaces.niah import app
from linzoo.spaces.niah import niah_space as space

CHROMIUM_FLAGS = ("--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                  "--disable-background-networking", "--disable-component-update", "--disable-sync",
                  "--no-first-run", "--window-size=1280,1700")


def chromium_paths() -> tuple[str | None, str | None]:
    """(browser, driver) executables, None where missing."""
    browser = shutil.which("chromium") or shutil.which("chromium-browser") or shutil.which("google-chrome")
    return browser, shutil.which("chromedriver")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_space(models: list[str], results: list[Path]):
    """(demo, url): the Space's own app.py served from a background thread on a free local port."""
    demo = app.build_demo(models, results)
    return demo, space.launch(demo, results, "127.0.0.1", free_port(), block=False)


def chromium(profile: Path) -> webdriver.Chrome:
    """Headless Chromium with a fresh profile, from the system's executables (never downloads one)."""
    browser, driver = chromium_paths()
    options = webdriver.ChromeOptions()
    options.binary_location = browser
    for flag in (*CHROMIUM_FLAGS, f"--user-data-dir={profile}"):
        options.add_argument(flag)
    return webdriver.Chrome(options=options, service=webdriver.ChromeService(executable_path=driver))


def set_value(element, value: str) -> None:
    element.clear()
    element.send_keys(value)
    element.send_keys(Keys.TAB)  # Gradio takes the value on change/blur


def ask(driver, url: str, context_len: int, custom: tuple[str, str, str] | None = None, timeout: float = 300,
        expect: str = "") -> str:
    """Open the Space, set the context length (or a custom haystack, question, answer), click the run button
    and return the answers table's text once a verdict (and `expect`) shows in it."""
    driver.get(url)
    wait = WebDriverWait(driver, timeout)
    run = wait.until(lambda d: d.find_element(By.ID, "run"))
    set_value(driver.find_element(By.CSS_SELECTOR, "#context input[type=number]"), str(context_len))
    if custom:
        driver.find_element(By.CSS_SELECTOR, "#needle input[value=custom]").click()
        driver.find_element(By.CSS_SELECTOR, "#custom button").click()
        for field, value in zip(("haystack", "question", "answer"), custom, strict=True):
            selector = f"#custom-{field} textarea"
            set_value(wait.until(lambda d, selector=selector: d.find_element(By.CSS_SELECTOR, selector)), value)
    run.click()

    def answered(d):
        text = d.find_element(By.ID, "answers").text
        return text if (space.CORRECT in text or space.WRONG in text) and expect in text else False

    return wait.until(answered)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("models", help="comma-separated model folders / Hub ids (1-3)")
    parser.add_argument("png", type=Path, help="where to save the screenshot")
    parser.add_argument("--context", type=int, default=1024, help="context length in tokens")
    parser.add_argument("--results", default="results", help="results folder for the second tab")
    args = parser.parse_args(argv)
    if None in chromium_paths():
        sys.exit("chromium and chromedriver are needed: apt-get install -y chromium chromium-driver")
    models = args.models.split(",")
    demo, url = start_space(models, [Path(args.results)])
    with tempfile.TemporaryDirectory() as profile:
        driver = chromium(Path(profile))
        try:
            print(ask(driver, url, args.context, expect=models[0]))
            args.png.parent.mkdir(parents=True, exist_ok=True)
            driver.save_screenshot(str(args.png))
        finally:
            driver.quit()
            demo.close()
    print(f"saved {args.png}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
