"""Development tools, kept out of the wheel: nothing in ``mbridge_seqpack`` imports them at run time.

- ``capture/``: the CPU runs that compute the capture-safety verdicts the wheel ships
  (``mbridge_seqpack/capture/verdicts.json``; ``python -m devtools.capture.verdicts --write`` refreshes them);
- ``census/``: the failure-point census of the installed Megatron-Bridge / Megatron-Core / TE files
  (``python -m devtools.census --check`` lists its drift; its render is ``docs/failure-points.md``);
- ``field_uses.py``: where each field a rule reads is consumed at run time (its render is ``docs/field-audit.md``);
- ``import_graph.py``: the plugin's import graph, read with ``ast`` (the architecture test and the package diagram).

``scripts/generate.py`` writes the pages.

Run them from the checkout's root, which puts this folder on the import path.
"""
