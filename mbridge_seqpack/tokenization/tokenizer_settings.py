"""The tokenizer settings a pack is tokenized with: the fields of the config's ``TokenizerConfig`` that
Megatron-Bridge's launch reads to build its tokenizer (``training/setup.py`` calls ``build_tokenizer(cfg.tokenizer)``),
sealed in the fingerprint and compared by ``check``, so a pack is made with the very tokenizer the launch trains with.

The list is not written by hand: :func:`token_fields` walks the source of the build path (Megatron-Bridge's
``build_tokenizer`` and the helpers it hands the config to, Megatron-Core's ``build_tokenizer``, the config's
``__post_init__``) and collects every attribute read of the config, less those read only to pad the vocabulary for
the model. A field a later Megatron-Bridge reads is sealed and compared without a change here.
"""

from __future__ import annotations

import ast
import copy
import functools
import hashlib
import importlib.util
import json
from pathlib import Path
from typing import Any

__all__ = [
    "BUILD_PATH",
    "VOCAB_PADDING",
    "NOT_COMPARED",
    "token_fields",
    "build_reads",
    "tokenizer_settings",
    "default_tokenizer_config",
    "for_directory",
    "sealed_settings",
    "settings_differences",
]

#: (module, function, the parameter holding the config): where the launch's tokenizer build starts; functions of
#: the same module the config is passed on to are followed
BUILD_PATH = (
    ("megatron.bridge.training.tokenizers.tokenizer", "build_tokenizer", "config"),
    ("megatron.core.tokenizers.utils.build_tokenizer", "build_tokenizer", "args"),
    ("megatron.bridge.training.tokenizers.config", "TokenizerConfig.__post_init__", "self"),
)

#: read by the build only to pad the vocabulary for the model's embedding (``_set_padded_vocab_size``,
#: ``vocab_size_with_padding``): the tokens do not change
VOCAB_PADDING = frozenset(
    {"pad_vocab_size", "padded_vocab_size", "make_vocab_size_divisible_by", "tensor_model_parallel_size", "rank"}
)

#: recorded but compared otherwise: the tokenizer files by their digest (``tokenizer_sha256``: a folder may be
#: mounted elsewhere), the template file by the template it holds (``chat_template`` is the effective template)
NOT_COMPARED = {
    "tokenizer_model": "compared by the digest of its files (fingerprint tokenizer_sha256)",
    "chat_template_path": "compared by the template it holds (chat_template)",
}


def _function(tree: ast.Module, dotted: str) -> ast.FunctionDef | None:
    scope: list[ast.stmt] = tree.body
    node: Any = None
    for part in dotted.split("."):
        node = next((n for n in scope if isinstance(n, (ast.FunctionDef, ast.ClassDef)) and n.name == part), None)
        if node is None:
            return None
        scope = node.body
    return node if isinstance(node, ast.FunctionDef) else None


@functools.lru_cache(maxsize=None)
def _module_tree(module: str) -> ast.Module:
    """The parsed source of ``module``, found without importing it (no ~40 s Megatron import)."""
    top, *rest = module.split(".")
    spec = importlib.util.find_spec(top)  # the top package only: its submodules' specs would import their parents
    for base in (spec.submodule_search_locations or []) if spec is not None else []:
        for candidate in (Path(base, *rest).with_suffix(".py"), Path(base, *rest, "__init__.py")):
            if candidate.is_file():
                return ast.parse(candidate.read_text())
    raise ImportError(f"{module}: not installed")


def _reads(module: str, function: str, var: str, seen: set[tuple[str, str]]) -> set[str]:
    """Attributes of ``var`` that ``function`` reads (``var.x``, ``getattr(var, "x", ...)``), and those of the
    functions of the same module it passes ``var`` to."""
    if (function, var) in seen:
        return set()
    seen.add((function, var))
    tree = _module_tree(module)
    node = _function(tree, function)
    if node is None:
        raise LookupError(f"{module}.{function}: not found; the tokenizer build path of this Megatron-Bridge moved")
    found: set[str] = set()
    for sub in ast.walk(node):
        if (
            isinstance(sub, ast.Attribute)
            and isinstance(sub.value, ast.Name)
            and sub.value.id == var
            and isinstance(sub.ctx, ast.Load)
        ):
            found.add(sub.attr)
        elif isinstance(sub, ast.Call) and isinstance(sub.func, ast.Name):
            args = sub.args
            if sub.func.id == "getattr" and len(args) >= 2 and isinstance(args[0], ast.Name) and args[0].id == var:
                if isinstance(args[1], ast.Constant) and isinstance(args[1].value, str):
                    found.add(args[1].value)
                continue
            callee = _function(tree, sub.func.id)
            if callee is None:
                continue
            params = [a.arg for a in callee.args.args]
            for index, arg in enumerate(args):
                if isinstance(arg, ast.Name) and arg.id == var and index < len(params):
                    found |= _reads(module, sub.func.id, params[index], seen)
    return found


