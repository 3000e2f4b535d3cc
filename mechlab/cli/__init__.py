"""The `mechlab` command: a thin skin over :mod:`mechlab.pipelines` (parse, call, print).

Every command turns bad input into one line on stderr and exit status 2,
without a traceback. Set ``MECHLAB_DEBUG=1`` to see the traceback instead.
Before any command runs, every ``--device`` is checked
(:func:`mechlab.devices.check_device`) and an empty path option (``--out ""``,
which would mean the current folder) is refused. Warnings are printed as one
line each (``mechlab: warning: ...``).

Modules, one per command group: :mod:`~mechlab.cli.train` (``info``, ``train``),
:mod:`~mechlab.cli.evaluate` (``eval``, ``report``, ``recall``),
:mod:`~mechlab.cli.circuits` (``prune``, ``view``, ``overlap``, ``curve``, ``pairs ioi``),
:mod:`~mechlab.cli.sweep` (``sweep``), :mod:`~mechlab.cli.translation` (``translation across``,
``translation circuits``), :mod:`~mechlab.cli.bench` (``bench ...``); the
application and what they share: :mod:`~mechlab.cli.app`, :mod:`~mechlab.cli.main`.
The commands import the pipelines (and torch) only when they run, so ``--help`` is fast,
and check first what needs neither torch nor the model
(:mod:`mechlab.pipelines.preflight`), so a bad invocation answers at once. A signal during
a long command (``prune``, ``report``, ``eval``, ``recall``, ``curve``, ``sweep``) ends it
with one line naming what it kept and the command that resumes
(:class:`mechlab.pipelines.stops.Interrupted`); ``overlap`` and ``bench methods``, which
write only at their end, say that nothing was written
(:class:`mechlab.pipelines.stops.Unwritten`); exit status 128 + the signal.
"""

import typer

from mechlab.cli import bench as _bench  # noqa: F401  (registers the bench commands)
from mechlab.cli.app import UsageProblem, app, bench_app
from mechlab.cli.circuits import curve, overlap_, pairs_ioi, prune, view
from mechlab.cli.evaluate import eval_, recall, report
from mechlab.cli.main import main
from mechlab.cli.sweep import sweep_
from mechlab.cli.train import info, train
from mechlab.cli.translation import translation_app

# The commands, in the order --help lists them.
app.command()(info)
app.command()(train)
app.command("eval")(eval_)
app.command()(report)
app.command()(recall)
app.command()(prune)
app.command()(view)
app.command("overlap")(overlap_)
app.command("curve")(curve)
app.command("sweep")(sweep_)
pairs_app = typer.Typer(no_args_is_help=True, rich_markup_mode=None,
                        help="Prompt pairs for mechlab prune --pairs.")  # fmt: skip
pairs_app.command("ioi")(pairs_ioi)
app.add_typer(pairs_app, name="pairs")
app.add_typer(translation_app, name="translation")

__all__ = ["UsageProblem", "app", "bench_app", "main"]
