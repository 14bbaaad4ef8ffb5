"""The Hugging Face hub as a recipe build meets it: fail fast where it cannot be reached, and say so in two lines.

Megatron-Bridge's shipped recipes read their model config from the hub (``AutoBridge.from_hf_pretrained(hub id)``).
On a machine without hub access (a cluster login node) ``huggingface_hub`` retries each request before it gives up:
minutes before ``check`` can say anything. :func:`fail_fast` asks the endpoint once, for a few seconds, before the
build; when it does not answer, the build runs with ``HF_HUB_OFFLINE=1`` (what the user would set), so a cached
config is still used and a missing one fails at once. :func:`hub_failure` recognizes what that failure raises, at any
depth of the exception chain, and :func:`hub_message` is the user's two lines.
"""

from __future__ import annotations

import contextlib
import os
import re
import socket
import sys
from typing import Iterator
from urllib.parse import urlparse

__all__ = [
    "PROBE_SECONDS",
    "hub_reachable",
    "fail_fast",
    "no_retries_offline",
    "hub_failure",
    "hub_refused",
    "hub_message",
]

PROBE_SECONDS = 3.0
_DEFAULT_ENDPOINT = "https://huggingface.co"
_OFFLINE_VALUES = {"1", "on", "yes", "true"}
#: what the hub's client, transformers and the HTTP libraries below them say when the hub is out of reach
_HUB_TEXT = re.compile(
    r"offline mode is enabled|HF_HUB_OFFLINE|couldn't connect to|huggingface\.co|Cannot reach|"
    r"cannot find the requested files in the (local )?cache|outgoing traffic has been disabled|"
    r"not a local folder and is not a valid model identifier",
    re.IGNORECASE,
)
_HUB_MODULES = ("huggingface_hub", "requests", "httpx", "httpcore", "urllib3")
_REPO_ID = re.compile(r"(?:['\"]|\bfrom )([A-Za-z0-9][\w.-]*/[\w.-]+)(?:['\"]|\s|$)")


def _offline_set() -> bool:
    return (
        os.environ.get("HF_HUB_OFFLINE") or os.environ.get("TRANSFORMERS_OFFLINE") or ""
    ).lower() in _OFFLINE_VALUES


def _probe_address() -> tuple[str, int]:
    """The host a request to the hub connects to first: the HTTPS proxy where one is set, else the endpoint."""
    proxy = os.environ.get("HTTPS_PROXY") or os.environ.get("https_proxy") or os.environ.get("ALL_PROXY")
    url = urlparse(proxy or os.environ.get("HF_ENDPOINT") or _DEFAULT_ENDPOINT)
    return url.hostname or "huggingface.co", url.port or (443 if url.scheme == "https" else 80)


def hub_reachable(timeout: float = PROBE_SECONDS) -> bool:
    """Whether the hub's endpoint (or the proxy to it) accepts a TCP connection within ``timeout`` seconds."""
    host, port = _probe_address()
    try:
        with socket.create_connection((host, port), timeout=timeout):
            return True
    except OSError:
        return False


#: set by :func:`fail_fast` while its build runs: the hub did not answer (the message says so)
PROBED_UNREACHABLE = False


@contextlib.contextmanager
def fail_fast(timeout: float = PROBE_SECONDS) -> Iterator[None]:
    """Run a recipe build with ``HF_HUB_OFFLINE=1`` when the hub does not answer within ``timeout`` seconds (left
    as it is when the user set it, or the hub answers); the environment and the hub client's constant are restored
    after."""
    global PROBED_UNREACHABLE
    if _offline_set() or hub_reachable(timeout):
        yield
        return
    saved_env = os.environ.get("HF_HUB_OFFLINE")
    constants = sys.modules.get("huggingface_hub.constants")
    saved_constant = getattr(constants, "HF_HUB_OFFLINE", None)
    os.environ["HF_HUB_OFFLINE"] = "1"
    if constants is not None:
        constants.HF_HUB_OFFLINE = True
    PROBED_UNREACHABLE = True
    try:
        yield
    finally:
        PROBED_UNREACHABLE = False
        if saved_env is None:
            os.environ.pop("HF_HUB_OFFLINE", None)
        else:
            os.environ["HF_HUB_OFFLINE"] = saved_env
        constants = sys.modules.get("huggingface_hub.constants")
        if constants is not None:  # imported before or during the build: back to what the user's environment says
            constants.HF_HUB_OFFLINE = bool(saved_constant) if saved_constant is not None else _offline_set()


@contextlib.contextmanager
def no_retries_offline() -> Iterator[None]:
    """Offline, Megatron-Bridge's ``safe_load_config_with_retry`` (``AutoBridge.from_hf_pretrained``) would sleep
    1 + 2 + 4 s between three retries of a cache lookup that cannot change: in a check it tries once. Megatron-Bridge
    must be imported; its defaults are restored after."""
    if not _offline_set():
        yield
        return
    import inspect

    from megatron.bridge.models.hf_pretrained import safe_config_loader

    fn = safe_config_loader.safe_load_config_with_retry
    saved = fn.__defaults__
    params = [p for p in inspect.signature(fn).parameters.values() if p.default is not inspect.Parameter.empty]
    fn.__defaults__ = tuple(0 if p.name == "max_retries" else p.default for p in params)
    try:
        yield
    finally:
        fn.__defaults__ = saved


def _chain(exc: BaseException) -> Iterator[BaseException]:
    seen: set[int] = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        yield exc
        exc = exc.__cause__ or exc.__context__  # type: ignore[assignment]


def hub_refused(exc: BaseException) -> bool:
    """Whether the hub answered and refused (a gated or private repository), rather than not answering."""
    return any(type(link).__name__ in ("GatedRepoError", "RepositoryNotFoundError") for link in _chain(exc))


def hub_failure(exc: BaseException) -> str | None:
    """The hub repository (or ``""``) when ``exc`` is the hub out of reach, at any depth of its chain; else None."""
    for link in _chain(exc):
        module = type(link).__module__.split(".")[0]
        text = str(link)
        if module in _HUB_MODULES or _HUB_TEXT.search(text):
            for candidate in _chain(exc):
                found = _REPO_ID.search(str(candidate))
                if found and not found.group(1).startswith(("http", "huggingface.co")):
                    return found.group(1)
            return ""
    return None


def hub_message(what: str, repo: str, refused: bool = False) -> str:
    """Two lines: what needed the hub and why it failed, then the fixes."""
    config = f"the model config of {repo!r}" if repo else "a model config"
    if refused:
        why = "the hub refused it (a gated or private repository: accept its licence and log in with `hf auth login`)"
    elif PROBED_UNREACHABLE:
        why = f"the hub did not answer within {PROBE_SECONDS:g} s, and it is not in the local cache"
    elif _offline_set():
        why = "HF_HUB_OFFLINE=1 is set, and it is not in the local cache"
    else:
        why = "the hub could not be reached, and it is not in the local cache"
    return (
        f"{what} reads {config} from the Hugging Face hub: {why}\n"
        "  fix: cache it once where the hub is reachable (then HF_HUB_OFFLINE=1 uses the cache), or check a "
        "packaged recipe or a recipe file that builds its model from a local config directory"
    )
