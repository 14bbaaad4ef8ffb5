"""The histogram ``inspect --png`` draws from an artifact report."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    from mbridge_seqpack.artifact.inspect_artifact import ArtifactReport


def draw_histogram(report: ArtifactReport, png: str | Path) -> None:
    """``inspect --png``: sequences per row, one panel per split (matplotlib, no display needed)."""
    png = Path(png)
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    splits = [s for s in report.splits if s.sequences_per_row]
    if not splits:
        return
    from matplotlib.ticker import MaxNLocator

    fig, axes = plt.subplots(len(splits), 1, figsize=(8, 3.2 * len(splits)), squeeze=False)
    for ax, split in zip(axes[:, 0], splits):
        keys = sorted(split.sequences_per_row)
        values = np.repeat(keys, [split.sequences_per_row[k] for k in keys])
        top = keys[-1] + 1
        ax.hist(values, bins=min(40, top), range=(0, top), color="#4C72B0", edgecolor="white")
        ax.set_xlim(0, top * 1.05)
        ax.yaxis.set_major_locator(MaxNLocator(integer=True))
        ax.set_title(
            f"{split.name}: {split.rows} rows of {split.pack_size} tokens, efficiency {split.efficiency:.1%}, "
            f"{keys[0]}..{keys[-1]} sequences per row"
        )
        ax.set_xlabel("sequences per packed row")
        ax.set_ylabel("rows")
    fig.tight_layout()
    png.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(png, dpi=100)
    plt.close(fig)
