"""Writing outputs: every file a pipeline (and so every command) writes goes through here,
under one output policy.

**Nothing that exists is replaced unless asked.** A command writes into a fresh place,
or resumes where resuming is its promise, or refuses with one line naming ``--force``:

* a single output file (``view --out``, ``overlap --json``) must not exist
  (:func:`check_output_file`);
* an output folder (:class:`OutputFolder`) is claimed before the first stage runs: its
  path is checked (not a file, creatable), an exclusive lock taken (one per folder; it
  covers the folder and everything under it, so that two runs into one folder, or into a
  folder and one inside it, cannot interleave), and each file the command will write
  is looked at first: a file that is not resumed is refused when it exists
  (:meth:`OutputFolder.check_fresh`); a command that resumes (``eval``, ``recall``,
  ``prune``, ``prune --share``, ``prune --pairs``, ``curve``, ``report``, ``sweep``: a
  signal stops it naming what it kept, :mod:`mechlab.pipelines.stops`) reuses a file only
  when the settings it records are the run's, and refuses
  one made with other settings, naming them (:meth:`OutputFolder.plan`); a command that
  owns its folder's layout (``report``) also refuses files it does not write, another
  command's outputs (a prune's circuits), naming them (:meth:`OutputFolder.check_foreign`).

**Never, even with --force**: a command writes over one of its inputs (a checkpoint, a
circuit, a config, a file of an input folder such as a model's or tokenizer's), over a
file that looks like a checkpoint, or over a path that is not a regular file (a device
node such as ``/dev/null``, a pipe, a socket).

**Nothing committed.** A file or folder that holds files git tracks is refused unless
``--force`` (so ``prune --out circuits/recall-cpu`` does not rewrite committed circuits),
and the default output folder of every command is ``mechlab-out/<run>/<what>`` in the
current folder (:func:`default_out`), never beside a (possibly committed) checkpoint.

**Settings records.** Every result a command may reuse records the settings that shaped
it (``settings``: the checkpoint's sha256 and every option that changes what is computed,
as canonical JSON) and their SHA-256 (``settings_sha256``); circuits record both in their
metadata. Device, threads and progress bars are not settings: they change rounding or
display, not what is computed. The records are made and read in
:mod:`mechlab.pipelines.records`, the folder locks in :mod:`mechlab.pipelines.locks`; their
names are importable from here too.

Every write is atomic (a temporary file, then a rename: :func:`mechlab.io.atomic_write`);
temporary files an interrupted run left in a folder are removed when the folder is
claimed again (under its lock), and a refused run leaves nothing behind (the folders it
made for itself are removed again when nothing was written into them).
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import stat
import subprocess
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from types import TracebackType
from typing import Any

from mechlab.io import atomic_write_text
from mechlab.pipelines.locks import LOCK_NAME as LOCK_NAME
from mechlab.pipelines.locks import Lock as _Lock
from mechlab.pipelines.records import canonical as canonical
from mechlab.pipelines.records import differences, read_record, settings_record
from mechlab.pipelines.records import file_sha256 as file_sha256
from mechlab.pipelines.records import read_json as read_json
from mechlab.pipelines.records import with_defaults as with_defaults

DEFAULT_ROOT = "mechlab-out"
"""The folder, in the current one, under which commands write when no ``--out`` is given."""

CHECKPOINT_SUFFIXES = (".pt", ".pth", ".safetensors", ".ckpt", ".bin")
_ZIP_MAGIC = b"PK\x03\x04"  # a torch checkpoint is a zip archive
_TEMP_NAME = re.compile(r"^\.(?P<name>.+)\.[a-z0-9_]{8}\.tmp$")  # mechlab.io's temporary files
_CLEANED = (".json", ".html", ".csv")  # the temporary files of outputs a command removes


# --------------------------------------------------------------------------- low-level writes


def write_text(path: str | Path, text: str) -> Path:
    """Write ``text`` to ``path`` atomically (folders created); returns the path.

    Raises:
        ValueError: ``path`` is a checkpoint, or exists and is not a regular file (a device
            node, a pipe): never replaced by an output.
    """
    _refuse_checkpoint(Path(path))
    _refuse_special(Path(path))
    return atomic_write_text(path, text)


def write_json(path: str | Path, data: Any, *, newline: bool = False, default: Any = None) -> Path:
    """Write ``data`` as indented JSON (``indent=1``; NaN and infinities as ``NaN``,
    ``Infinity``), atomically.

    Args:
        path: The file.
        data: JSON-ready values.
        newline: End the file with a newline.
        default: ``json.dumps``'s ``default`` (how to write other values).
    """
    text = json.dumps(data, indent=1, default=default)
    return write_text(path, text + "\n" if newline else text)


def write_figure(figure: Any, path: str | Path) -> Path:
    """Write a plotly figure as an offline HTML page that loads the folder's one
    ``plotly.min.js`` (:func:`write_plotlyjs`), not a 4.8 MB copy of its own."""
    # lazy: the CLI's checks (pipelines.preflight) use this module before torch loads; mechlab.viz loads torch
    from mechlab.viz.figures import figure_html

    write_plotlyjs(Path(path).parent)
    return write_text(path, figure_html(figure, plotlyjs="directory"))


def write_plotlyjs(folder: str | Path) -> Path:
    """``folder/plotly.min.js``, the one copy of plotly.js the folder's pages load
    (written when missing or different; the same file is left alone)."""
    # lazy: the CLI's checks (pipelines.preflight) use this module before torch loads; mechlab.viz loads torch
    from mechlab.viz.figures import write_plotlyjs as write_once

    return write_once(folder, writer=write_text)


def write_circuit(circuit: Any, path: str | Path) -> Path:
    """Write a :class:`~mechlab.prune.circuit.Circuit` as JSON (what ``Circuit.from_json`` reads)."""
    return write_json(path, circuit.to_dict())


def write_circuit_figure(circuit: Any, path: str | Path, title: str | None = None) -> Path:
    """Write a circuit's graph (:func:`mechlab.viz.circuit_figure`) as offline HTML."""
    # lazy: the CLI's checks (pipelines.preflight) use this module before torch loads; mechlab.viz loads torch
    from mechlab.viz.circuits import circuit_figure

    return write_figure(circuit_figure(circuit, title), path)


