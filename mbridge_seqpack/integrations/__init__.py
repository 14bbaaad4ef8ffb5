"""Ways to turn the plugin on where users launch: the environment variable and its startup hook (no code), and
the NeMo-Run launcher plugin (``nemo_run.SequencePacking``)."""
