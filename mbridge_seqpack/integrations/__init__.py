"""Ways to turn the plugin on where users launch, with no code change.

The environment variable and its startup hook (no code), and
the NeMo-Run launcher plugin (``nemo_run.SequencePacking``)."""