# --------------------------------------------------------------------------- what a path is


def git_tracked(path: str | Path) -> list[str]:
    """The files git tracks at ``path`` or under it (paths relative to their repository),
    or ``[]`` outside a git work tree (or without git)."""
    path = Path(path).absolute()
    here = path
    while not here.exists() and here != here.parent:
        here = here.parent
    root = next((p for p in (here, *here.parents) if (p / ".git").exists()), None)
    if root is None:
        return []
    try:
        rel = os.path.relpath(os.path.realpath(path), os.path.realpath(root))
    except ValueError:  # another drive
        return []
    if rel.startswith(".."):
        return []
    try:
        done = subprocess.run(
            ["git", "-c", "safe.directory=*", "-C", str(root), "ls-files", "-z", "--", rel],
            capture_output=True, timeout=30, check=False,
        )  # fmt: skip
    except (OSError, subprocess.SubprocessError):
        return []
    if done.returncode != 0:
        return []
    return [p for p in done.stdout.decode("utf-8", "replace").split("\0") if p]


def is_checkpoint(path: str | Path) -> bool:
    """Whether an existing file looks like a checkpoint (its suffix, or a zip archive as
    ``torch.save`` writes)."""
    path = Path(path)
    if not path.is_file():
        return False
    if path.suffix.lower() in CHECKPOINT_SUFFIXES:
        return True
    try:
        with path.open("rb") as f:
            return f.read(4) == _ZIP_MAGIC
    except OSError:
        return False


def _refuse_checkpoint(path: Path) -> None:
    if is_checkpoint(path):
        raise ValueError(f"{str(path)!r} is a checkpoint; mechlab never writes an output over one "
                         "(not even with --force): choose another path")  # fmt: skip


