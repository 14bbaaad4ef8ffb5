"""SFT JSONL -> tokens and loss masks, by Megatron-Bridge's own dataset code (the first step of ``pack``).

``sequences`` (input checks before the Megatron import, ``tokenize_split``, the spill files), ``batched_tokens``
(its prompt-template pieces encoded a chunk per tokenizer call), ``assembly`` (examples that need no truncation
assembled in arrays), ``truncation`` (what its prep cut), ``dataset_kwargs`` (the ``dataset_kwargs`` a pack accepts
and seals). Imports nothing of the plugin above the core (``errors``, ``digests``).
"""
