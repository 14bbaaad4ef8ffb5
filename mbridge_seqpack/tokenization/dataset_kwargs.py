"""The ``dataset_kwargs`` Megatron-Bridge 0.6.2's GPT SFT prep accepts, checked before it sees them.

``data/builders/gpt_sft.py`` ``build_gpt_sft_split`` pops its own keys and hands the rest to ``GPTSFTDataset``
(or ``GPTSFTChatDataset``) as keyword arguments, and ``data/packing/offline.py`` ``tokenize_dataset`` pops
``chat_template``: an unknown key is a ``TypeError`` deep inside the dataset, a wrongly typed one an
``AssertionError`` or a ``KeyError``. ``tests/tokenization/test_dataset_kwargs.py`` keeps this table equal to what the
installed code reads.
"""

from __future__ import annotations

import difflib
import re
from typing import Any

from mbridge_seqpack.errors import InputError

__all__ = [
    "template_fields",
    "DATASET_KWARGS",
    "MANAGED",
    "PACKED_BY_BUILDER",
    "PACKED_DATASET_KWARGS",
    "PASSED_BY_BUILDER",
    "POPPED_BY_BUILDER",
    "CHAT_PREPROCESSING",
    "chat_preprocessing_overrides",
    "check_config_dataset_kwargs",
    "check_dataset_kwargs",
    "check_prompt_template",
    "config_dataset_kwargs",
    "content_kwargs",
]

BOOL, INT, STR, MAPPING, TEXT_OR_MAPPING = "a boolean", "an integer", "a string", "an object", "a string or an object"

#: every key a user may set, with the JSON type Megatron-Bridge's code expects
DATASET_KWARGS: dict[str, str] = {
    # popped by build_gpt_sft_split
    "chat": BOOL,
    "use_hf_tokenizer_chat_template": BOOL,
    "chat_loss_mode": STR,
    "tool_schemas": TEXT_OR_MAPPING,
    "hf_dataset": BOOL,
    "global_sample_mapping": BOOL,
    "add_bos": BOOL,
    "add_eos": BOOL,
    "add_sep": BOOL,
    "label_key": STR,
    "answer_only_loss": BOOL,
    "truncation_field": STR,
    "pad_to_max_length": BOOL,
    "prompt_template": STR,
    "truncation_method": STR,
    "get_attention_mask_from_fusion": BOOL,
    # popped by tokenize_dataset
    "chat_template": STR,
    # passed through to GPTSFTDataset.__init__
    "min_seq_length": INT,
    "pad_seq_length_to_mult": INT,
    "sep_id": INT,
    "max_num_samples": INT,
    "virtual_tokens": INT,
    "tokens_to_generate": INT,
    "special_tokens": MAPPING,
    "output_original_text": BOOL,
    "ceil_to_power_2": BOOL,
}

#: keys the prep sets itself (from the pack's own options), so a user value would be overridden or clash
MANAGED = {
    "file_path": "the input file",
    "tokenizer": "--tokenizer",
    "max_seq_length": "--pack-size (or --max-seq-length)",
    "seed": "--seed",
    "memmap_workers": "the prep",
    "index_mapping_dir": "the prep (a private directory)",
    "is_test": "the prep",
    "prompt_completion_config": "dataset.preprocessing on the recipe (not JSON)",
}

_MAY_BE_ZERO = {"sep_id", "virtual_tokens", "tokens_to_generate"}
_CHOICES = {"truncation_method": ("left", "right"), "chat_loss_mode": ("assistant", "last_turn", "full")}


def _is(kind: str, value: Any) -> bool:
    if kind == BOOL:
        return isinstance(value, bool)
    if kind == INT:
        return isinstance(value, int) and not isinstance(value, bool)
    if kind == STR:
        return isinstance(value, str)
    if kind == MAPPING:
        return isinstance(value, dict) and all(isinstance(k, str) and isinstance(v, str) for k, v in value.items())
    return isinstance(value, (str, dict))


