"""Compiled RASP programs (Tracr) as mechlab transformers, for circuits known in advance.

Tracr (Lindner et al. 2023; PyPI ``tracr-pypi``, with ``jax`` and ``dm-haiku``: the
``tracr`` extra) compiles a RASP program into the weights of a transformer whose every
residual direction has a name (``tokens:a``, ``indices:3``, ``one``, ``frac_prevs``,
...). Its layout is that of :class:`~mechlab.models.transformer.Transformer` with
``normalization="none"``, ``act_fn="relu"`` and ``causal=False`` (unless compiled
causal): every layer is an attention sub-layer then an MLP (a layer without one of them
has zero weights), heads are zero-padded to the widest layer, attention divides by
``sqrt(key_size)`` (= ``d_head``), and the input is a one-hot token embedding plus a
position table whose row 0 (the BOS position) is zero. :func:`load_tracr` copies every
weight, head by head:

* ``token_embed`` -> ``read_in.embed`` (categorical output, ``io="tokens"``) or, for a
  numerical output, ``read_in.proj`` of a ``continuous`` model fed one-hot inputs
  (``io="continuous"``, ``d_in`` = input vocabulary, ``d_out = 1``: the read-out then is
  the program's value and edge pruning's loss is a squared error, not a KL divergence
  of a one-logit softmax, which would always be 0);
* ``pos_embed`` -> ``W_pos``; ``query/key/value`` ``[d_model, H * key_size]`` ->
  ``W_Q/W_K/W_V [H, d_model, key_size]``; ``linear`` -> ``W_O``; ``mlp/linear_1|2`` ->
  ``W_in/W_out``; every bias (all zero in Tracr's assembly) too;
* the unembedding (Tracr's projection onto the output space, no bias) -> ``read_out.proj``.

Tracr's own forward returns ``argmax`` of those logits (categorical) or the value
(numerical); :class:`TracrInfo` turns token lists into model inputs and outputs back
into values the same way.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from torch import Tensor

from mechlab.models.transformer import Transformer, TransformerConfig

INSTALL_HINT = "install the extra: pip install 'mechlab[tracr]' (tracr-pypi, jax, dm-haiku)"


@dataclass
class TracrInfo:
    """How to talk to a loaded Tracr model.

    Attributes:
        input_encoding: Input token -> id (the BOS and pad tokens included).
        output_values: Output id -> value (categorical output), or None (numerical).
        bos: The BOS token every input starts with.
        pad: The pad token (never used by :meth:`encode`).
        max_seq_len: Longest input without the BOS token.
        residual_labels: Name of every residual direction (``d_model`` of them).
        causal: Whether the program was compiled causal.
    """

    input_encoding: dict[Any, int]
    output_values: list[Any] | None
    bos: str
    pad: str
    max_seq_len: int
    residual_labels: list[str]
    causal: bool

    @property
    def numerical(self) -> bool:
        """The program outputs a number per position (read out as one continuous value)."""
        return self.output_values is None

    @property
    def vocab(self) -> list[Any]:
        """The input tokens a program accepts (without BOS and pad), in id order."""
        return [t for t, _ in sorted(self.input_encoding.items(), key=lambda kv: kv[1])
                if t not in (self.bos, self.pad)]  # fmt: skip

    def encode(self, sequences: Sequence[Sequence[Any]]) -> Tensor:
        """Model inputs for token sequences of one length (BOS is prepended).

        Args:
            sequences: ``batch`` sequences of input tokens, all of the same length.

        Returns:
            ``[batch, 1 + len]`` token ids, or (numerical programs) their one-hot
            ``[batch, 1 + len, d_vocab]`` floats.
        """
        lengths = {len(s) for s in sequences}
        if len(lengths) != 1:
            raise ValueError(f"sequences must all have one length, got lengths {sorted(lengths)}")
        n = lengths.pop()
        if not 1 <= n <= self.max_seq_len:
            raise ValueError(f"sequence length must be in 1..{self.max_seq_len}, got {n}")
        try:
            ids = [[self.input_encoding[self.bos]] + [self.input_encoding[t] for t in s]
                   for s in sequences]  # fmt: skip
        except KeyError as err:
            raise ValueError(f"token {err.args[0]!r} is not in the vocabulary {self.vocab}") from None
        ids_t = torch.tensor(ids, dtype=torch.long)  # [batch, pos]
        if self.numerical:
            return torch.nn.functional.one_hot(ids_t, len(self.input_encoding)).float()
        return ids_t

    def decode(self, output: Tensor) -> list[list[Any]]:
        """Program outputs from model outputs, BOS position dropped.

        Args:
            output: ``[batch, pos, d_output]`` model outputs.

        Returns:
            Per sequence, ``pos - 1`` values: the argmax token (categorical) or the number.
        """
        if self.numerical:
            return output[:, 1:, 0].tolist()
        ids = output[:, 1:].argmax(-1).tolist()
        return [[self.output_values[i] for i in row] for row in ids]


def _import_tracr():
    try:
        # lazy: optional: the ImportError is handled below
        import haiku as hk
        import jax.numpy as jnp
    except ImportError as err:
        raise ImportError(f"Tracr models need jax and dm-haiku; {INSTALL_HINT}") from err
    return hk, jnp


def _unembedding(assembled: Any, d_model: int) -> np.ndarray:
    """Tracr's unembedding matrix ``[d_model, d_output]``, by applying it to the identity."""
    hk, jnp = _import_tracr()

    @hk.without_apply_rng
    @hk.transform
    def unembed(x):
        return assembled.get_compiled_model().unembed(x, use_unembed_argmax=False)

    out = np.asarray(unembed.apply(assembled.params, jnp.eye(d_model)))
    return out.reshape(d_model, -1)  # a numerical output comes back squeezed: [d_model]


