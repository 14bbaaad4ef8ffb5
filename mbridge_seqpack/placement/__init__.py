"""Which sequences share a row, and in which order the rows are read (the second step of ``pack``).

``packer`` (best-fit decreasing; the C kernel in ``packing/native/``), ``balance`` (the row-cost model,
equal-cost rows, slot order, the sampler's read order, the ``BalanceRecord`` a pack writes), ``level`` and
``exchange`` (step leveling). Sees lengths only, never tokens; imports nothing of the plugin above the core.
"""
