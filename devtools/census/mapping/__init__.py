"""The census's verdicts, one module per stage of the path (see ``census/files.py``)."""

from __future__ import annotations

from devtools.census.mapping import (
    attention,
    data,
    moe_mtp_ssm,
    parallel,
    quant_loss,
    schedule_graphs,
    steps,
    te_attention,
    te_wrappers,
)

MAPPING = (
    *data.MAPPING,
    *steps.MAPPING,
    *attention.MAPPING,
    *te_wrappers.MAPPING,
    *te_attention.MAPPING,
    *parallel.MAPPING,
    *moe_mtp_ssm.MAPPING,
    *schedule_graphs.MAPPING,
    *quant_loss.MAPPING,
)