def _refuse_special(path: Path, option: str | None = None) -> None:
    """Refuse an existing path that is not a regular file or a folder (a device node, a pipe,
    a socket): replacing it would destroy it (``--out /dev/null --force`` as root), so not
    even ``--force`` does."""
    try:
        mode = path.stat().st_mode
    except OSError:
        return  # missing (or a dangling link): nothing to destroy
    if not (stat.S_ISREG(mode) or stat.S_ISDIR(mode)):
        where = f"{option} {str(path)!r}" if option else repr(str(path))
        raise ValueError(f"{where} is not a regular file (a device, a pipe or a socket); mechlab never "
                         "writes an output over one (not even with --force): choose another file")  # fmt: skip


def _same_file(a: Path, b: Path) -> bool:
    try:
        return a.exists() and b.exists() and os.path.samefile(a, b)
    except OSError:
        return False


def _input_holding(path: Path, inputs: Iterable[Path]) -> Path | None:
    """The input folder an existing file lies in (a model or tokenizer folder: its files
    are part of that input), or None."""
    if not path.exists():
        return None
    real = Path(os.path.realpath(path))
    for given in inputs:
        if given.is_dir() and Path(os.path.realpath(given)) in real.parents:
            return given
    return None


def run_name(source: str | Path) -> str:
    """The name of a checkpoint's run: its folder's name (``runs/x/last.pt`` -> ``x``),
    with the file's stem unless it is ``last`` (``runs/x/checkpoints/step_0000040.pt`` ->
    ``x-step_0000040``)."""
    path = Path(source).absolute()
    folder = path.parent.parent if path.parent.name == "checkpoints" else path.parent
    name = folder.name or "checkpoint"
    return name if path.stem == "last" else f"{name}-{path.stem}"


def default_out(source: str | Path, what: str) -> Path:
    """The default output folder of a command: ``mechlab-out/<run>/<what>`` in the current
    folder (:func:`run_name`), so that no default sits where committed results are."""
    return Path(DEFAULT_ROOT) / run_name(source) / what


def check_output_file(
    path: str | Path,
    *,
    force: bool = False,
    inputs: Iterable[str | Path] = (),
    option: str = "--out",
    suffixes: Sequence[str] = (),
) -> Path:
    """Check a single output file before any work (``view --out``, ``overlap --json``).

    Refused, with one line: one of the ``inputs``, a checkpoint, a folder, or anything else
    that is not a regular file (a device node, a pipe: always); a file that exists or that git tracks (unless ``force``); a place no file can be made
    (its nearest existing folder is a file or not writable); another suffix than
    ``suffixes``.

    Returns:
        The path.
    """
    path = Path(path)
    shown = str(path)
    for given in inputs:
        if _same_file(path, Path(given)) or os.path.abspath(path) == os.path.abspath(given):
            raise ValueError(f"{option} {shown!r} is one of the inputs; write the output elsewhere")
    holder = _input_holding(path, [Path(p) for p in inputs])
    if holder is not None:
        raise ValueError(f"{option} {shown!r} is a file of the input folder {str(holder)!r}; write the output elsewhere")
    _refuse_checkpoint(path)
    if suffixes and path.suffix.lower() not in suffixes:
        raise ValueError(f"{option} must be a {' or '.join(suffixes)} file, got {shown!r}")
    if path.is_dir():
        raise ValueError(f"{option} {shown!r} is a folder; give a file name")
    _refuse_special(path, option)
    if path.exists() and not force:
        raise ValueError(f"{option} {shown!r} exists; pass --force to replace it, or choose another file")
    if not force and git_tracked(path):
        raise ValueError(f"{option} {shown!r} is tracked by git; pass --force to replace it, or choose another file")
    _check_creatable(path.parent, option, shown)
    return path


def _check_creatable(folder: Path, option: str, shown: str) -> None:
    """Refuse a folder that cannot be made: its nearest existing ancestor is a file or not
    writable."""
    here = folder.absolute()
    while not here.exists() and here != here.parent:
        here = here.parent
    if not here.is_dir():
        raise ValueError(f"{option} {shown!r}: {str(here)!r} is a file, not a folder; choose another path")
    if not os.access(here, os.W_OK | os.X_OK):
        raise ValueError(f"{option} {shown!r}: {str(here)!r} is not writable; choose another path")


