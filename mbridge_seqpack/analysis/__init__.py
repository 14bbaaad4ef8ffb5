"""Engines the rules, the command line and ``recipes`` ask; none of them is a rule.

Transformer Engine's attention backend selection (``te_attention``, ``attention_backend``), its fixed FusedAttention
support rules as data (``te_fused_rules``), and the parallel-layout arithmetic (``topology``).
Nothing here imports ``rules``."""
