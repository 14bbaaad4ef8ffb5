"""The catalog (``rules/catalog.py``): one module per family, in order, and the rules page generated from it."""

from __future__ import annotations


def test_the_rules_page_is_generated_from_the_catalog() -> None:
    from pathlib import Path

    from mbridge_seqpack.rules.catalog import all_rules, render_markdown

    page = (Path(__file__).resolve().parents[2] / "docs" / "rules.md").read_text()
    assert page == render_markdown()
    assert all(f"| `{r.rule_id}` | {r.severity} |" in page for r in all_rules())


def test_each_rule_id_prefix_names_its_one_module() -> None:
    """One family, one module: every rule lives in ``rules/<prefix>.py`` for its id's prefix, and that module holds
    only that family (so a family's rules are found by their id); ``config`` runs first, then families by name."""
    from pathlib import Path

    from mbridge_seqpack.rules.catalog import all_rules, family

    rules = all_rules()
    assert [
        (r.rule_id, r.fn.__module__) for r in rules if r.fn.__module__ != f"mbridge_seqpack.rules.{family(r)}"
    ] == []
    order = [family(r) for r in rules]
    assert rules[0].rule_id == "config.types"
    assert order == sorted(order, key=lambda name: (name != "config", name))
    modules = Path(__file__).resolve().parents[2] / "mbridge_seqpack" / "rules"
    holding = {p.stem for p in modules.glob("*.py") if "@rule(" in p.read_text() and p.stem != "registry"}
    assert holding == set(order)
