"""The user's data in place of a recipe's default source.

Megatron-Bridge 0.6.2's SFT recipes read a Hugging Face dataset (``dataset.hf_dataset``: SQuAD, Tulu 3, ...), and
its ``GPTSFTDatasetConfig.validate()`` takes exactly one source (data/builders/gpt_sft.py: "Exactly one text-only SFT
source must be set: dataset_root or hf_dataset", and "Hugging Face split and materialization settings require
hf_dataset, not dataset_root"). So ``dataset.dataset_root=DIR`` on such a recipe is a second source that its launch
refuses. When the user names a local root and no Hugging Face setting, ``pack`` drops the recipe's Hugging Face
source with overrides Megatron-Bridge's own parser applies, says so in one line, and the same overrides are what the
launch takes. Naming both is refused (exit 2) with the two fields.
"""

from __future__ import annotations

from typing import Any, Sequence

from mbridge_seqpack.errors import UsageError

__all__ = ["HF_SOURCE_FIELDS", "source_overrides"]

#: the GPTSFTDatasetConfig fields of a Hugging Face source (validate() refuses any of them beside dataset_root)
HF_SOURCE_FIELDS = (
    "hf_dataset",
    "hf_validation_dataset",
    "hf_test_dataset",
    "hf_output_root",
    "hf_validation_proportion",
)


def _keys(overrides: Sequence[str]) -> dict[str, str]:
    """``dataset.dataset_root`` -> the override that sets it (the last one), deletions left out."""
    found: dict[str, str] = {}
    for text in overrides:
        key = text.split("=", 1)[0]
        if key.startswith("~"):
            continue
        found[key.lstrip("+")] = text
    return found


def _source_name(source: Any) -> str:
    name = getattr(source, "dataset_name", None) or getattr(source, "path_or_dataset", None)
    return repr(name) if name else type(source).__name__


def source_overrides(built: Any, overrides: Sequence[str]) -> tuple[list[str], str | None]:
    """The overrides that drop ``built``'s Hugging Face source when ``overrides`` name a local ``dataset_root`` (to go
    before the user's), and the line that says so; ``([], None)`` when nothing is replaced. Both named: exit 2."""
    dataset = getattr(built, "dataset", None)
    keys = _keys(overrides)
    root = keys.get("dataset.dataset_root")
    if root is None or getattr(dataset, "hf_dataset", None) is None:
        return [], None
    hf_fields = (*HF_SOURCE_FIELDS, "hf_rewrite")
    named_hf = [key for key in keys if key.startswith("dataset.") and key.split(".")[1] in hf_fields]
    if named_hf:
        raise UsageError(
            f"two data sources: {root} and {keys[named_hf[0]]}; Megatron-Bridge's GPTSFTDatasetConfig takes exactly "
            "one (dataset_root or hf_dataset): drop one of them"
        )
    drops = [f"dataset.{name}=null" for name in HF_SOURCE_FIELDS if getattr(dataset, name, None) is not None]
    if getattr(dataset, "hf_rewrite", False):
        drops.append("dataset.hf_rewrite=false")
    note = (
        f"{root} replaces the recipe's default data source (dataset.hf_dataset {_source_name(dataset.hf_dataset)}, "
        f"Megatron-Bridge takes one source); launch with these before yours: {' '.join(drops)}"
    )
    return drops, note
