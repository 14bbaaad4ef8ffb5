"""Packed training against unpacked training, computed per config on CPU (issue #38).

The same short sequences go through Megatron-Bridge's own pack preparation and collate (offline packs or in-batch
packing, with the config's alignment multiple, ``pad_cu_seqlens`` and row width), its step's packed-sequence
handling, and Megatron-Core's MTP roll and MoE router; then through the unpacked path (one sequence per row,
Megatron-Bridge's unpacked collate). What training computes per real token is compared: labels, loss masks, the
sequence each token attends within (as Transformer Engine reads ``PackedSeqParams``; TE's kernel itself does not run
on CPU), MTP labels and their loss weights, the router's token counts and auxiliary losses, and the loss per
sequence and as the step reduces it (Megatron-Bridge's ``masked_next_token_loss`` over a stand-in per-token loss).

``setup`` reads what of a config decides the outcome (the cache key), ``sequences`` holds the sequences,
``batches`` builds the packed and unpacked micro batches, ``signals``, ``router`` and ``loss`` compute the training
signals, ``compare`` the findings. Importing the package imports neither torch nor Megatron; the modules do.
"""
