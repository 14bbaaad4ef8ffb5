"""Stderr as the plugin meant it: its messages are wrapped at 100 columns (``textout.message_lines``), so a test
that compares a whole message first joins each continuation line (``CONTINUATION`` deeper than the line it
continues) back onto it."""

from __future__ import annotations

from mbridge_seqpack.textout import CONTINUATION


def _indent(line: str) -> int:
    return len(line) - len(line.lstrip(" "))


def unwrap(text: str) -> str:
    """``text`` with every wrapped message line joined back into the line it was cut from."""
    lines: list[str] = []
    base: list[int] = []  # the indent of the line each logical line started with
    for line in text.splitlines():
        if lines and line.strip() and _indent(line) >= base[-1] + len(CONTINUATION):
            lines[-1] += " " + line.lstrip(" ")
        else:
            lines.append(line)
            base.append(_indent(line))
    return "\n".join(lines) + ("\n" if text.endswith("\n") else "")