@functools.lru_cache(maxsize=1)
def build_reads() -> frozenset[str]:
    """Every attribute of the tokenizer config the launch's tokenizer build reads (:data:`BUILD_PATH`)."""
    out: set[str] = set()
    for module, function, var in BUILD_PATH:
        out |= _reads(module, function, var, set())
    return frozenset(out)


def token_fields() -> tuple[str, ...]:
    """The tokenizer config fields that shape the tokens (:func:`build_reads` less :data:`VOCAB_PADDING`)."""
    return tuple(sorted(build_reads() - VOCAB_PADDING))


def _jsonable(value: Any) -> Any:
    return json.loads(json.dumps(value, sort_keys=True, default=str))


def _effective_template(config: Any) -> str | None:
    """The chat template the build hands the tokenizer: ``chat_template``, or the file ``chat_template_path``
    names, read by Megatron-Bridge's own ``_resolve_chat_template``."""
    from megatron.bridge.training.tokenizers.tokenizer import _resolve_chat_template

    from mbridge_seqpack.digests import note_read

    if getattr(config, "chat_template_path", None) is not None:
        note_read(str(config.chat_template_path))  # a verdict comparing it is re-made when the file changes
    return _resolve_chat_template(config)


def tokenizer_settings(config: Any) -> dict[str, Any]:
    """Every :func:`token_fields` value of ``config`` (a ``TokenizerConfig``) as JSON values; ``chat_template`` is
    the sha256 of the effective template (the text itself can be long), or a sentence when it cannot be read."""
    settings = {name: _jsonable(getattr(config, name, None)) for name in token_fields()}
    if "chat_template" in settings:
        try:
            template = _effective_template(config)
        except (OSError, ValueError, UnicodeDecodeError) as exc:
            settings["chat_template"] = f"unreadable ({type(exc).__name__}: {str(exc)[:120]})"
        else:
            settings["chat_template"] = (
                None if template is None else "sha256:" + hashlib.sha256(template.encode()).hexdigest()
            )
    return settings


def default_tokenizer_config(directory: str | Path) -> Any:
    """The config a pack without ``--recipe`` is tokenized with: Megatron-Bridge's defaults over a Hugging Face
    directory."""
    from megatron.bridge.training.tokenizers.config import TokenizerConfig

    return TokenizerConfig(tokenizer_type="HuggingFaceTokenizer", tokenizer_model=str(directory))


def for_directory(config: Any, directory: str | Path) -> Any:
    """A copy of the launch's ``config`` reading the tokenizer at ``directory`` (the same folder, as an absolute
    path for workers); the attributes as the config holds them (overrides applied after construction kept)."""
    out = copy.copy(config)
    out.tokenizer_model = str(directory)
    return out


def sealed_settings(directory: str | Path, config: Any = None) -> str:
    """The fingerprint's ``tokenizer_settings``: canonical JSON of :func:`tokenizer_settings` of the config the pack
    is tokenized with (``config`` over ``directory``, or the defaults)."""
    built = default_tokenizer_config(directory) if config is None else for_directory(config, directory)
    return json.dumps(tokenizer_settings(built), sort_keys=True)


def settings_differences(packed: dict[str, Any], configured: dict[str, Any]) -> dict[str, tuple[Any, Any]]:
    """{field: (pack's value, config's value)} of every compared field that differs (a field one side lacks: a pack
    of another Megatron-Bridge, compared as None)."""
    keys = (set(packed) | set(configured)) - set(NOT_COMPARED)
    return {
        key: (packed.get(key), configured.get(key)) for key in sorted(keys) if packed.get(key) != configured.get(key)
    }
