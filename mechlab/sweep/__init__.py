"""Sweeps of the state-tracking study: the N* search, kappa and OOD, run on Ray.

See docs/sweeps.md. Ray is needed only to run trials as Ray tasks (``pip install
mechlab[sweep]``); the search, kappa, the store and a local run work without it.
"""

from mechlab._deprecated import moved_names
from mechlab.sweep.kappa import Kappa, OodSummary, kappa, ood_summary
from mechlab.sweep.oracle import OracleTrial, oracle_trial
from mechlab.sweep.outputs import search_rows, trial_rows
from mechlab.sweep.runner import SweepResult, resolve_function, run_sweep, succeeded
from mechlab.sweep.search import NStarSearch, SearchConfig, SearchResult, search_n_star
from mechlab.sweep.spec import SearchKey, SweepSpec, available_train, unique_sequences
from mechlab.sweep.store import TrialStore, trial_key

__all__ = [
    "Kappa",
    "NStarSearch",
    "OodSummary",
    "OracleTrial",
    "SearchConfig",
    "SearchKey",
    "SearchResult",
    "SweepResult",
    "SweepSpec",
    "TrialStore",
    "available_train",
    "kappa",
    "ood_summary",
    "oracle_trial",
    "resolve_function",
    "run_sweep",
    "search_n_star",
    "search_rows",
    "succeeded",
    "trial_key",
    "trial_rows",
    "unique_sequences",
]

__getattr__ = moved_names(__name__)  # write_outputs: mechlab.pipelines.sweep
