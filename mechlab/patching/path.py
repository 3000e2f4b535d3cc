"""Path patching: a sender's change reaches the receivers along direct paths only.

For each sender cell (hook, position[, head]):

1. run the base input (corrupted for ``denoise``, clean for ``noise``) with the
   sender's activation taken from the other run and every other component output
   (the ``freeze`` hooks) frozen at its base-run value; record the receivers'
   activations;
2. run the base input again with only the receivers patched to those recorded values,
   and report the metric.

So the sender's effect reaches a receiver only through the residual stream (and
through nothing in ``freeze``), and reaches the output only through the receivers.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch
from torch import Tensor

from mechlab.patching.activation import make_patch
from mechlab.patching.backends import Patch, make_backend
from mechlab.patching.grid import (
    DIRECTIONS,
    OUTPUT_PATTERNS,
    Cell,
    HookSpec,
    check_choice,
    check_inputs,
    check_model,
    components,
    matches,
    metric_value,
    resolve_hooks,
    resolve_positions,
)
from mechlab.patching.result import PatchResult
from mechlab.progress import tqdm

Receiver = str | tuple[str, int]


def _receivers(model, receivers: Receiver | Sequence[Receiver]) -> list[tuple[str, int | None]]:
    if isinstance(receivers, str) or (
        isinstance(receivers, tuple) and len(receivers) == 2 and isinstance(receivers[1], int)
    ):
        receivers = [receivers]
    out = []
    for r in receivers:
        name, head = (r, None) if isinstance(r, str) else r
        if name not in model.hook_dict:
            raise ValueError(f"unknown receiver hook {name!r}; list the valid names with list(model.hook_dict)")
        if head is not None:
            out += components(model, [name], [head])
        else:
            out.append((name, None))
    if not out:
        raise ValueError("receivers is empty; pass a hook name, (hook, head), or a list of them")
    return out


def _forward_order(model, x: Tensor) -> dict[str, int]:
    """Hook name -> rank of its first call in a forward pass."""
    order: dict[str, int] = {}

    def note(act, hook):
        order.setdefault(hook.name, len(order))

    with torch.no_grad(), model.hooks(fwd_hooks=[(lambda name: True, note)]):
        model(x[:1])
    return order


def path_patch(
    model,
    clean: Tensor,
    corrupted: Tensor,
    metric: Callable[[Tensor], Tensor],
    receivers: Receiver | Sequence[Receiver],
    senders: HookSpec = None,
    positions: Sequence[int] | str | None = None,
    heads: bool | Sequence[int] = True,
    freeze: HookSpec = None,
    direction: str = "denoise",
    backend: str = "hooks",
    progress: bool = True,
) -> PatchResult:
    """Sweep senders (hook x position x head) for their direct effect through ``receivers``.

    Args:
        model: A mechlab model.
        clean: Clean inputs, ``[batch, pos, d_in]`` or ``[batch, pos]`` tokens.
        corrupted: Corrupted inputs of the same shape.
        metric: ``metric(output) -> scalar tensor``.
        receivers: A hook name (all heads), a ``(hook, head)`` pair, or a list of them;
            e.g. ``("blocks.1.attn.hook_v", 0)``, ``"blocks.1.ln1.hook_normalized"``,
            ``"blocks.2.hook_mixer_in"``. Patched at every position in step 2.
        senders: Sender hooks (names, a predicate, or None for the component outputs:
            ``attn.hook_result``, ``hook_mlp_out``, ``hook_mixer_out``) ; only hooks
            that run before every receiver are kept.
        positions: Sender positions (None: each; ``"all"``: all at once).
        heads: Sender heads, as in :func:`activation_patch`.
        freeze: Hooks frozen at their base-run value in step 1 (None: the component
            outputs). Receiver hooks are never frozen; a sender hook is frozen everywhere
            but at the sender cell. Senders should be component outputs or lie upstream
            of nothing in ``freeze`` within their own component, or the freeze erases
            them.
        direction: ``"denoise"`` (base = corrupted, sender from clean) or ``"noise"``.
        backend: ``"hooks"`` or ``"nnsight"``.
        progress: Show a progress bar.

    Returns:
        A :class:`PatchResult` (method ``"path"``) over senders x positions; its
        ``meta["receivers"]`` lists the receivers.
    """
    check_model(model)
    check_inputs(clean, corrupted)
    check_choice("direction", direction, DIRECTIONS)
    engine = make_backend(backend, model)
    recv = _receivers(model, receivers)
    recv_names = list(dict.fromkeys(name for name, _ in recv))
    order = _forward_order(model, clean)
    first_receiver = min(order[name] for name in recv_names)

    if senders is None:
        sender_names = [n for n in model.hook_dict if matches(n, OUTPUT_PATTERNS)]
        sender_names = [n for n in sender_names if order[n] < first_receiver]
        if not sender_names:
            raise ValueError("no component output runs before the receivers; pass senders explicitly")
    else:
        sender_names = resolve_hooks(model, senders, heads)
        late = [n for n in sender_names if order[n] >= first_receiver]
        if late:
            raise ValueError(f"sender(s) {late} do not run before every receiver; choose earlier senders")
    sender_names.sort(key=order.__getitem__)
    if freeze is None:
        freeze_names = [n for n in model.hook_dict if matches(n, OUTPUT_PATTERNS)]
    else:
        freeze_names = resolve_hooks(model, freeze, heads)
    freeze_names = [n for n in freeze_names if n not in recv_names]
    rows = components(model, sender_names, heads)
    cols = resolve_positions(positions, clean.shape[1])

    needed = list(dict.fromkeys(sender_names + freeze_names))
    with torch.no_grad():
        clean_out, clean_acts = engine.run(clean, save=needed)
        corrupted_out, corrupted_acts = engine.run(corrupted, save=needed)
    clean_metric = float(metric_value(metric, clean_out))
    corrupted_metric = float(metric_value(metric, corrupted_out))
    if direction == "denoise":
        base, base_acts, source_acts = corrupted, corrupted_acts, clean_acts
    else:
        base, base_acts, source_acts = clean, clean_acts, corrupted_acts

    values = torch.empty(len(rows), len(cols))  # [component, pos]
    bar = tqdm(total=values.numel(), desc="path patching", disable=not progress)
    with torch.no_grad():
        for i, (hook, head) in enumerate(rows):
            for j, pos in enumerate(cols):
                cell = Cell(hook, pos, head)
                sender_value = base_acts[hook].clone()
                index = cell.index(model.hook_axes(hook))
                sender_value[index] = source_acts[hook][index]
                # the sender hook carries the base run everywhere but at the cell
                frozen = [Patch(n, (slice(None),), base_acts[n]) for n in freeze_names if n != hook]
                sender = Patch(hook, (slice(None),), sender_value)
                _, recorded = engine.run(base, [*frozen, sender], save=recv_names)
                patches = [
                    make_patch(model, Cell(name, "all", rhead), recorded[name]) for name, rhead in recv
                ]
                out, _ = engine.run(base, patches)
                values[i, j] = float(metric_value(metric, out))
                bar.update()
    bar.close()
    engine.close()
    labels = [name if h is None else f"{name}[{h}]" for name, h in recv]
    return PatchResult(
        values, rows, cols, clean_metric, corrupted_metric, direction, "path",
        meta={"receivers": labels, "freeze": freeze_names},
    )
