"""Capture safety, computed on CPU: what a CUDA graph over packed rows would read on the host.

The code a CUDA graph captures over packed rows, run on CPU tensors that stand in for
device tensors, with every host read recorded (``recorder``); one Megatron-Bridge training iteration as a
full-iteration graph captures it (``iteration``), each TE per-layer scope on each layer kind (``layers``), the
features that add host reads and their fixes (``conditions``), and the cached verdicts the CUDA-graph rules read
(``verdicts``, ``verdicts.json``).

Importing the package imports neither torch nor Megatron; the modules do.
"""
