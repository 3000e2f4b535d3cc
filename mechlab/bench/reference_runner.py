"""The reference's side of `mechlab bench prune --reference`: a process of its own.

Run as ``python reference_runner.py CHECKOUT DATA THREADS`` by
:func:`mechlab.bench.reference.bench_reference`, under an interpreter whose packages the
reference imports (Hugging Face ``transformers`` 4.x); it imports neither mechlab nor
TransformerLens, so their versions do not have to agree with the reference's.

It loads ``CHECKOUT/src/modeling/modeling_fpt2.py``, builds an ``FPT2LMHeadModel`` (with
embedding nodes) from the GPT-2 config and weights in ``DATA`` (a ``torch.save`` file that
loads with ``weights_only=True``), checks that it reproduces the expected outputs with every
edge kept and with every edge ablated, and prints ``ready MAX_DIFF``. Then, for every
``step`` line on its standard input, it runs one pruning step (as the reference's pruning
script does: sampled masks, forward with ``corr_x``, KL to the full model's log-probs plus
its edge and node regularisers, backward, an Adam step on the log-alphas) and prints
``done``; ``memory`` runs one step under ``torch.profiler`` and prints ``memory BYTES``,
its peak allocation above what was allocated before (as
:func:`mechlab.bench.prune.peak_memory` measures mechlab's side); ``quit`` ends it. A
problem is one line ``error: ...`` and exit status 3.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import torch


def _fail(message: str) -> None:
    print(f"error: {message}", flush=True)
    sys.exit(3)


def _peak_bytes(fn) -> int:
    """Peak bytes of ``fn()``: :func:`mechlab.bench.cpu_memory.profiled_peak`, loaded from its
    file beside this one (the mechlab package is not imported here)."""
    spec = importlib.util.spec_from_file_location("cpu_memory", Path(__file__).with_name("cpu_memory.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.profiled_peak(fn)


def main(argv: list[str]) -> None:
    """Serve pruning steps of the reference model (see the module docstring).

    Args:
        argv: ``[CHECKOUT, DATA, THREADS]``.
    """
    checkout, data_file, threads = argv

    torch.set_num_threads(int(threads))
    folder = Path(checkout) / "src" / "modeling"
    sys.path.insert(0, str(folder))  # it imports its neighbour l0.py
    try:
        # lazy: the reference's own file, importable once its folder is on sys.path (above); a missing package is answered below; the reference code's own requirement, answered below when missing
        import modeling_fpt2
        from transformers import GPT2Config
    except ModuleNotFoundError as exc:
        _fail(f"the reference code needs the package {exc.name!r}, which is not installed here")
    except ImportError as exc:
        _fail(f"the reference code does not import here ({exc}); it needs transformers 4.x: "
              "give --reference-python a Python that has it")
    data = torch.load(data_file, weights_only=True)
    ref = modeling_fpt2.FPT2LMHeadModel(
        GPT2Config.from_dict(data["config"]), with_embedding_nodes=True
    )
    missing, unexpected = ref.load_state_dict(data["weights"], strict=False)
    params = dict(ref.named_parameters())
    absent = [k for k in missing if k in params and "log_alpha" not in k and "lambda" not in k]
    if absent or unexpected:
        _fail(f"the GPT-2 weights do not fit the reference model: missing {absent[:3]}, "
              f"unexpected {list(unexpected)[:3]}")  # fmt: skip
    for name, p in ref.named_parameters():
        p.requires_grad_("log_alpha" in name)

    def set_log_alphas(values: dict) -> None:
        with torch.no_grad():
            for name, value in values.items():
                params[name].copy_(value)

    x, full = data["inputs"], data["full"]
    set_log_alphas(data["log_alphas_open"])
    ref.eval()  # the writer outputs on the corrupted input, as its pruning script gets them
    with torch.no_grad():
        corr_x = ref(input_ids=data["corrupted"], output_writer_states=True).writer_states
        corr_x = corr_x.transpose(0, 1)
    ref.train()  # it samples its masks in training mode
    diff = 0.0
    with torch.no_grad():
        for key, expected in (("log_alphas_open", full), ("log_alphas_closed", data["corrupt"])):
            set_log_alphas(data[key])
            logits = ref(input_ids=x, corr_x=corr_x).logits
            diff = max(diff, float((logits - expected).abs().max()))
    set_log_alphas(data["log_alphas"])
    opt = torch.optim.Adam([p for p in ref.parameters() if p.requires_grad], lr=0.1)
    log_p = torch.log_softmax(full.flatten(0, 1).float(), dim=-1)  # [batch * pos, vocab]
    print(f"ready {diff!r}", flush=True)

    def step() -> None:
        opt.zero_grad(set_to_none=True)
        out = ref(input_ids=x, corr_x=corr_x, target_edge_sparsity=0.5, target_node_sparsity=0.5)
        log_q = torch.log_softmax(out.logits.flatten(0, 1).float(), dim=-1)
        kl = (log_p.exp() * (log_p - log_q)).sum(-1).mean()
        (kl + out.edge_loss + out.node_loss).backward()
        opt.step()

    for line in sys.stdin:
        command = line.strip()
        if command == "quit":
            break
        if command == "memory":
            print(f"memory {_peak_bytes(step)}", flush=True)
            continue
        if command != "step":
            _fail(f"unknown command {command!r}")
        step()
        print("done", flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
