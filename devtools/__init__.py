"""Development tools, kept out of the wheel: nothing in ``mbridge_seqpack`` imports them at run time.

- ``census/``: the failure-point census of the installed Megatron-Bridge / Megatron-Core / TE files
  (``python -m devtools.census`` renders ``docs/failure-points.md``; ``tests/devtools/test_census.py`` is its drift
  test);
- ``field_uses.py``: where each field a rule reads is consumed at run time (``python -m devtools.field_uses``
  renders ``docs/field-audit.md``; ``tests/devtools/test_field_uses.py``).

Run them from the checkout's root, which puts this folder on the import path.
"""