def load_tracr(
    assembled: Any, dtype: torch.dtype = torch.float32
) -> tuple[Transformer, TracrInfo]:
    """A mechlab :class:`Transformer` holding a compiled Tracr program exactly.

    Args:
        assembled: Tracr's ``AssembledTransformerModel``
            (``tracr.compiler.compiling.compile_rasp_to_model(...)``).
        dtype: Parameter dtype of the mechlab model.

    Returns:
        ``(model, info)``: the model in eval mode (its output on ``info.encode(seqs)``
        is Tracr's ``unembedded`` logits, or the values of a numerical program) and the
        :class:`TracrInfo` to encode inputs and decode outputs.

    Raises:
        ValueError: ``assembled`` is not a compiled Tracr model, or has LayerNorm.
    """
    for attr in ("params", "model_config", "input_encoder", "residual_labels"):
        if not hasattr(assembled, attr):
            raise ValueError(
                f"expected a Tracr AssembledTransformerModel (compile_rasp_to_model), "
                f"got {type(assembled).__name__} without .{attr}"
            )
    tcfg = assembled.model_config
    if tcfg.layer_norm:
        raise ValueError("Tracr model has layer_norm=True; load_tracr supports compiled (no-LN) models")
    params = {k: {n: np.asarray(v) for n, v in d.items()} for k, d in assembled.params.items()}
    token_embed = params["token_embed"]["embeddings"]  # [d_vocab, d_model]
    pos_embed = params["pos_embed"]["embeddings"]  # [n_ctx, d_model]
    d_vocab, d_model = token_embed.shape
    unembed = _unembedding(assembled, d_model)  # [d_model, d_output]
    enc = assembled.input_encoder
    numerical = not hasattr(assembled.output_encoder, "encoding_map")
    io = (
        {"io": "continuous", "d_in": d_vocab, "d_out": 1}
        if numerical
        else {"io": "tokens", "d_vocab": d_vocab, "d_vocab_out": unembed.shape[1]}
    )
    cfg = TransformerConfig(
        d_model=d_model, n_layers=tcfg.num_layers, n_ctx=pos_embed.shape[0], **io,
        n_heads=tcfg.num_heads, d_head=tcfg.key_size, d_mlp=tcfg.mlp_hidden_size,
        act_fn="relu", normalization="none", causal=bool(tcfg.causal),
    )  # fmt: skip
    model = Transformer(cfg)
    H, K = tcfg.num_heads, tcfg.key_size

    def t(a: np.ndarray) -> Tensor:
        return torch.as_tensor(np.array(a, dtype=np.float64), dtype=model.W_pos.dtype)

    with torch.no_grad():
        if numerical:
            model.read_in.proj.weight.copy_(t(token_embed.T))
            model.read_in.proj.bias.zero_()
        else:
            model.read_in.embed.weight.copy_(t(token_embed))
        model.W_pos.copy_(t(pos_embed))
        model.read_out.proj.weight.copy_(t(unembed.T))
        model.read_out.proj.bias.zero_()
        for layer, block in enumerate(model.blocks):
            attn, mlp = block.attn, block.mlp
            name = f"transformer/layer_{layer}"
            for mat, bias, part in ((attn.W_Q, attn.b_Q, "query"), (attn.W_K, attn.b_K, "key"),
                                    (attn.W_V, attn.b_V, "value")):  # fmt: skip
                w = params[f"{name}/attn/{part}"]["w"]  # [d_model, H * K]
                mat.copy_(t(w.reshape(d_model, H, K).transpose(1, 0, 2)))  # [H, d_model, K]
                bias.copy_(t(params[f"{name}/attn/{part}"]["b"].reshape(H, K)))
            attn.W_O.copy_(t(params[f"{name}/attn/linear"]["w"].reshape(H, K, d_model)))
            attn.b_O.copy_(t(params[f"{name}/attn/linear"]["b"]))
            mlp.W_in.copy_(t(params[f"{name}/mlp/linear_1"]["w"]))
            mlp.b_in.copy_(t(params[f"{name}/mlp/linear_1"]["b"]))
            mlp.W_out.copy_(t(params[f"{name}/mlp/linear_2"]["w"]))
            mlp.b_out.copy_(t(params[f"{name}/mlp/linear_2"]["b"]))
    model.to(dtype).eval()
    output_values = None
    if not numerical:
        by_id = sorted(assembled.output_encoder.encoding_map.items(), key=lambda kv: kv[1])
        output_values = [value for value, _ in by_id]
    info = TracrInfo(
        input_encoding=dict(enc.encoding_map),
        output_values=output_values,
        bos=enc.bos_token,
        pad=enc.pad_token,
        max_seq_len=pos_embed.shape[0] - 1,
        residual_labels=list(assembled.residual_labels),
        causal=bool(tcfg.causal),
    )
    return model, info


