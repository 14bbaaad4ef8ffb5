"""The optional keyed seal: an HMAC-SHA256 of every metadata entry with a key the user holds.

The plain seal (``entry_sha256`` over each entry, which holds the file's sha256, every tile's and every column's)
detects corruption and accidental edits. It cannot detect a deliberate edit: anyone who can write the folder can
recompute every hash with the plugin's own functions. With a key (``MBRIDGE_SEQPACK_SEAL_KEY``, or a file named by
``MBRIDGE_SEQPACK_SEAL_KEY_FILE`` or ``pack --seal-key-file``), each entry also carries ``entry_hmac_sha256``, which
nobody without the key can recompute, so an edited entry, tile or token is refused wherever the key is set. The
entry records that it is keyed (``seal_keyed``), never the key. Where a key is set, an entry without a keyed seal is
refused (a stripped seal reads as one), and so is a file without any seal (Megatron-Bridge's own prep, or files
swapped in: :func:`unsealed_problem`); where none is set, a keyed entry is refused with the variable to set.

An empty variable (``MBRIDGE_SEQPACK_SEAL_KEY=""``, ``MBRIDGE_SEQPACK_SEAL_KEY_FILE=""``) is no key, as unset: an
empty value is what a launcher or container declares for a variable it does not set, and reading it as a key of
0 bytes would refuse every pack, keyed or not, with nothing the user can do but unset it. It weakens nothing that
an unset variable does not: a keyed pack is still refused without its key.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import os
from pathlib import Path
from typing import Any

from mbridge_seqpack.errors import ArtifactError, os_reason

__all__ = [
    "KEY_ENV",
    "KEY_FILE_ENV",
    "ENTRY_HMAC",
    "KEYED",
    "ALGORITHM",
    "MIN_KEY_BYTES",
    "seal_key",
    "entry_hmac",
    "keyed_problem",
    "unsealed_problem",
    "SEAL_COMMAND",
]

KEY_ENV = "MBRIDGE_SEQPACK_SEAL_KEY"
KEY_FILE_ENV = "MBRIDGE_SEQPACK_SEAL_KEY_FILE"
ENTRY_HMAC = "entry_hmac_sha256"
KEYED = "seal_keyed"
ALGORITHM = "hmac-sha256"
#: a shorter key is refused: an HMAC is only as hard to forge as its key is to guess
MIN_KEY_BYTES = 16


def _checked(key: bytes, where: str) -> bytes:
    if len(key) < MIN_KEY_BYTES:
        raise ArtifactError(
            f"{where}: the seal key has {len(key)} bytes; use at least {MIN_KEY_BYTES} (e.g. `head -c 32 "
            "/dev/urandom | base64 > seal.key`)"
        )
    return key


def seal_key(key_file: str | Path | None = None) -> bytes | None:
    """The seal key: ``key_file`` (``pack --seal-key-file``), else the file ``$MBRIDGE_SEQPACK_SEAL_KEY_FILE``
    names, else ``$MBRIDGE_SEQPACK_SEAL_KEY``; None when none is set. A file's trailing newline is not part of the
    key."""
    named = key_file if key_file is not None else os.environ.get(KEY_FILE_ENV) or None
    if named is not None:
        where = "--seal-key-file" if key_file is not None else KEY_FILE_ENV
        try:
            raw = Path(named).read_bytes()
        except OSError as exc:
            raise ArtifactError(f"{where} {named}: cannot be read ({os_reason(exc)})") from None
        return _checked(raw.rstrip(b"\r\n"), f"{where} {named}")
    text = os.environ.get(KEY_ENV)
    if not text:  # unset or empty: no key (the module's docstring says why)
        return None
    return _checked(text.encode(), KEY_ENV)


def entry_hmac(body: dict[str, Any], key: bytes) -> str:
    """HMAC-SHA256 of a metadata entry without its seals, in the canonical JSON ``entry_sha256`` hashes."""
    return hmac.new(key, json.dumps(body, sort_keys=True).encode(), hashlib.sha256).hexdigest()


def keyed_problem(entry: dict[str, Any], body: dict[str, Any], key: bytes | None) -> str | None:
    """Why ``entry`` (its ``body`` without the seals) fails the keyed seal where ``key`` is set, or is keyed where
    none is; None when it passes."""
    keyed = entry.get(KEYED)
    if key is None:
        if keyed:
            return (
                f"it is sealed with a key ({keyed}); set {KEY_ENV} or {KEY_FILE_ENV} to the key it was packed with "
                "to verify it"
            )
        return None
    if keyed != ALGORITHM or not isinstance(entry.get(ENTRY_HMAC), str):
        return (
            f"a seal key is set ({KEY_ENV}/{KEY_FILE_ENV}) but the entry has no keyed seal: packed without the key, "
            "or its keyed seal was removed"
        )
    if not hmac.compare_digest(entry[ENTRY_HMAC], entry_hmac(body, key)):
        return (
            "its keyed seal (HMAC-SHA256) does not match: the entry or a file it seals was edited, or another key "
            "sealed it"
        )
    return None


#: what seals a pack with the key (the message of a pack refused for having no keyed seal)
SEAL_COMMAND = f"{KEY_ENV}=<the key> mbridge-seqpack pack --recipe ... (or --seal-key-file FILE)"


def unsealed_problem(what: str = "not sealed") -> str | None:
    """Why a packed file without any seal (no mbridge_seqpack fingerprint: Megatron-Bridge's own prep, or files
    substituted with its three metadata keys) must not be trained on: a seal key is set, and only packs sealed with
    it are. None where no key is set (an unsealed pack is then Megatron-Bridge's own, read as it is)."""
    try:
        key = seal_key()
    except ArtifactError as exc:
        return f"{what}, and the seal key cannot be used: {exc}"
    if key is None:
        return None
    return (
        f"{what}, and a seal key is set ({KEY_ENV}/{KEY_FILE_ENV}): only packs sealed with that key are trained "
        f"on; seal it with `{SEAL_COMMAND}`, the same key"
    )
