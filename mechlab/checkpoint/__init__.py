"""Save and load mechlab models safely.

A checkpoint is a ``.pt`` file written by :func:`save_checkpoint`. It holds only
tensors and plain Python values, so :func:`load_checkpoint` reads it with
``torch.load(..., weights_only=True)``: a file that carries pickled Python
objects is refused before anything in it can run. Its layout::

    {
        "format": "mechlab-checkpoint",
        "version": 1,
        "config": model.cfg.to_dict(),      # {"arch": ..., fields...}
        "state_dict": {name: tensor},
        "step": int,
        "metrics": {...},                   # plain values and tensors
        "metadata": {...},                  # plain values and tensors
        "optimizer": optimizer.state_dict(),  # only when given
        "rng": {"torch": ByteTensor, "cuda": [ByteTensor], "numpy": {...},
                "python": {...}},           # only with rng=True
        "checksum": {"algorithm": "sha256",
                     "tensors": {"state_dict/up.weight": hex, ...},
                     "structure": hex},     # since mechlab 0.1 (older files load too)
    }

The checksum covers every tensor (by path, dtype, shape and bytes) and every
other value of the payload. torch does not verify a zip checkpoint's CRCs, so
without it a bit flipped on disk or in a copy would load silently;
:func:`load_checkpoint` recomputes it and refuses a file that does not match,
naming the tensor. Checkpoints written before checksums existed load as before, with
``Checkpoint.checksum_verified`` False and a one-line
:class:`UncheckedCheckpointWarning`; re-save them to add one. A zip checkpoint's
directory is checked before anything in it is decompressed: ``torch.save`` stores
its entries uncompressed, so a compressed entry (a zip bomb) is refused by its
declared sizes alone (:func:`check_archive`).

The package's modules, by job: :mod:`~mechlab.checkpoint.format` (the layout, the
:class:`Checkpoint` a load returns, checks of plain values),
:mod:`~mechlab.checkpoint.saving`, :mod:`~mechlab.checkpoint.loading`,
:mod:`~mechlab.checkpoint.checksums`, :mod:`~mechlab.checkpoint.rng` and
:mod:`~mechlab.checkpoint.errors`.

Weights that are not finite (NaN or inf) are refused unless
``allow_non_finite=True``: they cannot come from a healthy run, and every
analysis of them would print NaN.

Dtypes: the weights load into a model of their own dtype (bit-exact), which
:func:`load_checkpoint` then casts to ``dtype`` (float32 by default), the
dtype every mechlab analysis feeds its models; pass ``dtype=None`` to keep the
saved dtype (``Checkpoint.saved_dtype`` records it either way).

Weights alone can also live in a ``.safetensors`` file with a JSON config
beside it (:func:`save_safetensors`; :func:`load_checkpoint` reads both).

Every problem a file can have is reported as a :class:`CheckpointError` whose
message is one line: what is wrong, then what to do.
"""


from mechlab.checkpoint.checksums import CHECKSUM_ALGORITHM, seal
from mechlab.checkpoint.errors import CheckpointError, UncheckedCheckpointWarning
from mechlab.checkpoint.format import FORMAT, VERSION, Checkpoint, file_sha256
from mechlab.checkpoint.loading import check_archive, load_checkpoint
from mechlab.checkpoint.rng import capture_rng, restore_rng
from mechlab.checkpoint.saving import save_checkpoint, save_safetensors

__all__ = [
    "CHECKSUM_ALGORITHM",
    "FORMAT",
    "VERSION",
    "Checkpoint",
    "CheckpointError",
    "UncheckedCheckpointWarning",
    "capture_rng",
    "check_archive",
    "file_sha256",
    "load_checkpoint",
    "restore_rng",
    "save_checkpoint",
    "save_safetensors",
    "seal",
]
