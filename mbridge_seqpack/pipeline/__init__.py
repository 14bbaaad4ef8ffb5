"""The driver of ``pack``: tokenization, placement and the artifact, in order, by one engine.

``engine`` holds the protocol and this machine's engine; ``ray_engine`` runs the same steps on a Ray cluster's
workers. The top of the pack path: nothing below imports it."""
