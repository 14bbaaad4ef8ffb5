"""``pack``: tokenization, placement and the artifact driven in order (``pack``), by one engine (``engine``: this
machine's, or a Ray cluster's workers in ``ray_engine``). The top of the pack path: nothing below imports it."""
