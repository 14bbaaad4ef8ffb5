"""contract/guards.py: a guard is a raise/assert with the condition it is reached under and its message, keyed by
the function as CPython names its code object; a line that guards nothing, a move or a reformat changes no key."""

from __future__ import annotations

import textwrap

from mbridge_seqpack.contract.guards import guards_of_source

BASE = """
class Packed:
    def collate(self, batch, mult):
        if mult < 1:
            raise ValueError(f"mult {mult} < 1")
        elif mult > 8:
            assert batch, "empty"
        else:
            try:
                rows = len(batch)
            except TypeError as exc:
                raise ValueError("rows") from exc
        for row in batch:
            if row is None:
                raise
        def inner(x):
            if x:
                raise KeyError(x)
        return inner
"""


def _texts(source: str) -> dict[str, list[str]]:
    return {q: [g.text for g in gs] for q, gs in guards_of_source(textwrap.dedent(source)).items()}


def _keys(source: str) -> set[str]:
    return {g.key for gs in guards_of_source(textwrap.dedent(source)).values() for g in gs}


def test_each_guard_with_its_condition_and_message() -> None:
    assert _texts(BASE) == {
        "Packed.collate": [
            "if mult < 1: raise ValueError(f'mult {mult} < 1')",
            "if not (mult < 1) and mult > 8: assert batch, 'empty'",
            "if not (mult < 1) and not (mult > 8) and except TypeError: raise ValueError('rows')",
        ],
        "Packed.collate.<locals>.inner": ["if x: raise KeyError(x)"],
    }
    first = guards_of_source(BASE)["Packed.collate"][0]
    assert (first.kind, first.condition, first.occurrence) == ("raise", "mult < 1", 0)
    assert first.key.startswith("Packed.collate::raise::") and first.key.endswith("::0")


def test_a_line_that_guards_nothing_changes_no_guard() -> None:
    noisy = BASE.replace("        for row", "        ids = batch.tolist()\n        for row")
    reformatted = BASE.replace('raise ValueError(f"mult {mult} < 1")', "raise ValueError(\n  f'mult {mult} < 1'\n)")
    assert _keys(noisy) == _keys(BASE) == _keys(reformatted)


def test_a_changed_condition_or_message_is_a_changed_guard() -> None:
    for changed in (BASE.replace('f"mult {mult} < 1"', 'f"mult {mult} <= 0"'), BASE.replace('"empty"', '"no rows"')):
        assert len(_keys(changed) - _keys(BASE)) == 1 and len(_keys(BASE) - _keys(changed)) == 1
    # the else branches' conditions follow their if: a changed test changes every guard under the chain
    assert len(_keys(BASE.replace("if mult < 1:", "if mult < 2:")) - _keys(BASE)) == 3
    assert len(_keys(BASE.replace("mult > 8", "mult >= 8")) - _keys(BASE)) == 2


def test_identical_guards_of_one_function_are_told_apart() -> None:
    twice = "def f(a):\n    if a:\n        raise ValueError('a')\n    if a:\n        raise ValueError('a')\n"
    guards = guards_of_source(twice)["f"]
    assert [g.occurrence for g in guards] == [0, 1] and len({g.key for g in guards}) == 2
