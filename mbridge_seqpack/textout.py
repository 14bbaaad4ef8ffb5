"""Text for people: everything the command line prints fits 100 columns (rich tables, wrapped prose).

``rich`` is a Megatron-Bridge dependency; output is plain text (no colour codes) so it pipes and logs well.
"""

from __future__ import annotations

import io
import shutil
import sys
import textwrap
from typing import Any, Iterable, Sequence

__all__ = ["CONTINUATION", "WIDTH", "message_lines", "progress_bar", "table", "wrap"]

WIDTH = 100
#: what a wrapped message line's continuation starts with, beyond its own line's indent: deeper than the
#: two-space labels (``  fix: ...``) a message may carry, so a reader (and a test) can tell the two apart
CONTINUATION = "    "


def wrap(text: str, indent: str = "", *, hang: str | None = None, width: int = WIDTH) -> list[str]:
    """``text`` as lines of at most ``width`` columns: the first after ``indent``, the rest after ``hang``."""
    return textwrap.wrap(
        text,
        width=width,
        initial_indent=indent,
        subsequent_indent=indent if hang is None else hang,
        break_long_words=True,
        break_on_hyphens=False,
    ) or [indent.rstrip()]


def message_lines(text: str, prefix: str = "", *, width: int = WIDTH) -> list[str]:
    """An error or warning the plugin prints, each of its lines wrapped at ``width`` at spaces only: a path or a
    command a user copies is never split, however long (it then stands alone on its line)."""
    lines: list[str] = []
    for number, line in enumerate(str(text).splitlines() or [""]):
        line = prefix + line if number == 0 else line
        indent = line[: len(line) - len(line.lstrip(" "))]
        lines += textwrap.wrap(
            line,
            width=width,
            subsequent_indent=indent + CONTINUATION,
            break_long_words=False,
            break_on_hyphens=False,
        ) or [line.rstrip()]
    return lines


def progress_bar(*, total: int, unit: str, desc: str, enabled: bool | None = None, **extra: Any) -> Any:
    """A tqdm bar on stderr, at most 100 columns wide: on a terminal (``enabled=None``), always or never.

    Its size is fixed here: tqdm sizes a bar from the terminal, and hides every bar on a pseudo-terminal that
    reports 0 rows and 0 columns (``script``, some job schedulers' consoles), so the bar never showed there."""
    from tqdm import tqdm

    size = shutil.get_terminal_size((WIDTH, 24))  # its fallback also stands in for a reported 0
    columns, rows = min(size.columns, WIDTH), size.lines
    disable = None if enabled is None else not enabled
    return tqdm(
        total=total,
        unit=unit,
        desc=desc,
        ncols=columns,
        nrows=rows,
        file=sys.stderr,
        disable=disable,
        leave=True,
        **extra,
    )


def labelled(label: str, value: str, *, hang: str = "  ", width: int = WIDTH) -> list[str]:
    """``label`` then ``value`` (a path people copy) never split: on one line when it fits, else the value alone on
    the next line after ``hang``, however long."""
    if len(label) + len(value) <= width:
        return [label + value]
    return [label.rstrip(), hang + value]


def table(
    columns: Sequence[tuple[str, str]],
    rows: Iterable[Sequence[object]],
    *,
    width: int = WIDTH,
    keep_whole: Sequence[int] = (0,),
) -> str:
    """A borderless table; ``columns`` are (header, "left"|"right"); long cells wrap inside their column,
    except the first line of the ``keep_whole`` columns (names people copy, e.g. a recipe's)."""
    from rich import box
    from rich.console import Console
    from rich.table import Table

    grid = Table(box=box.SIMPLE_HEAD, show_edge=False, pad_edge=False, collapse_padding=True)
    cells = [[str(cell) for cell in row] for row in rows]
    for index, (header, justify) in enumerate(columns):
        whole = index in keep_whole
        min_width = max([len(header)] + [len(row[index].split("\n")[0]) for row in cells]) if whole else None
        grid.add_column(header, justify=justify, overflow="fold", min_width=min_width)  # type: ignore[arg-type]
    for row in cells:
        grid.add_row(*row)
    out = io.StringIO()
    Console(file=out, width=width, color_system=None, highlight=False, emoji=False).print(grid)
    return "\n".join(line.rstrip() for line in out.getvalue().splitlines())