# --------------------------------------------------------------------------- output folders


class OutputFolder:
    """An output folder under the policy: checked at construction (nothing written), claimed
    with ``with`` (created, locked, temporary files of an interrupted run removed), written
    through its methods, released on exit.

    Args:
        folder: The folder.
        command: The command, for messages and the lock file (``"prune"``).
        force: Replace files of other settings (or any file, for a command without resume),
            and write into a folder git tracks.
        inputs: Files the command reads; none of them is ever written.
        option: The option that named the folder, for messages.

    Raises:
        ValueError: One line, before anything is written: the folder is a file, one of the
            inputs, holds files git tracks (without ``force``), or cannot be made.
    """

    def __init__(self, folder: str | Path, command: str, *, force: bool = False,
                 inputs: Iterable[str | Path] = (), option: str = "--out") -> None:  # fmt: skip
        self.path = Path(folder)
        self.command, self.force, self.option = command, force, option
        self.inputs = [Path(p) for p in inputs]
        self.written: list[Path] = []
        self.reused: list[Path] = []
        self.removed_temps: list[Path] = []
        self._created: list[Path] = []
        self._lock: _Lock | None = None
        shown = str(self.path)
        if self.path.exists() and not self.path.is_dir():
            raise ValueError(f"{option} {shown!r} is a file, not a folder; choose another {option}")
        if any(_same_file(self.path, p) for p in self.inputs):
            raise ValueError(f"{option} {shown!r} is one of the inputs; choose another {option}")
        _check_creatable(self.path, option, shown)
        if not force:
            tracked = git_tracked(self.path)
            if tracked:
                raise ValueError(
                    f"{option} {shown!r} holds files git tracks ({tracked[0]}"
                    + (f" and {len(tracked) - 1} more" if len(tracked) > 1 else "")
                    + "); pass --force to write there anyway, or choose another folder"
                )

    # -- claiming ---------------------------------------------------------------------
    def __enter__(self) -> OutputFolder:
        missing = []
        here = self.path.absolute()
        while not here.exists():
            missing.append(here)
            here = here.parent
        try:
            self.path.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise ValueError(f"{self.option} {str(self.path)!r} cannot be made ({exc.strerror}); "
                             "choose another folder") from None  # fmt: skip
        self._created = missing
        try:
            self._lock = _Lock(self.path, self.command, self.option)
            self._lock.acquire()
            self.removed_temps = _remove_temps(self.path)
        except BaseException:
            self._release(failed=True)
            raise
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        self._release(failed=kind is not None)

    def _release(self, failed: bool) -> None:
        if self._lock is not None:
            self._lock.release()
            self._lock = None
        if failed:  # a refused or failed run leaves no folder it made for nothing
            for folder in sorted(self._created, key=lambda p: len(p.parts), reverse=True):
                with contextlib.suppress(OSError):
                    folder.rmdir()  # only when empty

    # -- looking before writing ---------------------------------------------------------
    def file(self, name: str | Path) -> Path:
        """The path of ``name`` in the folder."""
        return self.path / name

    def check_fresh(self, names: Iterable[str | Path]) -> None:
        """Refuse (unless ``force``) when any of ``names`` exists: the files of a command that
        does not resume (``eval``, ``recall``)."""
        existing = [path for path in map(self.check_path, names) if path.exists()]
        if existing and not self.force:
            more = f" (and {len(existing) - 1} more)" if len(existing) > 1 else ""
            raise ValueError(f"{str(existing[0])!r}{more} exists; pass --force to replace it, or choose "
                             f"another {self.option}")  # fmt: skip

    def foreign(self, own: Mapping[str, Iterable[str] | None]) -> list[Path]:
        """The files and folders of the folder that the command does not write: another
        command's outputs (a prune's circuits in a report's folder), sorted.

        Args:
            own: The names the command writes at the folder's top -> ``None`` (a file, or a
                folder whose contents the command checks itself) or, for a folder, the names
                it writes inside it (``{"eval": ("nih.json", "ood.json")}``). Hidden entries
                (the lock, temporary files, ``.DS_Store``) are not counted.
        """
        found: list[Path] = []
        if not self.path.is_dir():
            return found
        for entry in sorted(self.path.iterdir()):
            if entry.name.startswith("."):
                continue
            if entry.name not in own:
                found.append(entry)
                continue
            inside = own[entry.name]
            if inside is not None and entry.is_dir():
                found.extend(p for p in sorted(entry.iterdir()) if not p.name.startswith(".") and p.name not in inside)
        return found

    def check_foreign(self, own: Mapping[str, Iterable[str] | None], what: str) -> list[Path]:
        """Refuse (unless ``force``) a folder that holds files the command does not write
        (:meth:`foreign`): writing there would mix its outputs with another command's. One
        line naming what is in the way; nothing is written or removed.

        Args:
            own: What the command writes (see :meth:`foreign`).
            what: Whose files the command writes, for the message (``"a report"``).

        Returns:
            The foreign entries (left where they are, with ``force``).
        """
        found = self.foreign(own)
        if found and not self.force:
            names = [str(p.relative_to(self.path)) + ("/" if p.is_dir() else "") for p in found]
            shown = ", ".join(names[:3]) + (f" and {len(names) - 3} more" if len(names) > 3 else "")
            raise ValueError(f"{self.option} {str(self.path)!r} holds files {what} does not write, which it would "
                             f"mix with its own ({shown}); pass --force to write beside them, or choose "
                             f"another {self.option}")  # fmt: skip
        return found

    def plan(self, entries: Mapping[str | Path, Mapping[str, Any]]) -> dict[str, str]:
        """What to do with each result a resuming command may write, before any work.

        Args:
            entries: File name (the JSON that records the result's settings) -> settings.

        Returns:
            Name -> ``"new"`` (no file: compute), ``"same"`` (the file records these
            settings: reuse it) or ``"redo"`` (other settings, with ``force``: compute and
            replace).

        Raises:
            ValueError: Without ``force``, files of other settings (or with no settings
                record): one line naming the first, how many, and the settings that differ.
        """
        status: dict[str, str] = {}
        conflicts: list[tuple[Path, str]] = []
        for name, settings in entries.items():
            path = self.check_path(name)
            if not path.exists():
                status[str(name)] = "new"
                continue
            record = read_record(path)
            want = settings_record(settings)["settings_sha256"]
            if record is not None and record["settings_sha256"] == want:
                status[str(name)] = "same"
                continue
            status[str(name)] = "redo"
            conflicts.append((path, record, settings))
        if conflicts and not self.force:
            path, record, settings = conflicts[0]
            n = len(conflicts) - 1
            subject = f"{str(path)!r}" + (f" and {n} more file{'s' * (n > 1)}" if n else "")
            why = (f"{'hold' if n else 'holds'} no settings record (written by hand or by an older mechlab)"
                   if record is None else
                   f"{'were' if n else 'was'} made with other settings: {differences(record['settings'], settings)}")  # fmt: skip
            raise ValueError(f"{subject} {why}; pass --force to recompute and replace, or choose "
                             f"another {self.option}")  # fmt: skip
        return status

    def check_path(self, name: str | Path) -> Path:
        """Refuse a file of the folder that cannot be written: a folder on its path is a
        file (``DIR/circuits`` a file), or the file itself is an input, a checkpoint or a
        folder."""
        path = self.file(name)
        for parent in reversed(path.relative_to(self.path).parents[:-1]):
            where = self.path / parent
            if where.exists() and not where.is_dir():
                raise ValueError(f"{str(where)!r} is a file where mechlab writes a folder; move it, or choose "
                                 f"another {self.option}")  # fmt: skip
        if path.exists():
            self._check_target(path)
        return path

    def _check_target(self, path: Path) -> None:
        if any(_same_file(path, p) for p in self.inputs):
            raise ValueError(f"{str(path)!r} is one of the inputs; choose another {self.option}")
        holder = _input_holding(path, self.inputs)
        if holder is not None:
            raise ValueError(f"{str(path)!r} is a file of the input folder {str(holder)!r}; choose another {self.option}")
        _refuse_checkpoint(path)
        if path.is_dir():
            raise ValueError(f"{str(path)!r} is a folder where mechlab writes a file; choose another {self.option}")
        _refuse_special(path)

    # -- writing ----------------------------------------------------------------------
    def _target(self, name: str | Path) -> Path:
        return self.check_path(name)

    def _wrote(self, path: Path) -> Path:
        self.written.append(path)
        return path

    def write_text(self, name: str | Path, text: str) -> Path:
        """Write a file of the folder (atomically); a file that already holds exactly ``text``
        is left as it is (a rerun rewrites nothing it would not change)."""
        path = self._target(name)
        data = text.encode("utf-8")
        try:
            if path.is_file() and path.stat().st_size == len(data) and path.read_bytes() == data:
                return self._wrote(path)
        except OSError:
            pass
        return self._wrote(write_text(path, text))

    def write_json(self, name: str | Path, data: Any, *, newline: bool = False, default: Any = None) -> Path:
        """Write JSON into the folder (as :func:`write_json` writes it)."""
        text = json.dumps(data, indent=1, default=default)
        return self.write_text(name, text + "\n" if newline else text)

    def write_plotlyjs(self, name: str | Path = ".") -> Path:
        """The one ``plotly.min.js`` of the folder ``name`` (relative to this folder) that
        its pages load (:func:`write_plotlyjs`); an unchanged copy is left alone."""
        # lazy: the CLI's checks (pipelines.preflight) use this module before torch loads; mechlab.viz loads torch
        from mechlab.viz.figures import PLOTLYJS
        from mechlab.viz.figures import write_plotlyjs as write_once

        where = Path(name)
        return write_once(self.file(where), writer=lambda _path, text: self.write_text(where / PLOTLYJS, text))

    def write_figure(self, figure: Any, name: str | Path) -> Path:
        """Write a plotly figure into the folder as an offline HTML page that loads its
        folder's one ``plotly.min.js``."""
        # lazy: the CLI's checks (pipelines.preflight) use this module before torch loads; mechlab.viz loads torch
        from mechlab.viz.figures import figure_html

        self.write_plotlyjs(Path(name).parent)
        return self.write_text(name, figure_html(figure, plotlyjs="directory"))

    def write_circuit(self, circuit: Any, name: str | Path) -> Path:
        """Write a circuit's JSON into the folder."""
        return self.write_json(name, circuit.to_dict())

    def write_circuit_figure(self, circuit: Any, name: str | Path, title: str | None = None) -> Path:
        """Write a circuit's graph into the folder as offline HTML."""
        # lazy: the CLI's checks (pipelines.preflight) use this module before torch loads; mechlab.viz loads torch
        from mechlab.viz.circuits import circuit_figure

        return self.write_figure(circuit_figure(circuit, title), name)

    def remove(self, name: str | Path) -> None:
        """Remove a file of the folder that this command replaces (``--force``), if present."""
        path = self._target(name)
        with contextlib.suppress(FileNotFoundError):
            path.unlink()


def _remove_temps(folder: Path, depth: int = 2) -> list[Path]:
    """Remove the temporary files (``.<name>.<8 characters>.tmp``) that interrupted writes of
    outputs (``.json``, ``.html``, ``.csv``) left in ``folder`` and its subfolders, up to
    ``depth`` levels down. Other temporary files (a trainer's ``last.pt``) are left alone."""
    removed = []
    for directory, dirs, files in os.walk(folder):
        level = len(Path(directory).relative_to(folder).parts)
        if level >= depth:
            dirs[:] = []
        dirs[:] = [d for d in dirs if not d.startswith(".")]
        for name in files:
            match = _TEMP_NAME.match(name)
            if match and match.group("name").endswith(_CLEANED):
                path = Path(directory) / name
                if path.is_file() and not path.is_symlink():
                    with contextlib.suppress(FileNotFoundError):
                        path.unlink()
                        removed.append(path)
    return removed