@dataclass(frozen=True)
class TracrProgram:
    """A RASP program of Tracr's library with the inputs it is defined on.

    Attributes:
        build: ``() -> rasp.SOp`` (called with ``tracr.rasp.rasp`` and
            ``tracr.compiler.lib`` imported).
        vocab: Input tokens.
        max_seq_len: Longest input.
        unique: Inputs must not repeat a token (``sort_unique``).
    """

    build: Callable[[], Any]
    vocab: tuple[Any, ...]
    max_seq_len: int = 5
    unique: bool = False


def _lib():
    try:
        # lazy: optional: the ImportError is handled below
        from tracr.compiler import lib
        from tracr.rasp import rasp
    except ImportError as err:
        raise ImportError(f"Tracr programs need tracr; {INSTALL_HINT}") from err
    return lib, rasp


TRACR_PROGRAMS: dict[str, TracrProgram] = {
    # reverse a sequence (length via a selector width, then opp_idx, then a flip head)
    "reverse": TracrProgram(lambda: _lib()[0].make_reverse(_lib()[1].tokens), ("a", "b", "c")),
    # Edge Pruning's "xproportion": fraction of tokens so far equal to "x" (numerical)
    "xproportion": TracrProgram(
        lambda: _lib()[0].make_frac_prevs(_lib()[1].tokens == "x"), ("x", "y", "z")
    ),
    # how often each position's token occurs in the sequence
    "hist": TracrProgram(lambda: _lib()[0].make_hist(), ("a", "b", "c")),
    # sort distinct tokens; more tokens than positions, or every input is a permutation
    # of the vocabulary and the output is always the same
    "sort_unique": TracrProgram(
        lambda: _lib()[0].make_sort_unique(_lib()[1].tokens, _lib()[1].tokens),
        tuple(range(1, 9)), unique=True,
    ),
}


@functools.lru_cache(maxsize=8)
def compile_program(name: str) -> Any:
    """Compile a program of :data:`TRACR_PROGRAMS` with Tracr (cached; seconds each).

    Args:
        name: ``reverse``, ``xproportion``, ``hist`` or ``sort_unique``.

    Returns:
        Tracr's ``AssembledTransformerModel`` (BOS token ``"BOS"``, not causal).
    """
    if name not in TRACR_PROGRAMS:
        raise ValueError(f"unknown Tracr program {name!r}; choose one of {sorted(TRACR_PROGRAMS)}")
    program = TRACR_PROGRAMS[name]
    _lib()
    # lazy: optional dependency (the tracr extra: tracr, jax, haiku)
    from tracr.compiler import compiling

    return compiling.compile_rasp_to_model(
        program.build(), vocab=set(program.vocab), max_seq_len=program.max_seq_len,
        compiler_bos="BOS",
    )  # fmt: skip


def sample_sequences(
    name: str, n: int, length: int | None = None, generator: torch.Generator | None = None
) -> list[list[Any]]:
    """Random inputs a program of :data:`TRACR_PROGRAMS` is defined on.

    Args:
        name: The program.
        n: Number of sequences.
        length: Their length (default: the program's ``max_seq_len``).
        generator: Torch generator of the draws.

    Returns:
        ``n`` token lists (tokens uniform; distinct tokens for ``unique`` programs).
    """
    if name not in TRACR_PROGRAMS:
        raise ValueError(f"unknown Tracr program {name!r}; choose one of {sorted(TRACR_PROGRAMS)}")
    program = TRACR_PROGRAMS[name]
    length = program.max_seq_len if length is None else length
    n_vocab = len(program.vocab)
    if not 1 <= length <= program.max_seq_len or (program.unique and length > n_vocab):
        raise ValueError(f"length must be in 1..{program.max_seq_len} for {name!r}, got {length}")
    if program.unique:
        ids = torch.stack([torch.randperm(n_vocab, generator=generator)[:length] for _ in range(n)])
    else:
        ids = torch.randint(n_vocab, (n, length), generator=generator)
    return [[program.vocab[i] for i in row] for row in ids.tolist()]
