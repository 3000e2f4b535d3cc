"""Planted circuits with redundancy: ground truth where no single edge matters alone.

Real circuits have backup heads, several heads writing the same thing into a saturating
component, gates that pass a signal if any input carries it: no single edge matters alone
(single-edge ablation scores it ~0), only removing the redundant paths together hurts.
This family plants such circuits, exactly, into random models built like
:mod:`mechlab.prune.planted`'s (residual-stream *slots*, random off-circuit heads and MLPs,
no normalisation) and finds each one's smallest faithful circuit by exhaustive search.

**Traces** (:func:`redundant_data`): a class ``y`` in {0, 1} per trace, the feature
``onehot(y)`` at every position but the first (a BOS); the corrupted twin has none (the
context, ``D_CTX`` normals per position, is shared). The twin must be *absence*, not a
random feature (:func:`~mechlab.prune.planted.planted_data`): a reader ``R(a, b)`` of two
redundant copies would need ``R(f', f) = R(f, f') = g(f)``, so ``g(f) = g(f')``; with an
absent twin ``R = saturate(a + b)`` is an exact OR.

**Transformers** (``normalization="none"``, ``act_fn="relu"``). A *copy head* copies the
feature slot into its own slot, attending by random content
(:func:`~mechlab.prune.planted._content`) to every position but the BOS (a position-table
flag, -50 logits): the feature being the same at every other position, its output is
exactly ``onehot(y)`` whatever its pattern. The reader MLP sums its inputs per class
(``u``) into relu units:

* ``or2-equal``: two copy heads into ``clamp(u + 1/4, 0, 1)``: one head (``u = 1``) or two
  give the same output, so each edge of either path (``embed -> h.v``, ``h -> m.in``) has
  single-edge effect 0 and removing both paths costs all. The 1/4 offset keeps the
  corrupted run (``u = 0``) in the linear part: gradients there do not vanish.
* ``or2-unequal``: the second head at weight ``weak * 3/4`` gives ``weak`` (0.75) of the
  output alone, so ablating the first head's path costs ``(1 - weak)^2`` (0.0625); the
  minimal circuit is the first head's path.
* ``or3``: three copy heads, any one suffices.
* ``backup``: a primary copy head ``P`` and a backup ``B`` in a later layer, both read by
  the saturating MLP. ``B``'s value reads the feature; it attends to the BOS (value 0) or
  to position 1 (later positions are kept off by a flag), its BOS logit
  ``log((1 - beta) / beta)`` while its query sees ``P``'s output and -50 while it does not.
  So ``B`` writes ``beta * onehot(y)`` while ``P`` works and all of it once ``P`` is ablated
  (``P``'s ablated output is the twin's: no feature): the attention moves, like IOI's
  backup name movers. ``beta = idle * 3/4`` makes ablating ``P -> m.in`` alone keep
  ``idle`` (0.8) of the output. A backup silent while ``P`` works (``idle = 0``) cannot make
  ``P -> m.in`` redundant under *edge* ablation: ``B`` sees ``P`` through its own edge
  ``P -> B.q``, which still carries ``P`` when only ``P -> m.in`` is ablated (as for IOI's
  name-mover-to-logit edges); :func:`check_redundant_ground_truth` refuses it. Ablating
  ``P -> m.in`` and ``P -> B.q`` together (``P`` gone for every reader) costs nothing.
* ``deadzone``: one copy head into ``relu(u - 1/2)``, OFF at the corrupted run (``u = 0``),
  ON at the clean one: the mask gradients at the corrupted run behind the relu are exactly
  0 (the head's input edge keeps only its leaks'), so EAP there sees only ``m -> out``;
  EAP-IG crosses the threshold. No redundancy: every planted edge matters alone.
* ``deadzone-or2``: two copy heads into ``clamp(u - 1/4, 0, 1/2)``: redundant and dead.
* ``and2`` (control): two copy heads into ``relu(u - 1) + relu(u / 10 + 1)``: each edge
  alone costs ``(1.1 / 1.2)^2 = 0.84``; the linear unit keeps corrupted-run gradients.
* ``single`` (control): one copy head read by the read-out (``embed -> h.v, h -> out``).

**Recurrent** ``lstm-or2``: an LSTM (identity norms, ``d_hidden = 6``, ``n_layers >= 3``):
two *copier* layers copy the feature slot into theirs (gates saturated at +-20 logits,
candidate ``tanh(x)``: exact for a 0/1 input), a later *reader* layer reads both into
``tanh(8 (a + b))``, the same for one copy as for two (to 2e-7); the other units (4 per
circuit layer, all 6 of an off-circuit layer) are random.

**Off-circuit components** are random as in :mod:`mechlab.prune.planted` (reading and
writing the context part) and also read ``leak`` (0.05; x4 for LSTM units) times a random
projection of every feature-carrying slot (q, k, v, MLP and LSTM inputs, and the
read-out), so off-circuit edges have small real effects (each < 1% of the total, most
> 1e-6; only the edges into circuit components stay 0). The read-out's gain on the final
slot makes the RMS of its clean-minus-corrupted difference 1.

**Ground truth** (:func:`check_redundant_ground_truth`): every subset of the planted edges
(at most 2^12) scored by held-out faithfulness, and every edge's single-edge effect.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass, field
from itertools import combinations

import torch
from torch import Tensor, nn

from mechlab.models.base import predict_in_chunks
from mechlab.models.lstm import LSTM, LSTMConfig
from mechlab.models.transformer import Transformer, TransformerConfig
from mechlab.prune.evaluate import evaluate_masks
from mechlab.prune.forward import frozen_eval, make_ablation, masked_forward, writer_outputs
from mechlab.prune.graph import EdgeGraph, build_graph, countable_edges
from mechlab.prune.planted import (
    CONTENT_SCALE,
    D_CTX,
    D_HEAD,
    D_MLP,
    _content,
    _Layout,
    _off_circuit_head,
    _randn,
    build_family,
    single_edge_effects,
)
from mechlab.traces import PruneData, Traces

Edge = tuple[str, str]
_HEADS = {"or2-equal": 2, "or2-unequal": 2, "or3": 3, "backup": 2, "deadzone": 1, "deadzone-or2": 2,
          "and2": 2, "single": 1}  # fmt: skip
TRANSFORMER_KINDS = tuple(_HEADS)
RECURRENT_KINDS = ("lstm-or2",)
KINDS = TRANSFORMER_KINDS + RECURRENT_KINDS
REDUNDANT_KINDS = ("or2-equal", "or2-unequal", "or3", "backup", "deadzone-or2", "lstm-or2")
PLANTED_FLOOR = 0.9  # the planted circuit's held-out faithfulness
REDUNDANT_CEILING = 0.1  # each redundant edge's single-edge effect, relative to ablating all
JOINT_FLOOR = 0.5  # ablating every redundant edge together
ALONE_FLOOR = 0.5  # each planted edge of a member without redundancy
OFF_CEILING = 0.01  # each off-circuit edge
OFF_FLOOR = 1e-6  # some off-circuit edge (they are small, not zero)
MATTERS = 1e-3  # every planted edge changes some subset's faithfulness by this much
MAX_PLANTED = 12  # exhaustive search over at most 2^12 subsets
OFFSET = 0.25  # OR units clamp(u + OFFSET, 0, 1): the corrupted run is in the linear part
BOS_LOGIT = 50.0  # attention logit that keeps a head off the BOS (and backups off late positions)
GATE = 20.0  # LSTM gate logits of the circuit units (open / closed)
READER_GAIN = 8.0  # the LSTM reader's candidate tanh(gain * (a + b))
LSTM_LEAK = 4.0  # an LSTM unit's leak, relative to ``leak`` (its gates and tanh damp it)
D_HIDDEN = 6  # LSTM hidden units per layer (2 of them the circuit's in a circuit layer)
N_POS_CTX = 16


GOAL_TOLERANCE = 0.01  # below a planted faithfulness under 0.9, a circuit this close still counts


@dataclass(frozen=True)
class RedundantSpec:
    """What to plant (module docstring).

    Args:
        kind: One of :data:`KINDS`.
        seed: Seeds the placement and every random weight.
        n_layers: Layers, 2 to 4 (3 to 4 for ``lstm-or2``).
        n_heads: Heads per layer, 2 to 8 (transformers).
        d_noise: Width of the context part of the stream (>= 6).
        leak: How much of the feature slots the off-circuit components read (0 to 0.2).
        weak: ``or2-unequal``: the weaker head's share of the output alone, in (0, 1).
        idle: ``backup``: the share of the output left when only ``P -> m.in`` is
            ablated (the backup's output while ``P`` works), in [0, 1).
    """

    kind: str
    seed: int = 0
    n_layers: int = 2
    n_heads: int = 4
    d_noise: int = 12
    leak: float = 0.05
    weak: float = 0.75
    idle: float = 0.8

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ValueError(f"kind must be one of {KINDS}, got {self.kind!r}")
        low, number = (3 if self.kind in RECURRENT_KINDS else 2), (int, float)
        for ok, message in [
            (isinstance(self.n_layers, int) and low <= self.n_layers <= 4,
             f"n_layers must be an integer from {low} to 4 for {self.kind!r}, got {self.n_layers!r}"),
            (isinstance(self.n_heads, int) and 2 <= self.n_heads <= 8,
             f"n_heads must be an integer from 2 to 8, got {self.n_heads!r}"),
            (isinstance(self.d_noise, int) and self.d_noise >= 6, f"d_noise must be an integer >= 6, got {self.d_noise!r}"),
            (isinstance(self.leak, number) and 0 <= self.leak <= 0.2, f"leak must be a number from 0 to 0.2, got {self.leak!r}"),
            (isinstance(self.weak, number) and 0 < self.weak < 1, f"weak must be a number in (0, 1), got {self.weak!r}"),
            (isinstance(self.idle, number) and 0 <= self.idle < 1, f"idle must be a number in [0, 1), got {self.idle!r}"),
        ]:  # fmt: skip
            if not ok:
                raise ValueError(message)


@dataclass
class RedundantModel:
    """A model with a planted redundant circuit, its paths and its minimal circuit.

    Attributes:
        model: The model (eval mode, float32).
        spec: What was planted.
        edges: Every planted edge (all redundant paths).
        paths: Path name -> its edges (each from the read-in to the read-out).
        minimal: A smallest faithful circuit (exhaustive search over subsets of ``edges``;
            faithful: held-out faithfulness >= :attr:`goal`; ties: the most faithful).
        planted_faithfulness: Held-out faithfulness of ``edges`` (interchange, ``data()``).
        minimal_faithfulness: That of ``minimal``.
        components: Path name -> the components it runs through, in order.
    """

    model: nn.Module
    spec: RedundantSpec
    edges: frozenset[Edge]
    paths: dict[str, frozenset[Edge]]
    minimal: frozenset[Edge] = frozenset()
    planted_faithfulness: float = float("nan")
    minimal_faithfulness: float = float("nan")
    components: dict[str, list[str]] = field(default_factory=dict)

    def data(self, seed: int = 0, n_train: int = 32, n_test: int = 64, n_pos: int = 6) -> PruneData:
        """Training and held-out traces with their corrupted twins (:func:`redundant_data`)."""
        return redundant_data(seed, n_train, n_test, n_pos)

    @property
    def redundant(self) -> bool:
        """Whether the member has redundancy (:data:`REDUNDANT_KINDS`)."""
        return self.spec.kind in REDUNDANT_KINDS

    @property
    def redundant_edges(self) -> frozenset[Edge]:
        """The edges on some but not all paths (empty for a member without redundancy)."""
        return self.edges - frozenset.intersection(*self.paths.values()) if self.redundant else frozenset()

    @property
    def minimal_budget(self) -> int:
        """Edges of the minimal circuit."""
        return len(self.minimal)

    @property
    def planted_budget(self) -> int:
        """Edges of the planted circuit."""
        return len(self.edges)

    @property
    def goal(self) -> float:
        """The held-out faithfulness a method's circuit must reach: 0.9, or the planted
        circuit's own less :data:`GOAL_TOLERANCE` when that is lower (two equal redundant
        paths differ in the last digits, so the other path must count too)."""
        return min(0.9, self.planted_faithfulness - GOAL_TOLERANCE)


def redundant_data(seed: int = 0, n_train: int = 32, n_test: int = 64, n_pos: int = 6) -> PruneData:
    """Traces ``[feature (2), context (D_CTX)]`` per position: the feature ``onehot(y)`` at
    every position but the first, none in the corrupted twin; the context is shared."""

    def traces(n: int, s: int) -> Traces:
        gen = torch.Generator().manual_seed(s)
        y = torch.randint(0, 2, (n,), generator=gen)
        feature = torch.nn.functional.one_hot(y, 2).float()[:, None, :].repeat(1, n_pos, 1)
        feature[:, 0] = 0.0
        context = torch.randn(n, n_pos, D_CTX, generator=gen)
        return Traces(inputs=torch.cat([feature, context], -1),
                      corrupted=torch.cat([torch.zeros_like(feature), context], -1))  # fmt: skip

    return PruneData(traces(n_train, 7919 * seed + 11), traces(n_test, 7919 * seed + 12),
                     info={"data_seed": seed, "planted": "redundant"})  # fmt: skip


_Built = tuple[nn.Module, dict[str, frozenset[Edge]], dict[str, list[str]], slice]  # model, paths, components, final slot


def _head_name(where: tuple[int, int]) -> str:
    return f"a{where[0]}.h{where[1]}"


def _place(spec: RedundantSpec, gen: torch.Generator) -> tuple[list[tuple[int, int]], int | None]:
    """Random distinct heads (the backup's ``B`` after ``P``) and the reader MLP's layer."""
    L, H = spec.n_layers, spec.n_heads
    for _ in range(1000):
        flat = torch.randperm(L * H, generator=gen)[: _HEADS[spec.kind]].tolist()
        heads = [(i // H, i % H) for i in flat]
        if spec.kind != "backup" or heads[0][0] < heads[1][0]:
            break
    else:  # pragma: no cover - two layers always hold P before B
        raise ValueError("no placement of the backup's heads")
    if spec.kind == "single":
        return heads, None
    last = max(layer for layer, _ in heads)
    return heads, int(torch.randint(last, L, (1,), generator=gen))


def _units(kind: str, spec: RedundantSpec) -> tuple[list[float], list[tuple[float, float, float]]]:
    """The reader MLP of ``kind``: each head's weight in ``u`` and per class the relu units
    ``(gain, bias, out)``, output ``sum out * relu(gain * u + bias)``."""
    clamp = [(1.0, OFFSET, 1.0), (1.0, OFFSET - 1.0, -1.0)]  # clamp(u + OFFSET, 0, 1)
    return {
        "or2-equal": ([1.0, 1.0], clamp),
        "or2-unequal": ([1.0, spec.weak * (1 - OFFSET)], clamp),
        "or3": ([1.0, 1.0, 1.0], clamp),
        "backup": ([1.0, 1.0], clamp),
        "deadzone": ([1.0], [(1.0, -0.5, 1.0)]),
        "deadzone-or2": ([1.0, 1.0], [(1.0, -0.25, 1.0), (1.0, -0.75, -1.0)]),
        "and2": ([1.0, 1.0], [(1.0, -1.0, 1.0), (0.1, 1.0, 1.0)]),
    }[kind]


def _leak(W: Tensor, rows: Tensor, cols: int, leak: float, gen: torch.Generator) -> None:
    """``W[rows] += leak * N(0, 1 / len(rows))``: a reader's tiny look at the feature slots."""
    W[rows] += _randn(gen, len(rows), cols, std=leak / math.sqrt(len(rows)))


def _read_in_out(model: nn.Module, lay: _Layout, embed: slice, gen: torch.Generator) -> None:
    """The read-in: the feature into slot ``embed``, the context at random into the context
    part; the read-out: the context part at random."""
    n = lay.noise.stop - lay.noise.start
    model.read_in.proj.weight[embed, :2] = torch.eye(2)
    model.read_in.proj.weight[lay.noise, 2:] = _randn(gen, n, D_CTX, std=1.0 / math.sqrt(D_CTX))
    model.read_out.proj.weight[:, lay.noise] = _randn(gen, 2, n, std=1.0 / math.sqrt(n))


def _copy_head(attn: nn.Module, h: int, src: slice, dst: slice, flags: dict[str, int], lay: _Layout,
               gen: torch.Generator) -> None:  # fmt: skip
    """Content attention off the BOS; the value copies slot ``src`` into slot ``dst``."""
    _content(attn, h, lay, gen)
    attn.W_Q[h, flags["const"], 0] = 2 * BOS_LOGIT  # scores are q.k / sqrt(D_HEAD) = q.k / 2
    attn.W_K[h, flags["bos"], 0] = -1.0
    attn.W_V[h, src, :2] = torch.eye(2)
    attn.W_O[h, :2, dst] = torch.eye(2)


def _backup_head(attn: nn.Module, h: int, watch: slice, src: slice, dst: slice, flags: dict[str, int],
                 beta: float) -> None:  # fmt: skip
    """Attends to the BOS (value 0) and position 1 only: to position 1 with weight ``beta``
    while slot ``watch`` holds a feature, with weight 1 (to 2e-22) while it holds none."""
    present = math.log((1 - beta) / beta) if beta > 0 else BOS_LOGIT
    attn.W_Q[h, flags["const"], 0] = -2 * BOS_LOGIT
    attn.W_Q[h, watch, 0] = 2 * (present + BOS_LOGIT)  # a feature is onehot: its slot sums to 1
    attn.W_K[h, flags["bos"], 0] = 1.0
    attn.W_Q[h, flags["const"], 1] = 2 * BOS_LOGIT
    attn.W_K[h, flags["late"], 1] = -1.0
    attn.W_V[h, src, :2] = torch.eye(2)
    attn.W_O[h, :2, dst] = torch.eye(2)


def _transformer(spec: RedundantSpec) -> _Built:
    gen = torch.Generator().manual_seed(spec.seed)
    heads, lm = _place(spec, gen)
    names = [_head_name(w) for w in heads]
    writers = ["embed", "flags0", "flags1", *names] + ([] if lm is None else [f"m{lm}"])
    lay = _Layout(len(writers), spec.d_noise)
    slot = {w: lay.slot(i) for i, w in enumerate(writers)}
    flags = {"const": slot["flags0"].start, "bos": slot["flags0"].start + 1, "late": slot["flags1"].start}
    carrying = [i for w in ["embed", *writers[3:]] for i in range(slot[w].start, slot[w].stop)]
    leak_rows = torch.tensor(carrying)
    cfg = TransformerConfig(
        d_model=lay.d_model, n_layers=spec.n_layers, n_heads=spec.n_heads, d_head=D_HEAD, d_mlp=D_MLP,
        d_in=2 + D_CTX, d_out=2, n_ctx=N_POS_CTX, normalization="none", act_fn="relu",
    )  # fmt: skip
    model = Transformer(cfg)
    n = spec.d_noise
    with torch.no_grad():
        for p in model.parameters():
            p.zero_()
        _read_in_out(model, lay, slot["embed"], gen)
        model.W_pos[:, flags["const"]] = 1.0
        model.W_pos[0, flags["bos"]] = 1.0
        model.W_pos[2:, flags["late"]] = 1.0
        model.W_pos[:, lay.noise] = _randn(gen, cfg.n_ctx, n, std=0.3)
        for layer, block in enumerate(model.blocks):
            attn = block.attn
            for h in range(spec.n_heads):
                if (layer, h) not in heads:
                    _off_circuit_head(attn, h, lay, gen)
                    for W in (attn.W_Q, attn.W_K, attn.W_V):
                        scale = CONTENT_SCALE if W is attn.W_Q else 1.0
                        _leak(W[h], leak_rows, D_HEAD, scale * spec.leak, gen)
            if layer != lm:
                mlp = block.mlp
                mlp.W_in[lay.noise] = _randn(gen, n, D_MLP, std=1.0 / math.sqrt(n))
                _leak(mlp.W_in, leak_rows, D_MLP, spec.leak, gen)
                mlp.b_in.copy_(_randn(gen, D_MLP, std=0.5))
                mlp.W_out[:, lay.noise] = _randn(gen, D_MLP, n, std=0.5 / math.sqrt(D_MLP))
        for i, (layer, h) in enumerate(heads):
            attn = model.blocks[layer].attn
            if spec.kind == "backup" and i == 1:
                beta = spec.idle * (1 - OFFSET)
                _backup_head(attn, h, slot[names[0]], slot["embed"], slot[names[1]], flags, beta)
            else:
                _copy_head(attn, h, slot["embed"], slot[names[i]], flags, lay, gen)
        paths: dict[str, frozenset[Edge]] = {}
        components: dict[str, list[str]] = {}
        if lm is None:  # single: the head is read by the read-out
            paths["h0"] = frozenset({("embed", f"{names[0]}.v"), (names[0], "out")})
            components["h0"] = ["embed", names[0]]
            final = slot[names[0]]
        else:
            m = f"m{lm}"
            weights, units = _units(spec.kind, spec)
            mlp, j = model.blocks[lm].mlp, 0
            for k in range(2):
                for gain, bias, out in units:
                    for name, w in zip(names, weights, strict=True):
                        mlp.W_in[slot[name].start + k, j] = gain * w
                    mlp.b_in[j], mlp.W_out[j, slot[m].start + k] = bias, out
                    j += 1
            for i, name in enumerate(names):
                label = ("primary", "backup")[i] if spec.kind == "backup" else f"h{i}"
                paths[label] = frozenset({("embed", f"{name}.v"), (name, f"{m}.in"), (m, "out")})
                components[label] = ["embed", name, m]
            if spec.kind == "backup":
                P, B = names
                paths["detector"] = frozenset({("embed", f"{P}.v"), (P, f"{B}.q"), (B, f"{m}.in"), (m, "out")})
                components["detector"] = ["embed", P, B, m]
            final = slot[m]
        not_final = leak_rows[~torch.isin(leak_rows, torch.arange(final.start, final.stop))]
        _leak(model.read_out.proj.weight.T, not_final, 2, spec.leak, gen)
    return model, paths, components, final


def _random_units(rnn: nn.Module, units: range, lay: _Layout, leak_rows: Tensor, leak: float,
                  gen: torch.Generator) -> None:  # fmt: skip
    """Random LSTM units reading the context part (and ``leak`` of the feature slots)."""
    H, n = D_HIDDEN, lay.noise.stop - lay.noise.start
    for g in range(4):
        rows = [g * H + j for j in units]
        W = rnn.weight_ih_l0
        W[rows, lay.noise] = _randn(gen, len(rows), n, std=1.0 / math.sqrt(n))
        W[torch.tensor(rows)[:, None], leak_rows[None, :]] = _randn(
            gen, len(rows), len(leak_rows), std=leak / math.sqrt(len(leak_rows)))
        rnn.weight_hh_l0[torch.tensor(rows)[:, None], torch.tensor(list(units))[None, :]] = _randn(
            gen, len(rows), len(units), std=0.3 / math.sqrt(len(units)))
        rnn.bias_ih_l0[rows] = _randn(gen, len(rows), std=0.5)


def _lstm(spec: RedundantSpec) -> _Built:
    gen = torch.Generator().manual_seed(spec.seed)
    la, lb, lr = sorted(torch.randperm(spec.n_layers, generator=gen)[:3].tolist())
    writers = ["embed", f"l{la}", f"l{lb}", f"l{lr}"]
    lay = _Layout(len(writers), spec.d_noise)
    slot = {w: lay.slot(i) for i, w in enumerate(writers)}
    leak_rows = torch.arange(0, 2 * len(writers))
    cfg = LSTMConfig(d_model=lay.d_model, n_layers=spec.n_layers, d_hidden=D_HIDDEN, d_in=2 + D_CTX, d_out=2,
                     n_ctx=N_POS_CTX)  # fmt: skip
    model = LSTM(cfg)
    for block in model.blocks:
        block.norm = nn.Identity()
    model.ln_final = nn.Identity()
    n, H = spec.d_noise, D_HIDDEN
    copy_gain = 1.0 / math.tanh(math.tanh(1.0))  # h = tanh(tanh(x)) for x in {0, 1}
    with torch.no_grad():
        for p in model.parameters():
            p.zero_()
        _read_in_out(model, lay, slot["embed"], gen)
        for layer, block in enumerate(model.blocks):
            rnn, out = block.lstm.rnn, block.lstm.out_proj.weight  # out: [d_model, d_hidden]
            circuit = layer in (la, lb, lr)
            first = 2 if circuit else 0
            _random_units(rnn, range(first, H), lay, leak_rows, LSTM_LEAK * spec.leak, gen)
            out[lay.noise, first:] = _randn(gen, n, H - first, std=0.5 / math.sqrt(H - first))
            if not circuit:
                continue
            for k in range(2):  # unit k: class k; input and output gates open, forget gate shut
                rnn.bias_ih_l0[k], rnn.bias_ih_l0[H + k], rnn.bias_ih_l0[3 * H + k] = GATE, -GATE, GATE
                if layer == lr:
                    for src in (f"l{la}", f"l{lb}"):
                        rnn.weight_ih_l0[2 * H + k, slot[src].start + k] = READER_GAIN
                    out[slot[f"l{lr}"].start + k, k] = 1.0
                else:
                    rnn.weight_ih_l0[2 * H + k, slot["embed"].start + k] = 1.0
                    out[slot[f"l{layer}"].start + k, k] = copy_gain
        _leak(model.read_out.proj.weight.T, leak_rows[:-2], 2, spec.leak, gen)  # all but the reader's slot
    paths = {f"l{c}": frozenset({("embed", f"l{c}.in"), (f"l{c}", f"l{lr}.in"), (f"l{lr}", "out")})
             for c in (la, lb)}  # fmt: skip
    components = {f"l{c}": ["embed", f"l{c}", f"l{lr}"] for c in (la, lb)}
    return model, paths, components, slot[f"l{lr}"]


@torch.no_grad()
def _calibrate(model: nn.Module, spec: RedundantSpec, final: slice) -> None:
    """The read-out gain on the final slot: RMS of its clean-minus-corrupted difference 1."""
    data = redundant_data(seed=10_000 + spec.seed, n_train=256, n_test=1)
    diff = (writer_outputs(model, data.train.inputs) - writer_outputs(model, data.train.corrupted)).sum(0)
    rms = float(diff[..., final].pow(2).sum(-1).mean().sqrt())
    model.read_out.proj.weight[:, final] = torch.eye(2) / rms


def _edge_mask(graph: EdgeGraph, edges: Iterable[Edge]) -> Tensor:
    mask = torch.zeros(graph.n_edges, dtype=torch.bool)
    for edge in edges:
        if edge not in graph.edge_index:
            raise ValueError(f"edge {edge} is not in the model's graph")
        mask[graph.edge_index[edge]] = True
    return mask


class _Scorer:
    """Held-out faithfulness and ablation effects of many edge sets, one masked forward each
    (the same numbers as :func:`~mechlab.prune.evaluate.evaluate_masks`, target ``all``)."""

    def __init__(self, model: nn.Module, data: PruneData):
        self.model, self.graph = model, build_graph(model)
        self.x = data.test.inputs
        with frozen_eval(model), torch.no_grad():
            self.ablated = make_ablation(model, "interchange", data.test)
            self.full = predict_in_chunks(model, self.x)
        self.gap = self._distance(torch.zeros(self.graph.n_edges))

    def _distance(self, z: Tensor) -> float:
        with frozen_eval(self.model), torch.no_grad():
            out = masked_forward(self.model, self.graph, self.x, self.ablated, z)
        return float((out - self.full).pow(2).sum(-1).double().mean())

    def faithfulness(self, keep: Iterable[Edge]) -> float:
        """Only ``keep`` clean, every other edge ablated."""
        return 1.0 - self._distance(_edge_mask(self.graph, keep).float()) / self.gap

    def effect(self, ablate: Iterable[Edge]) -> float:
        """Only ``ablate`` ablated: the squared change relative to ablating every edge."""
        return self._distance(1.0 - _edge_mask(self.graph, ablate).float()) / self.gap


def _subsets(scorer: _Scorer, edges: Iterable[Edge]) -> dict[frozenset[Edge], float]:
    ordered = sorted(edges)
    if len(ordered) > MAX_PLANTED:
        raise ValueError(f"{len(ordered)} planted edges: the exhaustive search takes at most {MAX_PLANTED}")
    return {frozenset(s): scorer.faithfulness(s) for k in range(len(ordered) + 1)
            for s in combinations(ordered, k)}  # fmt: skip


def _minimal(table: dict[frozenset[Edge], float], goal: float) -> frozenset[Edge]:
    """The smallest subset reaching ``goal``, the most faithful of those (then the first in order)."""
    faithful = [s for s, f in table.items() if f >= goal]
    size = min(len(s) for s in faithful)
    return max((s for s in faithful if len(s) == size), key=lambda s: (table[s], sorted(s)))


def redundant_model(spec: RedundantSpec) -> RedundantModel:
    """Build ``spec``'s model, calibrate it and find its minimal circuit on ``data()``."""
    build = _lstm if spec.kind in RECURRENT_KINDS else _transformer
    model, paths, components, final = build(spec)
    model.eval()
    _calibrate(model, spec, final)
    edges = frozenset().union(*paths.values())
    rm = RedundantModel(model, spec, edges, paths, components=components)
    data = rm.data()
    rm.planted_faithfulness = subset_faithfulness(model, data, set(edges))
    rm.minimal = _minimal(_subsets(_Scorer(model, data), edges), rm.goal)
    rm.minimal_faithfulness = subset_faithfulness(model, data, set(rm.minimal))
    return rm


def subset_faithfulness(model: nn.Module, data: PruneData, edges: set[Edge]) -> float:
    """Held-out faithfulness (interchange, target ``all``) of the circuit ``edges``
    (:func:`~mechlab.prune.evaluate.evaluate_masks`)."""
    graph = build_graph(model)
    mask = _edge_mask(graph, edges)
    with frozen_eval(model):
        return float(evaluate_masks(model, graph, data.test, "all", "interchange", mask)["faithfulness"])


def check_redundant_ground_truth(rm: RedundantModel, data: PruneData | None = None) -> dict[str, float]:
    """Confirm the claims of the module docstring by exhaustive ablation: the planted
    circuit reaches :data:`PLANTED_FLOOR`; ``rm.minimal`` is a smallest subset of the planted
    edges reaching ``rm.goal``; every planted edge changes some subset's faithfulness by
    :data:`MATTERS`; in a redundant member each edge on some but not all paths has
    single-edge effect < :data:`REDUNDANT_CEILING` (relative to ablating every edge) and
    ablating them together costs > :data:`JOINT_FLOOR`; in the others each planted edge
    costs >= :data:`ALONE_FLOOR`; each off-circuit edge < :data:`OFF_CEILING`, not all 0.

    Args:
        rm: The model.
        data: Traces (default: ``rm.data()``); the held-out set is used.

    Returns:
        ``planted_faithfulness``, ``minimal_faithfulness``, ``minimal_size``,
        ``max_redundant_effect`` and ``joint_effect`` (redundant members),
        ``min_planted_effect``, ``max_off_circuit``, ``frac_off_above_1e_6``,
        ``n_subsets``, ``n_edges``, ``n_countable``.

    Raises:
        ValueError: Naming the first claim that fails.
    """
    data = rm.data() if data is None else data
    scorer = _Scorer(rm.model, data)
    table = _subsets(scorer, rm.edges)
    planted = table[rm.edges]
    if planted < PLANTED_FLOOR:
        raise ValueError(f"the planted circuit's faithfulness {planted:.4g} < {PLANTED_FLOOR}")
    size = len(_minimal(table, rm.goal))
    mine = scorer.faithfulness(rm.minimal)
    if mine < rm.goal or size != len(rm.minimal):
        raise ValueError(f"the minimal circuit ({len(rm.minimal)} edges, faithfulness {mine:.4g}) is not a smallest "
                         f"one reaching {rm.goal:.4g} (smallest: {size} edges)")  # fmt: skip
    for edge in rm.edges:  # every planted edge changes some subset's faithfulness
        if max(abs(table[s | {edge}] - table[s]) for s in table if edge not in s) < MATTERS:
            raise ValueError(f"planted edge {edge} changes no subset's faithfulness by {MATTERS}")
    effects = single_edge_effects(rm.model, data)
    out: dict[str, float] = {"planted_faithfulness": planted, "minimal_faithfulness": mine,
                             "minimal_size": float(size), "min_planted_effect": min(effects[e] for e in rm.edges)}
    if rm.redundant:
        worst = max(rm.redundant_edges, key=lambda e: effects[e])
        if effects[worst] >= REDUNDANT_CEILING:
            raise ValueError(f"redundant edge {worst} has single-edge effect {effects[worst]:.3g} >= {REDUNDANT_CEILING}")
        joint = scorer.effect(rm.redundant_edges)
        if joint <= JOINT_FLOOR:
            raise ValueError(f"ablating the redundant edges together costs {joint:.3g} <= {JOINT_FLOOR}")
        out.update(max_redundant_effect=effects[worst], joint_effect=joint)
    elif out["min_planted_effect"] < ALONE_FLOOR:
        weakest = min(rm.edges, key=lambda e: effects[e])
        raise ValueError(f"planted edge {weakest} has single-edge effect {effects[weakest]:.3g} < {ALONE_FLOOR}")
    graph = scorer.graph
    countable = countable_edges(graph, "interchange")
    off = [effects[e] for i, e in enumerate(graph.edges) if countable[i] and e not in rm.edges]
    if max(off) >= OFF_CEILING:
        raise ValueError(f"an off-circuit edge has single-edge effect {max(off):.3g} >= {OFF_CEILING}")
    if max(off) <= OFF_FLOOR:
        raise ValueError(f"every off-circuit edge has effect <= {OFF_FLOOR}: the components do not leak")
    out.update(max_off_circuit=max(off), frac_off_above_1e_6=sum(e > 1e-6 for e in off) / len(off),
               n_subsets=float(len(table)), n_edges=float(graph.n_edges), n_countable=float(countable.sum()))
    return out


def _family() -> dict[str, RedundantSpec]:
    specs = {kind: RedundantSpec(kind, seed=i + 1) for i, kind in enumerate(TRANSFORMER_KINDS)}
    specs["or3"] = RedundantSpec("or3", seed=3, n_layers=3, n_heads=2)
    specs["lstm-or2"] = RedundantSpec("lstm-or2", seed=9, n_layers=4)
    return specs


REDUNDANT_FAMILY: dict[str, RedundantSpec] = _family()
"""One model per kind: 2-layer, 4-head transformers (``or3``: 3 layers of 2 heads) and a
4-layer LSTM."""


def redundant_family(names: Iterable[str] | None = None) -> dict[str, RedundantModel]:
    """The models of :data:`REDUNDANT_FAMILY` (or those named), built."""
    return build_family(REDUNDANT_FAMILY, names, redundant_model, "redundant models")


__all__ = [
    "KINDS", "REDUNDANT_FAMILY", "REDUNDANT_KINDS", "RedundantModel", "RedundantSpec",
    "check_redundant_ground_truth", "redundant_data", "redundant_family", "redundant_model",
    "subset_faithfulness",
]  # fmt: skip
