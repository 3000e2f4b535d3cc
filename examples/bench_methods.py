"""The methods table of docs/pruning.md ("Methods side by side"): ``mechlab bench methods``.

Every circuit-finding method on the bundled checkpoint's 1-after and 2-after targets (MIB's
CPR and CMD, the circuit at 25 edges, seconds, peak memory) and its exact recoveries on
planted models and compiled Tracr programs. This script runs the command with the same
options (``mechlab bench methods --help``), from the repository root:

    nice -n 19 python examples/bench_methods.py --threads 1 --out methods.json
    nice -n 19 mechlab bench methods --threads 1 --out methods.json     # the same
"""

from __future__ import annotations

import sys

from mechlab.cli import main

if __name__ == "__main__":
    sys.exit(main(["bench", "methods", *sys.argv[1:]]))
