"""IOI-style prompt pairs (indirect object identification, Wang et al. 2023).

A clean prompt names two people, the indirect object ``IO`` and the subject ``S``, then
``S`` again, and ends where a model that tracks them predicts ``IO``::

    Then, Mary and John went to the store. John gave a drink to        -> " Mary", not " John"

The corrupted prompt is the same template, place and object with three other names in
the three name slots (Wang et al.'s "ABC" distribution: no name repeats, so nothing tells
which one is the indirect object). Every name must be a single token under the given
tokenizer (with its leading space, as it occurs in the prompts), so the clean and corrupted
prompts have one token length; names that are not are left out, and fewer than three
single-token names are refused. Templates, places and objects are yours to replace; a
template holds ``{IO}``, ``{S}`` (twice or more: the repeated subject), ``{PLACE}`` and
``{OBJECT}`` and ends where the answer ``" IO"`` would follow.

:func:`ioi_records` returns the pairs as records of a pair file (``answer`` ``" IO"``,
``wrong`` ``" S"``), for :func:`mechlab.tasks.prompts.pairs_from_records` or
:func:`mechlab.tasks.prompts.write_jsonl`. It is for models with GPT-2-sized weights
(imported with :func:`mechlab.from_pretrained`): a small random model has no IOI circuit.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from pathlib import Path
from typing import Any

NAMES = (
    "Mary", "John", "Alice", "Bob", "Sarah", "Michael", "David", "Emma", "James", "Anna",
    "Paul", "Laura", "Mark", "Lisa", "Daniel", "Kate", "Thomas", "Rachel", "Peter", "Susan",
    "Robert", "Jessica", "Richard", "Amy", "Steven", "Karen", "Andrew", "Julia", "Kevin", "Linda",
    "Brian", "Helen", "Eric", "Emily", "Jason", "Sophie", "Adam", "Grace", "Ryan", "Claire",
    "Sam", "Lucy", "Tom", "Jane", "Chris", "Ruth", "Matt", "Rose", "Alex", "Amber",
)  # fmt: skip
PLACES = (
    "store", "garden", "restaurant", "school", "hospital", "office", "station", "park",
    "house", "library",
)  # fmt: skip
OBJECTS = (
    "ring", "drink", "book", "ball", "computer", "necklace", "snack", "letter", "bottle",
    "bag",
)  # fmt: skip
TEMPLATES = (
    "Then, {IO} and {S} went to the {PLACE}. {S} gave a {OBJECT} to",
    "Then, {S} and {IO} went to the {PLACE}. {S} gave a {OBJECT} to",
    "When {IO} and {S} got a {OBJECT} at the {PLACE}, {S} decided to give it to",
    "When {S} and {IO} got a {OBJECT} at the {PLACE}, {S} decided to give it to",
    "After {IO} and {S} went to the {PLACE}, {S} gave a {OBJECT} to",
    "After {S} and {IO} went to the {PLACE}, {S} gave a {OBJECT} to",
    "While {IO} and {S} were working at the {PLACE}, {S} gave a {OBJECT} to",
    "While {S} and {IO} were working at the {PLACE}, {S} gave a {OBJECT} to",
    "Friends {IO} and {S} found a {OBJECT} at the {PLACE}. {S} gave it to",
    "Friends {S} and {IO} found a {OBJECT} at the {PLACE}. {S} gave it to",
)  # fmt: skip
CORRUPTIONS = ("abc",)


def single_token_names(names: Sequence[str], tokenizer: Any) -> list[str]:
    """The names that are one token with their leading space (``" Mary"``) under ``tokenizer``."""
    kept = []
    for name in names:
        ids = tokenizer(" " + name, add_special_tokens=False)["input_ids"]
        if len(ids) == 1:
            kept.append(name)
    return kept


def _check_templates(templates: Sequence[str]) -> None:
    for template in templates:
        if not isinstance(template, str):
            raise ValueError(f"templates must be strings, got {template!r}")
        if template.count("{IO}") != 1 or template.count("{S}") < 2:
            raise ValueError(
                f"template {template!r} must hold {{IO}} once and {{S}} at least twice "
                "(the subject is repeated; the indirect object is the answer)"
            )
        try:
            template.format(IO="a", S="b", PLACE="c", OBJECT="d")
        except (KeyError, IndexError, ValueError) as err:
            raise ValueError(
                f"template {template!r} may only use {{IO}}, {{S}}, {{PLACE}}, {{OBJECT}} ({err})"
            ) from None


def ioi_records(
    tokenizer: Any,
    n: int = 200,
    seed: int = 0,
    names: Sequence[str] = NAMES,
    places: Sequence[str] = PLACES,
    objects: Sequence[str] = OBJECTS,
    templates: Sequence[str] = TEMPLATES,
    corruption: str = "abc",
) -> list[dict[str, str]]:
    """``n`` IOI prompt pairs as records of a pair file (module docstring).

    Args:
        tokenizer: The model's tokenizer (a Hugging Face tokenizer or a folder holding one):
            names must be single tokens under it.
        n: Pairs.
        seed: Seeds the choice of template, names, place and object of each pair.
        names: Candidate names (those that are not single tokens are left out).
        places: Places.
        objects: Objects.
        templates: Templates (see the module docstring).
        corruption: ``"abc"``: three other distinct names in the name slots.

    Returns:
        Records ``{"clean", "corrupted", "answer": " IO", "wrong": " S"}``.

    Raises:
        ValueError: Fewer than three single-token names, a bad template, ``n < 1``, empty
            places or objects, an unknown corruption.
    """
    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
        raise ValueError(f"n must be a positive integer, got {n!r}")
    if corruption not in CORRUPTIONS:
        raise ValueError(f"unknown corruption {corruption!r}; choose one of {list(CORRUPTIONS)}")
    for label, values in (("places", places), ("objects", objects), ("templates", templates)):
        if not values:
            raise ValueError(f"{label} must not be empty")
    _check_templates(templates)
    if isinstance(tokenizer, (str, Path)):
        # lazy: the IOI pairs' checks run without torch (~15 ms); mechlab.tasks.prompts loads torch (~1.1 s)
        from mechlab.tasks.prompts import load_tokenizer

        tokenizer = load_tokenizer(tokenizer)
    usable = single_token_names(names, tokenizer)
    if len(usable) < 3:
        raise ValueError(
            f"only {len(usable)} of the {len(names)} names are single tokens under this tokenizer "
            f"({usable}); the IOI pairs need at least three (give names= that are)"
        )
    rng = random.Random(seed)
    records = []
    for _ in range(n):
        template = rng.choice(templates)
        place, obj = rng.choice(places), rng.choice(objects)
        io, s, c_io, c_s1, c_s2 = rng.sample(usable, 5) if len(usable) >= 5 else _five(usable, rng)
        clean = template.format(IO=io, S=s, PLACE=place, OBJECT=obj)
        corrupted = _fill_abc(template, c_io, c_s1, c_s2, place, obj)
        records.append({"clean": clean, "corrupted": corrupted, "answer": " " + io, "wrong": " " + s})
    return records


def _five(names: list[str], rng: random.Random) -> tuple[str, str, str, str, str]:
    """IO and S, then three distinct names for the corrupted slots (which may reuse IO or S
    when fewer than five names are available)."""
    io, s = rng.sample(names, 2)
    return io, s, *rng.sample(names, 3)


def _fill_abc(template: str, io: str, s1: str, s2: str, place: str, obj: str) -> str:
    """The template with ``io`` in the IO slot, ``s1`` in the first S slot, ``s2`` in the others."""
    head, sep, tail = template.partition("{S}")
    return (head + s1 + tail.replace("{S}", s2)).format(IO=io, PLACE=place, OBJECT=obj) if sep else template
