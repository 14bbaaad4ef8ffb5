"""One check's report, from the library to the command line and the hook.

``check()`` gathers it, ``check`` on the command line prints it (text or ``--json``), the hook logs it once per
process at rank 0 (issue #51)."""

from mbridge_seqpack.report.check_report import CheckReport, derived_values, packing_mode, state_of
from mbridge_seqpack.report.gather import check

__all__ = ["CheckReport", "check", "derived_values", "packing_mode", "state_of"]
