"""Engines the rules, the command line and ``recipes`` ask; none of them is a rule.

Transformer Engine's attention backend selection (``te_attention``, ``attention_backend``), its fixed FusedAttention
support rules as data (``te_fused_rules``), the parallel-layout arithmetic (``topology``), the CUDA-graph path matrix
(``graph_paths``), model-family detection (``model_family``) and where the precision fields come from
(``precision``). Nothing here imports ``rules``."""
