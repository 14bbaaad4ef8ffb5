"""Which sequences share a row, and in which order the rows are read (the second step of ``pack``).

Lengths in, rows out; never a token, and nothing of the plugin above the core. ``rows.place_rows`` is the step
``pack`` calls; it runs the others one way down, each on what the one before returned:

- ``packer``: best-fit decreasing bins (``pack_lengths``, exported here; the C kernel in ``bfd.c``);
- ``balance``: the same number of rows re-dealt to equal cost (``balance_bins``);
- ``layout``: ``StepShape`` (ranks, rows per rank per step, capacity, cost) and ``RowSchedule`` (rows and the order
  the sampler reads them in; ``slot_order``);
- ``level`` and ``exchange``: steps that take a ``RowSchedule`` and return one (refill, spreads, trades);
- ``sampler``: where each row is written so that Megatron-Bridge's sampler reads that order;
- ``record``: the ``BalanceRecord`` a pack writes and the ``BalanceReport`` ``inspect`` computes;
- ``cost``: the row-cost model, the one owner of a row's cost and a step's ratio, under all of them.
"""

from mbridge_seqpack.placement.packer import PackingStats, pack_lengths, packing_stats

__all__ = ["pack_lengths", "packing_stats", "PackingStats"]
