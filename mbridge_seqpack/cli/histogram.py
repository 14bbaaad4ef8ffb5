"""The plot ``inspect --png`` draws from an artifact report: per split, the distribution of sequence lengths against
the pack size (what decides how rows fill), and the fill of every row (what the packing achieved). Matplotlib is the
``plot`` extra (``pip install 'mbridge-seqpack[plot]'``), not a requirement of the plugin: :func:`require_matplotlib`
says so before the artifact is read."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    from mbridge_seqpack.artifact.inspect_artifact import ArtifactReport, SplitReport

BLUE, ORANGE, GREY = "#4C72B0", "#DD8452", "#555555"
#: how the plot's one requirement is installed
PLOT_EXTRA = "pip install 'mbridge-seqpack[plot]'"


def require_matplotlib() -> None:
    """A ``UsageError`` (exit 2) when matplotlib cannot be imported: ``--png`` needs the ``plot`` extra."""
    from mbridge_seqpack.errors import UsageError

    try:
        import matplotlib  # noqa: F401
    except ImportError as exc:
        raise UsageError(
            f"inspect --png draws with matplotlib, which cannot be imported here ({exc}); install it with "
            f"`{PLOT_EXTRA}` (or `pip install matplotlib`), or leave out --png"
        ) from None


def _lengths_panel(ax, split: SplitReport) -> None:
    lengths, size = split.sequence_lengths, split.pack_size or int(split.sequence_lengths.max())
    ax.hist(lengths, bins=min(60, max(int(lengths.max()) // 8, 10)), range=(0, size), color=BLUE, edgecolor="white")
    ax.axvline(size, color=GREY, linestyle="--", linewidth=1)
    ax.text(size, ax.get_ylim()[1] * 0.95, " pack size", color=GREY, ha="right", va="top", rotation=90)
    median = int(np.median(lengths))
    ax.set_title(
        f"{split.name}: {split.sequences:,} sequences, median {median:,} tokens, longest {int(lengths.max()):,}"
    )
    ax.set_xlim(0, size * 1.02)
    ax.set_xlabel(f"sequence length (tokens; the pack size is {size:,})")
    ax.set_ylabel("sequences")


def _fill_panel(ax, split: SplitReport) -> None:
    fill = np.sort(split.row_fill / split.pack_size if split.pack_size else split.row_fill)[::-1]
    ax.bar(np.arange(len(fill)), fill, width=1.0, color=ORANGE, linewidth=0)
    ax.axhline(1.0, color=GREY, linestyle="--", linewidth=1)
    ax.set_ylim(0, 1.05)
    ax.set_xlim(-0.5, len(fill) - 0.5)
    ax.set_title(
        f"{split.name}: {split.rows:,} rows, efficiency {split.efficiency:.1%}, "
        f"{min(split.sequences_per_row)}..{max(split.sequences_per_row)} sequences per row"
    )
    ax.set_xlabel("rows, fullest first")
    ax.set_ylabel("row fill (share of the pack size)")


def draw_histogram(report: ArtifactReport, png: str | Path) -> None:
    """``inspect --png``: per split, sequence lengths against the pack size, and each row's fill (matplotlib)."""
    png = Path(png)
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    splits = [s for s in report.splits if s.sequences_per_row and len(s.sequence_lengths)]
    if not splits:
        return
    fig, axes = plt.subplots(len(splits), 2, figsize=(13, 3.4 * len(splits)), squeeze=False)
    for (left, right), split in zip(axes, splits):
        _lengths_panel(left, split)
        _fill_panel(right, split)
    fig.tight_layout()
    png.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(png, dpi=100)
    plt.close(fig)
