"""The census's verdicts, one module per stage of the path (see ``census/files.py``)."""

from __future__ import annotations

from mbridge_seqpack.census.mapping import attention, data, steps

MAPPING = (*data.MAPPING, *steps.MAPPING, *attention.MAPPING)
