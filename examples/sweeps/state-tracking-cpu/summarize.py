"""Tables and figures of the CPU-scale state-tracking sweep from its trial store, finished or not.

``mechlab sweep`` writes its tables only when every search has finished. This script
replays every search of ``sweep.yaml`` from ``trials/`` (no training) and writes the same
tables and figures (``mechlab.pipelines.write_outputs``) for whatever has finished. A search
still open is written with ``status`` ``open``, its bracket so far (``lo``: the largest N
that failed, ``hi``: the smallest that succeeded, either may be empty) and ``n_star`` = hi;
kappa over open searches is computed from those brackets (``kappa_low``/``kappa_high``
are then the range the brackets allow, and ``kappa_bound`` is prefixed ``open-``).

Run from the repository root::

    python examples/sweeps/state-tracking-cpu/summarize.py [FOLDER]

(``FOLDER``: another sweep folder with a ``sweep.yaml``, e.g. ``transformer-3000-steps``.)
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from mechlab.pipelines import write_outputs
from mechlab.sweep.kappa import kappa, ood_summary
from mechlab.sweep.runner import SweepResult, succeeded
from mechlab.sweep.search import NStarSearch, SearchResult
from mechlab.sweep.spec import JOINT, SearchKey, SweepSpec
from mechlab.sweep.store import TrialStore, trial_key

HERE = Path(__file__).resolve().parent


def replay(
    spec: SweepSpec, store: TrialStore, key: SearchKey, used: dict[str, None]
) -> SearchResult:
    """Replay one search from the store as far as its trials go.

    Args:
        spec: The sweep.
        store: Its finished trials.
        key: The search.
        used: Trial keys read so far (extended in place, in order).

    Returns:
        The search's result; status ``open`` when a point's outcome is not known yet.
    """
    search = NStarSearch(spec.search, cap=spec.cap(key))
    while not search.done:
        n = search.next_n()
        specs = spec.trial_specs(key, n)
        results = [store.get(s) for s in specs]
        for s, r in zip(specs, results, strict=True):
            if r is not None:
                used[trial_key(s)] = None
        if any(r is not None and succeeded(r, spec.search.epsilon) for r in results):
            search.record(n, True)
        elif all(r is not None for r in results):
            search.record(n, False)
        else:
            ratio = (
                search.hi / search.lo if search.hi is not None and search.lo is not None else None
            )
            return SearchResult(n_star=search.hi, status="open", lo=search.lo, hi=search.hi, cap=search.cap,
                                steps=len(search.history), ratio=ratio, history=list(search.history))  # fmt: skip
    return search.result()


def assemble(
    spec: SweepSpec, store: TrialStore, searches: dict[SearchKey, SearchResult], used: dict[str, None]
) -> SweepResult:
    """The sweep's result from its searches: kappa of each joint search (``open-`` when a
    search it rests on is open) and OOD at each main search's N.

    Args:
        spec: The sweep.
        store: Its finished trials.
        searches: Each search's (possibly open) result.
        used: Trial keys read so far (extended in place with the OOD trials); the
            result's ``trials`` are these.

    Returns:
        The (possibly partial) :class:`SweepResult`.
    """
    result = SweepResult(spec=spec, searches=searches)
    for key in spec.main_keys():
        if spec.kappa and key.lengths in JOINT:
            per_length = {k.L: searches[k] for k in spec.kappa_keys(key)}
            value = kappa(per_length, searches[key], key.L)
            if any(r.status == "open" for r in [*per_length.values(), searches[key]]):
                value = replace(value, bound=f"open-{value.bound}")
            result.kappas[key] = value
        ood_specs = spec.trial_specs(key, spec.ood_n_for(key))
        ood_trials = [store.get(s) for s in ood_specs]
        for s, r in zip(ood_specs, ood_trials, strict=True):
            if r is not None:
                used[trial_key(s)] = None
        result.ood[key] = ood_summary([r for r in ood_trials if r is not None])
    result.trials = [store.get_key(k) for k in used]
    return result


def summarize(folder: Path = HERE) -> SweepResult:
    """Replay the sweep in ``folder`` and write its tables and figures there.

    Args:
        folder: The sweep folder (``sweep.yaml`` and ``trials/``).

    Returns:
        The (possibly partial) :class:`SweepResult`.
    """
    spec = SweepSpec.from_yaml(folder / "sweep.yaml")
    store = TrialStore(folder / "trials")
    used: dict[str, None] = {}
    searches = {key: replay(spec, store, key, used) for key in spec.search_keys()}
    result = assemble(spec, store, searches, used)
    write_outputs(result, folder, figures=False)
    write_figures(folder)
    return result


def write_figures(folder: Path) -> None:
    """The sweep's three figures (``mechlab.viz.sweep``) from ``searches.json``, as HTML
    pages that load plotly.js from its CDN (a few KB each instead of ~4.8 MB).

    Args:
        folder: The sweep folder (``searches.json`` written).
    """
    import json

    from mechlab.io import atomic_write_text
    from mechlab.viz.sweep import kappa_figure, n_star_figure, ood_kappa_figure

    rows = json.loads((folder / "searches.json").read_text(encoding="utf-8"))
    for name, make in (
        ("nstar", n_star_figure),
        ("kappa", kappa_figure),
        ("ood_kappa", ood_kappa_figure),
    ):
        html = make(rows).to_html(include_plotlyjs="cdn", full_html=True)
        atomic_write_text(folder / f"{name}.html", html)


if __name__ == "__main__":
    import sys

    out = summarize(Path(sys.argv[1]) if len(sys.argv) > 1 else HERE)
    for key, r in out.searches.items():
        print(f"{key.label:55s} N*={r.n_star} {r.status} ({r.lo}, {r.hi}] {r.history}")
    for key, k in out.kappas.items():
        print(f"kappa {key.label}: {k.value} {k.bound} [{k.low}, {k.high}]")
    for key, o in out.ood.items():
        print(
            f"OOD {key.label}: {None if o is None else (o.n_train, round(o.token_acc, 3), round(o.seq_acc, 3))}"
        )
