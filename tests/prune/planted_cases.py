"""The planted models of test_planted and test_planted_hard as cases of the methods table.

``mechlab bench methods --planted tests.prune.planted_cases:cases`` (the default);
a richer generator plugs in the same way: any ``module:function`` whose function takes
the seeds and returns :class:`mechlab.bench.methods.PlantedCase` items.
"""

from __future__ import annotations

from collections.abc import Sequence

from mechlab.bench.methods import PlantedCase
from tests.prune.test_planted import PLANTED, planted_data
from tests.prune.test_planted_hard import weak


def cases(seeds: Sequence[int] = (0, 1)) -> list[PlantedCase]:
    """Every planted model of test_planted, and the two weak (x0.03) ones, once per seed."""
    out = []
    makers = {
        **PLANTED,
        "weak value-61": lambda: weak("value-61"),
        "weak qk-61": lambda: weak("qk-61"),
    }
    for name, make in makers.items():
        model, truth = make()
        for seed in seeds:
            out.append(
                PlantedCase(f"{name} seed {seed}", model, set(truth), planted_data(seed), seed=seed)
            )
    return out


def family_cases(seeds: Sequence[int] = (0, 1)) -> list[PlantedCase]:
    """Issue 18's planted family (:data:`mechlab.prune.planted.PLANTED_FAMILY`: random
    off-circuit components, unequal paths 1:1..1:10, 2-4 layers, 2-8 heads, V and Q/K
    composition, dense SSMs), once per seed, on the traces the family's tests prune on:
    ``mechlab bench methods --planted tests.prune.planted_cases:family_cases``."""
    from mechlab.prune.planted import planted_family

    return [PlantedCase(f"{name} seed {seed}", planted.model, set(planted.edges), planted.data(seed), seed=seed)
            for name, planted in planted_family().items() for seed in seeds]  # fmt: skip


def redundant_cases(seeds: Sequence[int] = (0, 1)) -> list[PlantedCase]:
    """The planted family with redundancy (:data:`mechlab.prune.planted_redundant.REDUNDANT_FAMILY`:
    OR-saturating heads, a backup head, dead zones, controls, an LSTM), once per seed,
    truth = every planted edge (all redundant paths):
    ``mechlab bench methods --planted tests.prune.planted_cases:redundant_cases``.
    Exact recovery is not the criterion for redundancy; see :func:`redundant_budget_cases`."""
    return [case for case, _, _ in redundant_budget_cases(seeds)]


def redundant_budget_cases(
    seeds: Sequence[int] = (0, 1),
) -> list[tuple[PlantedCase, dict[str, int], float]]:
    """:func:`redundant_cases` with what to hold a method to: ``(case, budgets, goal)``,
    ``budgets = {"minimal": k, "planted": K}`` (the edges of a smallest faithful circuit
    and of all planted paths) and ``goal`` the held-out faithfulness a method's circuit
    must reach at either budget (``min(0.9, planted faithfulness)``)."""
    from mechlab.prune.planted_redundant import redundant_family

    return [(PlantedCase(f"{name} seed {seed}", rm.model, set(rm.edges), rm.data(seed), seed=seed),
             {"minimal": rm.minimal_budget, "planted": rm.planted_budget}, rm.goal)
            for name, rm in redundant_family().items() for seed in seeds]  # fmt: skip
