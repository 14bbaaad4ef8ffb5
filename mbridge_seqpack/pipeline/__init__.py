"""The driver of ``pack``: tokenization, placement and the artifact, in order.

Locally (``pack``) or on a Ray cluster's workers (``ray_engine``).
The top of the pack path: nothing below imports it."""
