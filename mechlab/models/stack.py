"""The skeleton the recurrent families share: a residual stack of pre-norm blocks.

:class:`~mechlab.models.lstm.LSTM`, :class:`~mechlab.models.dense_ssm.DenseSSM` and
:class:`~mechlab.models.mamba.Mamba` are one model with different mixers::

    resid      = hook_embed(read_in(x))                      # [batch, pos, d_model]
    resid      = blocks[i](resid)       for i in range(n_layers)
    out        = hook_out(read_out(ln_final(resid)))         # [batch, pos, d_output]

with each block a :class:`~mechlab.models.base.ResidualBlock`,
``resid_post = resid_pre + mixer(norm(resid_pre))``. A family gives its block
(:meth:`ResidualStack.make_block`) and its final norm (:meth:`ResidualStack.make_final_norm`,
a LayerNorm unless it says otherwise); :func:`mixer_scan` is the ``scan`` attribute of the
families whose mixers run a scan.
"""

from __future__ import annotations

from jaxtyping import Float
from torch import Tensor, nn
from transformer_lens.hook_points import HookPoint

from mechlab.models.base import MechModel, ModelConfig, ReadIn, ReadOut, ResidualBlock
from mechlab.models.scan import SCANS


class ResidualStack(MechModel):
    """Read-in, ``n_layers`` residual blocks, a final norm, read-out.

    The modules are built in that order (so a seeded construction draws its random
    numbers in that order) under the names ``read_in``, ``blocks.{i}``, ``ln_final`` and
    ``read_out``, which are the state-dict keys' prefixes; the hook points are
    ``hook_embed``, each block's and ``hook_out``.

    Args:
        cfg: The model's configuration; ``cfg.n_layers`` blocks.
    """

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.cfg = cfg
        self.read_in = ReadIn(cfg)
        self.hook_embed = HookPoint()  # [batch, pos, d_model]
        self.blocks = nn.ModuleList(self.make_block(cfg) for _ in range(cfg.n_layers))
        self.ln_final = self.make_final_norm(cfg)
        self.read_out = ReadOut(cfg)
        self.hook_out = HookPoint()  # [batch, pos, d_output]
        self.setup()

    def make_block(self, cfg: ModelConfig) -> ResidualBlock:
        """One residual block of the family (each subclass says which)."""
        raise NotImplementedError(f"{type(self).__name__} must define make_block(cfg)")

    def make_final_norm(self, cfg: ModelConfig) -> nn.Module:
        """The norm before the read-out: a LayerNorm over ``d_model`` unless a family says otherwise."""
        return nn.LayerNorm(cfg.d_model)

    def mixers(self) -> list[nn.Module]:
        """Every block's sequence mixer, first block first."""
        return [block.get_submodule(block.mixer_name) for block in self.blocks]

    def forward(self, x: Tensor) -> Float[Tensor, "batch pos d_output"]:
        """Run the model.

        Args:
            x: ``[batch, pos, d_in]`` floats (continuous) or ``[batch, pos]`` token ids.

        Returns:
            ``[batch, pos, d_output]`` predictions or logits.
        """
        self.check_length(x.shape[1])
        resid = self.hook_embed(self.read_in(x))  # [batch, pos, d_model]
        for block in self.blocks:
            resid = block(resid)
        return self.hook_out(self.read_out(self.ln_final(resid)))


def mixer_scan(doc: str) -> property:
    """The ``scan`` attribute of a :class:`ResidualStack` whose mixers each have a ``scan``.

    Reading it gives the mixers' common choice, or ``"mixed"`` when they differ; setting
    it checks the value against :data:`mechlab.models.scan.SCANS` and sets every mixer's.

    Args:
        doc: The property's docstring.

    Returns:
        The property, to assign in the class body: ``scan = mixer_scan("...")``.
    """

    def get(model: ResidualStack) -> str:
        kinds = {mixer.scan for mixer in model.mixers()}
        return kinds.pop() if len(kinds) == 1 else "mixed"

    def set_(model: ResidualStack, value: str) -> None:
        if value not in SCANS:
            raise ValueError(f"scan must be one of {SCANS}, got {value!r}")
        for mixer in model.mixers():
            mixer.scan = value

    return property(get, set_, doc=doc)
