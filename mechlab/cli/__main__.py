"""``python -m mechlab.cli``: the ``mechlab`` command."""

import sys

from mechlab.cli import main

sys.exit(main())
