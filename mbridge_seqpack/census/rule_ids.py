"""Rule ids the census names that other engineers are writing in parallel (issue #32 items 2-3, issue #33).

The id-existence test accepts these until the lead merges their rules; after the merge every id must be in the
catalog and this set shrinks to nothing.
"""

from __future__ import annotations

PLANNED_RULE_IDS: frozenset[str] = frozenset()