def check_dataset_kwargs(kwargs: dict[str, Any], source: str = "--dataset-kwargs") -> None:
    """Refuse unknown, managed and wrongly typed keys with the key, the value and the fix."""
    for key, value in kwargs.items():
        if key in MANAGED:
            raise InputError(f"{source}: {key!r} is set by {MANAGED[key]}; remove it from {source}")
        if key not in DATASET_KWARGS:
            near = difflib.get_close_matches(key, [*DATASET_KWARGS, *MANAGED], n=1)
            hint = f" (did you mean {near[0]!r}?)" if near else ""
            raise InputError(
                f"{source}: unknown key {key!r}{hint}; Megatron-Bridge's GPT SFT dataset takes "
                f"{', '.join(sorted(DATASET_KWARGS))}"
            )
        kind = DATASET_KWARGS[key]
        if value is not None and not _is(kind, value):
            raise InputError(f"{source}: {key!r} must be {kind}, got {type(value).__name__} {value!r:.60}")
        if key in _CHOICES and value not in _CHOICES[key]:
            raise InputError(f"{source}: {key!r} must be one of {', '.join(_CHOICES[key])}, got {value!r}")
        least = 0 if key in _MAY_BE_ZERO else 1
        if kind == INT and value is not None and value < least:
            raise InputError(f"{source}: {key!r} must be an integer >= {least}, got {value}")
    if kwargs.get("add_sep") and kwargs.get("sep_id") is None:
        # GPTSFTDataset._process_example appends self.sep_id, None unless given: a None token id, which
        # Megatron-Bridge's prep (and every later step) fails on
        fix = f"++{source}.sep_id=<token id>" if source.startswith("dataset.") else '"sep_id": <token id>'
        raise InputError(f"{source}: 'add_sep' is true but no 'sep_id' is given; add {fix}")


def check_prompt_template(kwargs: dict[str, Any], source: str = "--dataset-kwargs") -> None:
    """What Megatron-Bridge's ``GPTSFTDataset._maybe_validate_prompt_template`` asserts of a prompt/answer
    template (data/datasets/gpt_sft.py), before its prep: it ends with the label_key's field, and the truncation
    fields are fields of it. Chat records and a prompt/completion preprocessing take no template."""
    import re

    if kwargs.get("chat") or kwargs.get("prompt_completion_config") is not None:
        return
    template = kwargs.get("prompt_template", CONTENT_DEFAULTS["prompt_template"])
    if not isinstance(template, str):
        raise InputError(
            f"{source}: 'prompt_template' must be a string such as \"{{input}} {{output}}\", got {template!r}"
        )
    label = kwargs.get("label_key", CONTENT_DEFAULTS["label_key"])
    try:
        unescaped = template.encode("utf-8").decode("unicode_escape")  # as Megatron-Bridge reads it
    except UnicodeDecodeError as exc:
        raise InputError(f"{source}: 'prompt_template' {template!r}: a broken escape ({exc.reason})") from None
    if not unescaped.endswith(f"{{{label}}}"):
        raise InputError(
            f"{source}: 'prompt_template' {template!r} must end with {{{label}}} (the answer field, label_key "
            f'{label!r}; Megatron-Bridge\'s GPT SFT dataset asserts it), e.g. "{{input}} {{{label}}}"'
        )
    fields = re.findall(r"{(.*?)}", unescaped)
    truncation = kwargs.get("truncation_field", CONTENT_DEFAULTS["truncation_field"])
    wanted = truncation.split(",") if truncation is not None else []
    if wanted and fields and fields[0] == "input" and wanted[0] == "context":  # its legacy spelling, mapped
        wanted[0] = "input"
    unknown = [name for name in wanted if name not in fields]
    if unknown:
        raise InputError(
            f"{source}: 'truncation_field' {truncation!r} names {', '.join(map(repr, unknown))}, not a field of "
            f"'prompt_template' {template!r} (fields: {', '.join(fields)}); Megatron-Bridge's GPT SFT dataset "
            "asserts it"
        )


#: managed keys that ``build_gpt_sft_split`` pops from a config's dataset_kwargs (a recipe may set them)
POPPED_BY_BUILDER = ("index_mapping_dir", "prompt_completion_config")
#: managed keys ``build_gpt_sft_split`` passes every split itself: one in dataset_kwargs is a second value
PASSED_BY_BUILDER = tuple(key for key in MANAGED if key not in POPPED_BY_BUILDER)
#: keyword arguments of GPTSFTPackedDataset.__init__ a packed split takes from dataset_kwargs
PACKED_DATASET_KWARGS = ("return_cu_seqlen",)
#: what ``build_gpt_sft_split`` passes a packed split itself, besides what it passes every split
PACKED_BY_BUILDER = ("pad_cu_seqlens", "pad_seq_to_mult", "pack_metadata_file_path")


