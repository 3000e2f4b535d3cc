"""The HTML pages render in a real browser, offline: headless Chromium through selenium.

For the circuit page, the overlap page and the report page: every plot draws its SVG,
the console shows no error, and the page makes no network request (plotly.js is inlined).
A screenshot of each page is kept in ``test-artifacts/`` (or ``$MECHLAB_ARTIFACTS``).
The test skips, saying why, only where Chromium, its driver or selenium is missing; CI
installs them (``.ci/run``: Debian ``chromium`` and ``chromium-driver``).
"""

from __future__ import annotations

import json
import os
import shutil
import time
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]
ARTIFACTS = Path(os.environ.get("MECHLAB_ARTIFACTS", ROOT / "test-artifacts"))
BROWSER = next((p for n in ("chromium", "chromium-browser", "google-chrome") if (p := shutil.which(n))), None)
DRIVER = shutil.which("chromedriver")

webdriver = pytest.importorskip("selenium.webdriver", reason="selenium is not installed (test extra)")
if BROWSER is None or DRIVER is None:
    pytest.skip(
        "no Chromium and chromedriver on PATH (apt-get install chromium chromium-driver)",
        allow_module_level=True,
    )


@pytest.fixture(scope="module")
def browser():
    options = webdriver.ChromeOptions()
    options.binary_location = BROWSER
    for arg in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                "--window-size=1400,1000"):  # fmt: skip
        options.add_argument(arg)
    options.set_capability("goog:loggingPrefs", {"browser": "ALL", "performance": "ALL"})
    driver = webdriver.Chrome(service=webdriver.ChromeService(executable_path=DRIVER), options=options)
    yield driver
    driver.quit()


def open_page(driver, page: Path, n_plots: int, shot: str) -> None:
    """Load ``page``; assert ``n_plots`` rendered plots, no console error, no network request."""
    driver.get_log("browser"), driver.get_log("performance")  # drop what came before
    driver.get(page.resolve().as_uri())
    deadline = time.monotonic() + 60
    script = "return document.querySelectorAll('.js-plotly-plot .main-svg').length"
    while driver.execute_script(script) < n_plots and time.monotonic() < deadline:
        time.sleep(0.2)
    plots = driver.execute_script("return document.querySelectorAll('.js-plotly-plot').length")
    drawn = driver.execute_script(
        "return [...document.querySelectorAll('.js-plotly-plot')]"
        ".filter(p => p.querySelector('.main-svg') && p.querySelector('.plot-container')).length"
    )
    assert plots == n_plots and drawn == n_plots, f"{page.name}: {drawn} of {plots} plots drawn, expected {n_plots}"
    errors = [e for e in driver.get_log("browser") if e["level"] == "SEVERE"]
    assert not errors, errors
    requests = []
    for entry in driver.get_log("performance"):
        message = json.loads(entry["message"])["message"]
        if message["method"] == "Network.requestWillBeSent":
            url = message["params"]["request"]["url"]
            if not url.startswith(("file:", "data:", "about:", "blob:")):
                requests.append(url)
    assert not requests, f"{page.name} fetched {requests}"
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    height = min(int(driver.execute_script("return document.body.scrollHeight")), 12000)
    driver.set_window_size(1400, max(height, 600))  # the whole page in one screenshot
    assert driver.save_screenshot(str(ARTIFACTS / f"{shot}.png"))
    driver.set_window_size(1400, 1000)


def test_circuit_and_overlap_pages_render_offline(browser, tmp_path):
    from mechlab.cli import main
    from mechlab.prune import Circuit
    from mechlab.viz import circuit_figure, write_html

    committed = ROOT / "circuits" / "recall-cpu"
    circuit = Circuit.from_json(committed / "1-after_seed0.json")
    page = write_html(circuit_figure(circuit), tmp_path / "circuit.html")
    open_page(browser, page, 1, "circuit")
    pair = [str(committed / f"{t}_seed0.json") for t in ("1-after", "2-after")]
    assert main(["view", *pair, "--out", str(tmp_path / "overlap.html")]) == 0
    open_page(browser, tmp_path / "overlap.html", 3, "overlap")


def test_report_page_renders_offline(browser, tmp_path, tiny_lds_checkpoint):
    from mechlab.pipelines import ReportConfig, make_report

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        cfg = ReportConfig(eval_traces=8, prune_traces=8, recall_traces=8, steps=2, seeds=(0,),
                           components=False, n_boot=20, n_null=20)  # fmt: skip
        report = make_report(tiny_lds_checkpoint, cfg, progress=False)
    finally:
        torch.set_num_threads(threads)
    page = report.write(tmp_path / "report")
    open_page(browser, page, len(report.figures()), "report")
