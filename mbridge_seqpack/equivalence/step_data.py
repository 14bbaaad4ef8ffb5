"""One rank's global step as the launch feeds it, packed and truly unpacked: what the miniature launch runs.

The data side (the config's datasets, sampler, collate and ``prepare_finetuning_batch``) produces a
:class:`StepData`; the model side runs the config's own step function over each micro batch list (forward and
backward through the constructed model) and compares, per real token, what the two runs computed. ``sites`` tie a
sample's input positions to where they sit in each run's micro batches, so the comparison never guesses.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

__all__ = ["Site", "StepData"]

#: where one input position of one sample sits: (micro batch index, row, column); None where the run does not
#: feed that position (dropped by the prep, truncated by the collate)
Site = tuple[int, int, int] | None


@dataclass
class StepData:
    """The micro batches of one rank's global step, as ``forward_step``'s data iterator yields them."""

    #: the packed run's micro batches (each a dict exactly as the config's collate and batch split make it)
    packed: list[dict[str, Any]]
    #: the same samples truly unpacked: one sequence per row, micro batches of the config's MBS, MB's unpacked collate
    unpacked: list[dict[str, Any]]
    #: each sample's token ids as the prep tokenized them (the unit the comparison is made in)
    samples: list[list[int]]
    #: sample index -> per input position, where it sits packed / unpacked
    packed_sites: dict[int, list[Site]]
    unpacked_sites: dict[int, list[Site]]
    #: what stood in for what the launch would read (the tokenizer, a length distribution), said in the verdict
    notes: list[str] = field(default_factory=list)
