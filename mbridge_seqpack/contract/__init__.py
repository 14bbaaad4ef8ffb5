"""The behaviour contract of a Megatron-Bridge checkout, recorded and compared commit to commit.

A fixed, versioned set of observations of its packing
functions on fixed inputs (``observations.py``), recorded in a subprocess with the checkout first on the path
(``record.py``, ``_run.py``), compared record to record (``diff.py``) and driven by ``git bisect run``
(``bisect.py``). For a Megatron-Bridge maintainer asking what a commit changed in packing behaviour."""