def check_config_dataset_kwargs(kwargs: dict[str, Any]) -> None:
    """A recipe's dataset_kwargs (``dataset.preprocessing`` folded in), checked as ``--dataset-kwargs`` is: an
    unknown or wrongly typed key fails deep inside Megatron-Bridge's prep, and a key its builder passes itself
    (``seed``, ``max_seq_length``...) is a second value for that keyword, a ``TypeError`` there."""
    source = "dataset.dataset_kwargs"
    for key in kwargs:
        if key in PASSED_BY_BUILDER:
            raise InputError(
                f"{source}: {key!r} is passed by Megatron-Bridge's build_gpt_sft_split itself, so a second value "
                f"is a TypeError there; remove it: ~{source}.{key}"
            )
    check_dataset_kwargs({key: value for key, value in kwargs.items() if key not in MANAGED}, source)


def config_dataset_kwargs(dataset: Any) -> dict[str, Any]:
    """The dataset_kwargs Megatron-Bridge's own prep uses for a dataset config: ``dataset.preprocessing`` (chat or
    prompt/completion) folded in by its ``normalize_gpt_sft_dataset_kwargs``, as ``GPTSFTDatasetBuilder`` does."""
    from megatron.bridge.data.builders.gpt_sft import GPTSFTDatasetConfig, normalize_gpt_sft_dataset_kwargs

    if isinstance(dataset, GPTSFTDatasetConfig):
        return normalize_gpt_sft_dataset_kwargs(dataset)
    return dict(getattr(dataset, "dataset_kwargs", None) or {})


#: what build_gpt_sft_split / GPTSFTDataset use when a key is absent, for the keys that change the tokens and
#: loss masks a pack holds (collate-only keys such as pad_to_max_length do not)
CONTENT_DEFAULTS: dict[str, Any] = {
    "chat": False,
    "use_hf_tokenizer_chat_template": False,
    "chat_loss_mode": "assistant",
    "tool_schemas": None,
    "chat_template": None,
    "add_bos": False,
    "add_eos": True,
    "add_sep": False,
    "sep_id": None,
    "label_key": "output",
    "answer_only_loss": True,
    "truncation_field": "input",
    "prompt_template": "{input} {output}",
    "truncation_method": "right",
    "special_tokens": None,
    "prompt_completion_config": None,
    "min_seq_length": 1,
    "max_num_samples": None,
}


def content_kwargs(kwargs: dict[str, Any]) -> dict[str, str]:
    """The content-changing keys with Megatron-Bridge's defaults filled in, as comparable strings."""
    import json

    merged = {**CONTENT_DEFAULTS, **kwargs}
    return {key: json.dumps(merged.get(key), sort_keys=True, default=str) for key in CONTENT_DEFAULTS}


#: Megatron-Bridge's chat preprocessing (data/sft_processing.py), as its override parser instantiates it
CHAT_PREPROCESSING = "megatron.bridge.data.builders.ChatSFTPreprocessingConfig"


def chat_preprocessing_overrides(loss_mode: str | None = None) -> list[str]:
    """The overrides that make a recipe read chat records through the tokenizer's chat template, the way
    Megatron-Bridge 0.6.2 asks (``dataset.preprocessing``; ``dataset_kwargs.chat`` is deprecated there). Set to null
    first: its parser merges a mapping into a preprocessing already set and keeps the old class."""
    mode = f",loss_mode:{loss_mode}" if loss_mode else ""
    return ["dataset.preprocessing=null", f"dataset.preprocessing={{_target_:{CHAT_PREPROCESSING}{mode}}}"]


_FIELD = re.compile(r"{(\w+)}")


def template_fields(dataset_kwargs: dict[str, Any]) -> list[str]:
    """The JSONL fields Megatron-Bridge's prompt template reads (``{input} {output}`` by default)."""
    return _FIELD.findall(str(dataset_kwargs.get("prompt_template", "{input} {output}")))
