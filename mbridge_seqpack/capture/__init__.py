"""Capture safety on CPU: what a CUDA graph over packed rows reads on the host, and the CPU world code runs in.

The cached verdicts the CUDA-graph rules read (``verdicts``, ``verdicts.json``; computed outside the wheel by
``devtools/capture/``), the features that add host reads and their fixes (``conditions``), CPU tensors that stand
for device tensors with host stand-ins for ``torch.cuda`` (``stand_ins``) and the one-rank CPU world a run on CPU
builds its model in (``cpu_world``: the minimal launch, the equivalence checks).

Importing the package imports neither torch nor Megatron; the modules do.
"""
