"""The runs that compute the capture-safety verdicts the wheel ships (``mbridge_seqpack/capture/verdicts.json``).

The code a CUDA graph captures over packed rows, run on CPU tensors that stand in for device tensors, with every host
read recorded (``recorder``); one Megatron-Bridge training iteration as a full-iteration graph captures it
(``iteration``), with CPU stand-ins for the TE kernels it reaches (``kernels``), each TE per-layer scope on each layer
kind (``layers``); ``verdicts`` runs them all and writes the cache (``python -m devtools.capture.verdicts --write``).
The package reads the cache and never imports these.
"""
