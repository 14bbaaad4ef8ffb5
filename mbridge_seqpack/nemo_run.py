"""``from mbridge_seqpack.nemo_run import SequencePacking``: the NeMo-Run plugin (see integrations/nemo_run.py)."""

from mbridge_seqpack.integrations.nemo_run import (  # noqa: F401
    HAVE_NEMO_RUN,
    SequencePacking,
    SequencePackingScriptArgs,
    script_overrides,
)

__all__ = ["SequencePacking", "SequencePackingScriptArgs", "script_overrides", "HAVE_NEMO_RUN"]
