"""The layout the folders promise: no import circles between modules (function-level imports included), and the
low layers never reach up (the rule catalog and the packer know nothing of the command line)."""

from __future__ import annotations

from devtools.import_graph import PACKAGE, import_graph, package_graph


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    found, state, stack = [], {}, []

    def visit(node: str) -> None:
        state[node] = "open"
        stack.append(node)
        for nxt in sorted(graph[node]):
            if state.get(nxt) == "open":
                found.append(stack[stack.index(nxt) :] + [nxt])
            elif nxt not in state:
                visit(nxt)
        stack.pop()
        state[node] = "done"

    for node in sorted(graph):
        if node not in state:
            visit(node)
    return found


def test_no_import_circles() -> None:
    assert _cycles(import_graph()) == []


def test_no_circles_between_packages() -> None:
    """Package level: rules/ never reaches into compose/, artifact/ never into thd/, and so on."""
    packages = package_graph()
    assert _cycles({k: packages.get(k, set()) & set(packages) for k in packages}) == []


#: the pack path's packages, top to bottom, and what each may import of the plugin (issue #34): the data of ``pack``
#: moves down; tokenization and placement know nothing of each other, of the artifact or of what drives them
PACK_PATH = {
    "pipeline": {"tokenization", "placement", "artifact", "digests", "errors", "textout"},
    "artifact": {"tokenization", "placement", "digests", "errors", "ranks", "textout"},
    "placement": {"errors"},
    # textout: the progress bar, text for people; frames: whether a prep failure was raised inside Megatron's code
    "tokenization": {"digests", "errors", "frames", "textout"},
    "digests": set(),
    "frames": set(),
}


def test_pack_path_layers() -> None:
    packages = package_graph()
    assert {name: packages.get(name, set()) - allowed for name, allowed in PACK_PATH.items()} == {
        name: set() for name in PACK_PATH
    }
    # what drives the pack path is driven only by the command line
    assert sorted(name for name, imports in packages.items() if "pipeline" in imports) == ["cli"]


#: placement/'s modules in the order ``pack``'s lengths go down through them: each imports only modules after it
#: (``rows`` drives the steps; ``level`` and ``exchange`` take a layout and return one; ``cost`` owns the row-cost
#: model and imports nothing)
PLACEMENT = ("rows", "balance", "level", "exchange", "record", "layout", "sampler", "packer", "cost")


def test_placement_is_one_way() -> None:
    graph = import_graph()
    modules = sorted(m.rpartition(".")[2] for m in graph if m.startswith("mbridge_seqpack.placement."))
    assert modules == sorted(PLACEMENT)
    for at, name in enumerate(PLACEMENT):
        imported = {i.rpartition(".")[2] for i in graph[f"mbridge_seqpack.placement.{name}"]}
        assert imported & set(PLACEMENT) <= set(PLACEMENT[at + 1 :]), name
    assert {i for i in graph["mbridge_seqpack.placement.cost"] if i.startswith("mbridge_seqpack")} == set()


def test_the_walk_of_packs_input_goes_down_the_house() -> None:
    """#34: ``pack_jsonl``'s data enters each package at most twice, in this order: the inputs and the tokenizer's
    seal, the output checked and staged (all before the Megatron import), tokenization, placement once, the files.
    The writer reads the placed rows' tokens itself (artifact/row_tokens.py), not through tokenization."""
    import importlib.util
    import sys

    spec = importlib.util.spec_from_file_location("pack_walk", PACKAGE.parent / "scripts" / "pack_walk.py")
    pack_walk = importlib.util.module_from_spec(spec)
    sys.modules["pack_walk"] = pack_walk  # its dataclasses look their module up
    spec.loader.exec_module(pack_walk)
    walk = pack_walk.pack_walk(pack_size=2048).by_package()  # leveling and exchanges run at this size
    assert list(walk.stays) == [
        "pipeline", "tokenization", "digests", "artifact", "tokenization", "placement", "artifact"
    ]  # fmt: skip
    assert max(walk.entries().values()) == 2 and walk.returns == 2


def test_low_layers_do_not_import_the_command_line() -> None:
    graph = import_graph()
    for name, imports in graph.items():
        if name.startswith(
            (
                "mbridge_seqpack.rules",
                "mbridge_seqpack.tokenization",
                "mbridge_seqpack.placement",
                "mbridge_seqpack.artifact",
                "mbridge_seqpack.pipeline",
                "mbridge_seqpack.digests",
                "mbridge_seqpack.thd",
                "mbridge_seqpack.compose",
                "mbridge_seqpack.recipes",
                "mbridge_seqpack.integrations",
            )
        ):
            assert not [i for i in imports if i.startswith("mbridge_seqpack.cli")], name


def test_composition_never_reaches_up_to_the_recipes() -> None:
    """The recipes are written with compose/ (mixins, derive); the planner, which builds recipes, is the CLI's."""
    graph = import_graph()
    for name, imports in graph.items():
        if name.startswith("mbridge_seqpack.compose"):
            assert not [i for i in imports if i.startswith("mbridge_seqpack.recipes")], name
    assert "mbridge_seqpack.recipes.targets" in graph["mbridge_seqpack.cli.plan"]


def test_the_analysis_engines_know_no_rule() -> None:
    """#40: TE's backend selection, its fixed support rules and the layout arithmetic are engines the rules, the
    command line and recipes ask; they import nothing of rules/ (so a rule module is only rules)."""
    packages = package_graph()
    assert "rules" not in packages["analysis"]
    assert {"rules", "cli", "recipes"} <= {name for name, imports in packages.items() if "analysis" in imports}


def test_the_command_line_prints_the_librarys_report_and_gathers_nothing() -> None:
    """#51: ``check`` on the command line renders what ``report.check()`` gathered (the same report the library
    returns and the hook logs); the report sits above what it gathers, which never imports it back."""
    graph = import_graph()
    gatherers = (
        "mbridge_seqpack.rules",
        "mbridge_seqpack.equivalence",
        "mbridge_seqpack.corrections",
        "mbridge_seqpack.analysis.attention_backend",
    )
    assert [i for i in graph["mbridge_seqpack.cli.check"] if i.startswith(gatherers)] == []
    assert "mbridge_seqpack.report" in graph["mbridge_seqpack.cli.check"]
    for name, imports in graph.items():
        if name.startswith(gatherers + ("mbridge_seqpack.analysis", "mbridge_seqpack.capture")):
            assert not [i for i in imports if i.startswith("mbridge_seqpack.report")], name
