"""What the plugin writes for people: wrapped messages that keep paths whole, and a progress bar that shows on any
terminal (a real tqdm, on a real pseudo-terminal)."""

from __future__ import annotations

import os
import pty
import subprocess
import sys

from hypothesis import given
from hypothesis import strategies as st

from mbridge_seqpack.textout import message_lines
from tests.support.stderr_text import unwrap

BAR = (
    "from mbridge_seqpack.textout import progress_bar\n"
    "with progress_bar(total=3, unit='rec', desc='tokenize x.jsonl') as bar:\n"
    "    bar.update(3)\n"
)


def _bar_output(on_terminal: bool) -> str:
    """The bar's stderr, on a pseudo-terminal that reports 0 rows and 0 columns (as ``script`` makes) or a pipe."""
    env = {**os.environ, "COLUMNS": "", "LINES": ""}
    if not on_terminal:
        done = subprocess.run([sys.executable, "-c", BAR], capture_output=True, text=True, env=env, timeout=60)
        return done.stderr
    leader, follower = pty.openpty()
    try:
        subprocess.run([sys.executable, "-c", BAR], stderr=follower, env=env, timeout=60, check=True)
        os.close(follower)
        chunks = []
        while True:
            try:
                chunk = os.read(leader, 4096)
            except OSError:  # the follower side is closed and drained
                break
            if not chunk:
                break
            chunks.append(chunk)
    finally:
        os.close(leader)
    return b"".join(chunks).decode()


def test_the_bar_shows_on_a_terminal_that_reports_no_size() -> None:
    frames = [f for f in _bar_output(True).replace("\r\n", "\n").replace("\r", "\n").splitlines() if f.strip()]
    assert frames[-1].startswith("tokenize x.jsonl: 100%|") and frames[-1].rstrip().endswith("rec/s]"), frames
    assert " 3/3 [" in frames[-1]
    assert max(len(f) for f in frames) <= 100


def test_the_bar_stays_out_of_a_pipe() -> None:
    assert _bar_output(False) == ""


def test_a_message_is_wrapped_at_spaces_and_keeps_a_long_path_whole() -> None:
    path = "/data/" + "x" * 120 + "/training.jsonl"
    lines = message_lines(f"{path}: 3 sequences longer than 128 tokens; pass --overflow drop", "mbridge-seqpack: ")
    assert lines == [
        "mbridge-seqpack:",
        "    " + path + ":",
        "    3 sequences longer than 128 tokens; pass --overflow drop",
    ]


@given(
    st.lists(
        st.text(st.characters(codec="ascii", exclude_characters="\n\r\t\x0b\x0c\x1c\x1d\x1e\x1f\x85"), max_size=300)
        .map(lambda t: " ".join(t.split()))
        .filter(bool),
        min_size=1,
        max_size=4,
    )
)
def test_unwrapping_gives_back_every_message_line(paragraphs: list[str]) -> None:
    text = "\n".join("  " + p if i else p for i, p in enumerate(paragraphs))
    lines = message_lines(text, "mbridge-seqpack: error: ")
    assert all(len(line) <= 100 or " " not in line.strip() for line in lines)
    assert unwrap("\n".join(lines)) == "\n".join(
        line.rstrip() for line in ("mbridge-seqpack: error: " + text).splitlines()
    )
