"""``python -m mechlab ...``: the ``mechlab`` command without its console script."""

from mechlab.cli import main

raise SystemExit(main())
