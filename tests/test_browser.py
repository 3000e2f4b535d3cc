"""The HTML pages render in a real browser, offline: headless Chromium through selenium.

For the report page, the circuit explorer (``mechlab view``) and a circuit figure, at 800
and 1400 px wide, and for every figure of ``mechlab.viz`` drawn from the committed results,
at 800 and 1600 px: every plot draws its SVG, the console shows no error, the page fetches
nothing from the network (plotly.js is in the page or in the folder's ``plotly.min.js``),
and no two titles, legends or annotations of a plot overlap (their bounding boxes). The
report's every section opens with its "how to read this"; the explorer answers its
controls and clicks. A screenshot of each page and width is kept in ``test-artifacts/``
(or ``$MECHLAB_ARTIFACTS``). The test skips, saying why, only where Chromium, its driver
or selenium is missing; CI installs them (``.ci/run``: Debian ``chromium`` and
``chromium-driver``) and sets ``MECHLAB_REQUIRE_BROWSER=1``, under which a missing browser
fails instead.
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
WIDTHS = (800, 1400)

# CI (.ci/run) installs Chromium and sets MECHLAB_REQUIRE_BROWSER=1: there a missing browser
# fails the run instead of skipping the check.
REQUIRED = os.environ.get("MECHLAB_REQUIRE_BROWSER", "") not in ("", "0")
MISSING = "no Chromium and chromedriver on PATH (apt-get install chromium chromium-driver)"
if REQUIRED and (BROWSER is None or DRIVER is None):
    pytest.fail(f"MECHLAB_REQUIRE_BROWSER is set but there is {MISSING}", pytrace=False)
webdriver = pytest.importorskip(
    "selenium.webdriver", reason="selenium is not installed (pip install -e '.[test]')"
)
if BROWSER is None or DRIVER is None:
    pytest.skip(MISSING, allow_module_level=True)

# Every title, legend, colour bar and annotation of every plot, as bounding boxes, and the
# pairs of one plot that overlap by more than 1 px each way.
OVERLAPS = """
const out = [];
document.querySelectorAll('.js-plotly-plot').forEach((plot, k) => {
  const boxes = [...plot.querySelectorAll('.infolayer > *')]
    .filter(e => /^(legend|g-g?[xy]?\\d*title|annotation)|colorbar/.test(e.getAttribute('class') || ''))
    .map(e => ({what: (e.getAttribute('class') + ': ' + e.textContent).slice(0, 60), r: e.getBoundingClientRect()}))
    .filter(b => b.r.width > 0 && b.r.height > 0);
  for (let i = 0; i < boxes.length; i++) for (let j = i + 1; j < boxes.length; j++) {
    const a = boxes[i].r, b = boxes[j].r;
    const dx = Math.min(a.right, b.right) - Math.max(a.left, b.left);
    const dy = Math.min(a.bottom, b.bottom) - Math.max(a.top, b.top);
    if (dx > 1 && dy > 1) out.push(`plot ${k}: "${boxes[i].what}" overlaps "${boxes[j].what}"`);
  }
});
return out;
"""


@pytest.fixture(scope="module")
def browser():
    options = webdriver.ChromeOptions()
    options.binary_location = BROWSER
    for arg in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                "--window-size=1400,1000", "--hide-scrollbars"):  # fmt: skip
        options.add_argument(arg)
    options.set_capability("goog:loggingPrefs", {"browser": "ALL", "performance": "ALL"})
    driver = webdriver.Chrome(service=webdriver.ChromeService(executable_path=DRIVER), options=options)
    yield driver
    driver.quit()


def open_page(driver, page: Path, n_plots: int, shot: str, width: int) -> None:
    """Load ``page`` at ``width`` px; assert ``n_plots`` rendered plots, no console error,
    no network request and no overlapping titles, legends or annotations."""
    driver.get_log("browser"), driver.get_log("performance")  # drop what came before
    driver.set_window_size(width, 1000)
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
    overlaps = driver.execute_script(OVERLAPS)
    assert not overlaps, f"{page.name} at {width} px: {overlaps}"
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    height = min(int(driver.execute_script("return document.body.scrollHeight")), 12000)
    driver.set_window_size(width, max(height, 600))  # the whole page in one screenshot
    assert driver.save_screenshot(str(ARTIFACTS / f"{shot}-{width}.png"))


@pytest.fixture(scope="module")
def report_page(tiny_lds_checkpoint, tmp_path_factory):
    import warnings

    from mechlab.pipelines import ReportConfig, make_report

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        cfg = ReportConfig(eval_traces=8, prune_traces=8, recall_traces=8, steps=2, seeds=(0, 1, 2),
                           n_boot=20, n_null=20)  # fmt: skip
        with warnings.catch_warnings():  # 2 steps on an untrained model: the search fails, on purpose
            warnings.filterwarnings("ignore", message="circuit for .* the search likely failed")
            report = make_report(tiny_lds_checkpoint, cfg, progress=False)
    finally:
        torch.set_num_threads(threads)
    return report, report.write(tmp_path_factory.mktemp("report") / "report")


@pytest.mark.parametrize("width", WIDTHS)
def test_report_page_renders_offline_explains_every_section_and_nothing_overlaps(browser, report_page, width):
    report, page = report_page
    assert (page.parent / "plotly.min.js").is_file()  # the page's one copy of plotly.js
    open_page(browser, page, len(report.figures()) + 1, "report", width)  # + the circuit explorer
    sections = browser.execute_script(
        "return [...document.querySelectorAll('section')].map(s => [s.id, (s.querySelector('p.how') || {}).textContent || ''])"
    )
    ids = [sid for sid, _ in sections]
    assert ids == ["findings", "evaluation", "circuits", "overlap", "cross-evaluation", "recall",
                   "definitions", "files"]  # fmt: skip
    unexplained = [sid for sid, how in sections if not how.startswith("How to read this.") or len(how) < 60]
    assert not unexplained, f"sections without their explanation: {unexplained}"


def test_circuit_figure_and_explorer_render_offline_and_answer(browser, tmp_path):
    from mechlab.cli import main
    from mechlab.prune import Circuit
    from mechlab.viz import circuit_figure, write_html

    committed = ROOT / "circuits" / "recall-cpu"
    circuit = Circuit.from_json(committed / "1-after_seed0.json")
    page = write_html(circuit_figure(circuit), tmp_path / "circuit.html")
    for width in WIDTHS:
        open_page(browser, page, 1, "circuit", width)
    files = [str(committed / f"{t}_seed{s}.json") for t in ("1-after", "2-after") for s in (0, 1, 2)]
    assert main(["view", *files, "--out", str(tmp_path / "view.html")]) == 0
    for width in WIDTHS:
        open_page(browser, tmp_path / "view.html", 1, "explorer", width)
    ex = "Object.values(window.mechlabExplorers)[0]"
    first = browser.execute_script(f"return {ex}.summary()")
    assert first.startswith("1-after · prune · seed 0: ")  # one circuit, then the pair
    browser.execute_script(f"{ex}.show(4, 0)")  # 2-after seed 1 against 1-after seed 0
    pair = browser.execute_script(f"return {ex}.summary()")
    assert pair.startswith("2-after · prune · seed 1: ") and "Jaccard of the edges shown" in pair
    assert browser.execute_script("return document.querySelector('.mx-seed').value") == "1"
    browser.execute_script(f"{ex}.filter(0, 1)")  # only edges every seed of the target keeps
    stable = browser.execute_script(f"return {ex}.summary()")
    assert stable != pair
    # a click on an edge's midpoint: its scores, under both names
    browser.execute_script(
        "const p = document.querySelector('.mx-plot');"
        "const t = p.data.findIndex(d => d.name === 'edge (hover, click)');"
        "p.emit('plotly_click', {points: [{customdata: p.data[t].customdata[0]}]});"
    )
    details = browser.execute_script(f"return {ex}.details()")
    assert details.startswith("edge ") and "hooks " in details and "score " in details and "stability" in details
    assert not [e for e in browser.get_log("browser") if e["level"] == "SEVERE"]


def every_figure() -> list[tuple[str, object]]:
    """Every figure builder of ``mechlab.viz``, each drawn from results committed in the
    repository (the bundled checkpoints' evaluations, recall analyses, curves and circuits,
    the state-tracking sweep), so that the layouts are checked on real numbers."""
    from mechlab.prune import Circuit
    from mechlab.prune.curves import read_curves
    from mechlab.viz import (
        circuit_figure,
        circuits_across_checkpoints_figure,
        faithfulness_curves_figure,
        figure_for_suite,
        overlap_figure,
        recall_dynamics_figure,
        recall_figure,
    )
    from mechlab.viz.sweep import kappa_figure, n_star_figure, ood_kappa_figure

    run = ROOT / "examples" / "checkpoints" / "recall-cpu"
    circuits = ROOT / "circuits"

    def read(path: Path):
        return json.loads(path.read_text())

    recall = [Circuit.from_json(circuits / "recall-cpu" / f"{t}_seed{s}.json") for t in ("1-after", "2-after") for s in (0, 1)]
    searches = read(ROOT / "examples" / "sweeps" / "state-tracking-cpu" / "searches.json")
    figures = [(f"eval {s}", figure_for_suite(read(run / "eval" / f"{s}.json")))
               for s in ("nih", "ood", "uninterleaved", "dynamics")]  # fmt: skip
    figures += [
        ("recall", recall_figure(read(run / "recall" / "recall.json"))),
        ("recall dynamics", recall_dynamics_figure(read(run / "recall" / "recall_dynamics.json"))),
        ("curves", faithfulness_curves_figure(read_curves(circuits / "recall-cpu" / "curves" / "curve_1-after.json")
                                              + read_curves(circuits / "recall-cpu" / "curves" / "curve_2-after.json"))),
        ("transformer circuit", circuit_figure(recall[0])),
        ("LSTM circuit", circuit_figure(Circuit.from_json(circuits / "recall-lstm-cpu" / "1-after_seed0.json"))),
        ("induction circuit", circuit_figure(Circuit.from_json(circuits / "induction-cpu" / "all_seed0.json"))),
        ("state-tracking circuit", circuit_figure(Circuit.from_json(circuits / "state-tracking" / "dense_ssm" / "final_n6_seed0.json"))),
        ("overlap of two", overlap_figure(recall[:1] + recall[2:3])),
        ("overlap of four", overlap_figure(recall, labels=["1-after s0", "1-after s1", "2-after s0", "2-after s1"])),
        ("across checkpoints", circuits_across_checkpoints_figure(recall[:2], steps=[100, 200])),
        ("N*", n_star_figure(searches)),
        ("kappa", kappa_figure(searches)),
        ("OOD kappa", ood_kappa_figure(searches)),
    ]  # fmt: skip
    return figures


def test_every_figure_holds_at_800_and_1600_px_on_the_committed_results(browser, tmp_path):
    from mechlab.viz.figures import page_html, write_plotlyjs

    figures = every_figure()
    write_plotlyjs(tmp_path)
    page = tmp_path / "figures.html"
    page.write_text(page_html("Every figure", figures, plotlyjs="directory"))
    for width in (800, 1600):  # the two ends of the range a figure must hold
        open_page(browser, page, len(figures), "figures", width)
