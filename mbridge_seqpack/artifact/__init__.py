"""The sealed artifact: written once, read back verified (the last step of ``pack``, and what a launch checks).

``store`` (file names, ``Fingerprint``, rows gathered and written a row group at a time, staging and lock),
``row_tokens`` (the placed rows' tokens read back from tokenization's arrays or spill files),
``row_group_seal`` (every byte under a tile digest), ``seal`` (a sealed file against its metadata),
``parquet_stitch`` (parts joined into one file), ``pack_phases`` (where the kill tests stop ``pack``),
``inspect_artifact``, ``builder_location`` (Megatron-Bridge's default pack path); at launch ``content_check``,
``verified_parquet`` and ``launch_guard``. Reads the token sequences of ``tokenization`` and the balance record of
``placement``.
"""
