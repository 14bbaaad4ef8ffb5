"""GPT SFT datasets: the row widths its collate makes and the ``dataset_kwargs`` it accepts, and the values the
legacy prompt-template path refuses: the template must end with the label placeholder and name the truncation fields,
and the truncation method must be one the dataset knows. Megatron-Bridge's own checks run
(``GPTSFTDataset._maybe_validate_prompt_template``, ``GPTSFTDataset._truncation``) on a bare dataset holding the
config's values, with the defaults read from its builder."""

from __future__ import annotations

import ast
import difflib
import inspect
import math
import re
from functools import lru_cache
from typing import Any

from mbridge_seqpack.analysis.topology import round_up
from mbridge_seqpack.errors import ERROR, Violation
from mbridge_seqpack.rules.context import DATASET_KWARGS_READS, TOPOLOGY_READS, RuleContext
from mbridge_seqpack.rules.field_types import BOOL, OPTIONAL_STR, POSITIVE_INT
from mbridge_seqpack.rules.registry import rule
from mbridge_seqpack.rules.row_widths import GPT_SFT_ROW_MULTIPLE, ROW_MULT, _alignment_fields, _pad_seq_length_to_mult


@rule(
    "gpt_sft.row_width_alignment",
    "Unpacked GPT SFT rows must be divisible by lcm(2*CP if CP>1, CP*TP if SP): dataset_kwargs"
    "['pad_seq_length_to_mult'] for variable-width rows, and the seq_length a truncated row is cut to.",
    severity=ERROR,
    evidence=(
        "data/datasets/gpt_sft.py GPTSFTDataset.collate_fn pads each batch to min(max_seq_length, "
        "ceil(longest, pad_seq_length_to_mult)) (GPTSFTChatDataset: max(16, pad_seq_length_to_mult)); nothing in "
        "0.6.2 ties that multiple to CP or TP (NVIDIA-NeMo/Megatron-Bridge#2642: CP=16 needs 32). "
        "megatron/core/utils.py get_batch_on_this_cp_rank views each row as 2*CP chunks and "
        "tensor_parallel/mappings.py _split_along_first_dim asserts divisibility by TP under SP."
    ),
    reads={
        **TOPOLOGY_READS,
        **DATASET_KWARGS_READS,
        "dataset.enable_offline_packing": BOOL,
        "dataset.seq_length": POSITIVE_INT,
    },
)
def gpt_sft_row_width_alignment(ctx: RuleContext) -> list[Violation] | None:
    need = ctx.topology.row_alignment
    if not ctx.dataset_is("gpt_sft") or ctx.offline_packing or ctx.in_batch_packing or need == 1:
        return None
    fields: dict[str, object] = {}
    fix: dict[str, object] = {}
    seq = getattr(ctx.dataset, "seq_length", None)
    two_cp = 2 * ctx.topology.cp if ctx.topology.cp > 1 else 1
    if isinstance(seq, int) and seq % need and seq % two_cp == 0:  # cp.seq_length_divisible reports the rest
        fields["dataset.seq_length"] = seq
        fix.update({"dataset.seq_length": round_up(seq, need), "model.seq_length": round_up(seq, need)})
    if not ctx.pad_to_max_length:
        mult = _pad_seq_length_to_mult(ctx)
        kwargs = getattr(ctx.dataset, "dataset_kwargs", None) or {}
        effective = max(GPT_SFT_ROW_MULTIPLE, mult) if kwargs.get("chat") else mult
        if effective % need:
            fields[ROW_MULT] = mult
            fix[ROW_MULT] = math.lcm(effective, need)
    if not fields:
        return []
    return [
        Violation(
            {**fields, ctx.pad_to_max_length_path: ctx.pad_to_max_length, **_alignment_fields(ctx)},
            "each batch is as wide as its longest row rounded up to pad_seq_length_to_mult (at most seq_length), "
            f"then split across CP ranks and, with sequence parallelism, TP ranks, so it must be a multiple of {need}",
            assignments=fix,
        )
    ]


@rule(
    "gpt_sft.dataset_kwargs_accepted",
    "dataset.dataset_kwargs of a GPT SFT dataset may hold only keyword arguments its dataset class takes, and none "
    "that Megatron-Bridge's builder passes itself.",
    severity=ERROR,
    evidence=(
        "data/builders/gpt_sft.py build_gpt_sft_split pops its own keys from dataset_kwargs and passes the rest as "
        "keyword arguments to GPTSFTDataset / GPTSFTChatDataset, or with offline packing GPTSFTPackedParquetDataset "
        "(which adds return_cu_seqlen): an unknown key raises TypeError 'unexpected keyword argument', a key it "
        "passes itself (seed, max_seq_length, file_path, ...) 'got multiple values for keyword argument'. "
        "chat_template is popped only by data/packing/offline.py tokenize_dataset, which GPTSFTDatasetBuilder.build "
        "runs on rank 0 alone and only when the pack does not exist yet. "
        "GPTSFTDatasetConfig.validate checks neither, and training/setup.py builds the datasets after the model "
        "and optimizer."
    ),
    reads={**DATASET_KWARGS_READS, "dataset.enable_offline_packing": BOOL},
)
def gpt_sft_dataset_kwargs_accepted(ctx: RuleContext) -> list[Violation] | None:
    from mbridge_seqpack.tokenization.dataset_kwargs import (
        DATASET_KWARGS,
        PACKED_BY_BUILDER,
        PACKED_DATASET_KWARGS,
        PASSED_BY_BUILDER,
        POPPED_BY_BUILDER,
    )

    kwargs = getattr(ctx.dataset, "dataset_kwargs", None)
    if not ctx.dataset_is("gpt_sft") or not isinstance(kwargs, dict):
        return None
    packed = ctx.offline_packing
    # chat_template: only the prep pops it (tokenize_dataset), on rank 0 and only when it packs
    taken = {*DATASET_KWARGS, *POPPED_BY_BUILDER, *(PACKED_DATASET_KWARGS if packed else ())} - {"chat_template"}
    passed = {*PASSED_BY_BUILDER, *(PACKED_BY_BUILDER if packed else ())}
    dataset = "GPTSFTPackedParquetDataset" if packed else "GPTSFTDataset"
    found = []
    for key in kwargs:
        if key in taken:
            continue
        path = f"dataset.dataset_kwargs.{key}"
        near = difflib.get_close_matches(str(key), sorted(taken), n=1)
        hint = f" (did you mean {near[0]!r}? set it with ++dataset.dataset_kwargs.{near[0]}=...)" if near else ""
        if key in passed:
            why = f"build_gpt_sft_split passes {key!r} to {dataset} itself, so this is a second value: TypeError"
        elif key == "chat_template":
            why = (
                f"{dataset} takes no keyword 'chat_template' (only rank 0's packing prep pops it from "
                f"dataset_kwargs): TypeError on every other rank, and on rank 0 too once the pack exists"
            )
            hint = " and give the template to the tokenizer: tokenizer.chat_template=..."
        else:
            why = f"{dataset} takes no keyword {key!r}: TypeError"
        found.append(
            Violation(
                {path: kwargs[key]},
                f"{why} when the datasets are built, after the model is on the GPUs",
                fix=f"remove it: ~{path}{hint}",
            )
        )
    return found


KW = "dataset.dataset_kwargs"


@lru_cache(maxsize=1)
def builder_defaults() -> dict[str, Any]:
    """The defaults ``build_gpt_sft_split`` gives popped dataset_kwargs (``options.pop("key", default)``), read from
    its source."""
    from megatron.bridge.data.builders.gpt_sft import build_gpt_sft_split

    found: dict[str, Any] = {}
    for node in ast.walk(ast.parse(inspect.getsource(build_gpt_sft_split))):
        if (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and node.func.attr == "pop"
            and len(node.args) == 2
            and isinstance(node.args[0], ast.Constant)
        ):
            try:
                found[node.args[0].value] = ast.literal_eval(node.args[1])
            except ValueError:
                continue
    return found


def _bare_dataset(kwargs: dict[str, Any]) -> Any:
    """A GPTSFTDataset holding only what its template checks read (the constructor would open the data)."""
    from megatron.bridge.data.datasets.gpt_sft import GPTSFTDataset

    values = {**builder_defaults(), **kwargs}
    dataset = GPTSFTDataset.__new__(GPTSFTDataset)
    dataset.prompt_completion_config = None
    dataset.prompt_template = values["prompt_template"]
    dataset.label_key = values["label_key"]
    field = values["truncation_field"]
    dataset.truncation_fields = field.split(",") if field is not None else []
    dataset.truncation_method = values["truncation_method"]
    return dataset


def _template_fix(kwargs: dict[str, Any], message: str) -> dict[str, Any]:
    """Assignments that satisfy the check that failed: the template cut after (or ended with) the label placeholder,
    or the truncation field set to the template's first key."""
    values = {**builder_defaults(), **kwargs}
    if values["prompt_template"] is None:
        return {f"{KW}.prompt_template": builder_defaults()["prompt_template"]}
    template, label = str(values["prompt_template"]), f"{{{values['label_key']}}}"
    if "must be at the end of prompt_template" in message:
        end = template.rfind(label)
        return {f"{KW}.prompt_template": template[: end + len(label)] if end >= 0 else f"{template} {label}"}
    keys = [k for k in re.findall(r"{(.*?)}", template) if k != values["label_key"]]
    return {f"{KW}.truncation_field": keys[0] if keys else None}


@rule(
    "gpt_sft.prompt_template",
    "A GPT SFT dataset's legacy prompt_template (dataset_kwargs) must end with the label placeholder and name every "
    "truncation field, and truncation_method must be 'left' or 'right'.",
    severity=ERROR,
    evidence=(
        "megatron/bridge/data/datasets/gpt_sft.py GPTSFTDataset.__init__ calls _maybe_validate_prompt_template, which "
        "asserts '{label} must be at the end of prompt_template.' and 'truncation_fields ... must in ...' whenever no "
        "prompt_completion_config is given (preprocessing unset: the legacy dataset_kwargs path; packed splits too, "
        "as GPTSFTPackedDataset extends it): the rank-0 packing prep or the dataset build fails, after the model. "
        "_truncation / _multiple_truncation raise ValueError '<method> is not supported' at the first example that "
        "needs truncation, mid-run. The checks are run on CPU on the config's values; GPTSFTDatasetConfig.validate "
        "checks the keys' presence only."
    ),
    reads={
        **DATASET_KWARGS_READS,
        "dataset.dataset_kwargs['prompt_template']": OPTIONAL_STR,
        "dataset.dataset_kwargs['truncation_field']": OPTIONAL_STR,
        "dataset.dataset_kwargs['truncation_method']": OPTIONAL_STR,
        "dataset.enable_offline_packing": BOOL,
    },
)
def prompt_template(ctx: RuleContext) -> list[Violation] | None:
    from mbridge_seqpack.tokenization.dataset_kwargs import config_dataset_kwargs

    if not ctx.dataset_is("gpt_sft") or not isinstance(
        getattr(ctx.dataset, "dataset_kwargs", None), (dict, type(None))
    ):
        return None
    try:
        kwargs = config_dataset_kwargs(ctx.dataset)
    except (TypeError, ValueError):
        return None  # Megatron-Bridge's own validate() reports it
    if kwargs.get("prompt_completion_config") is not None or (kwargs.get("chat") and not ctx.offline_packing):
        return None  # explicit preprocessing validates itself; the chat dataset has no template
    if not isinstance(kwargs.get("prompt_template", ""), (str, type(None))) or not isinstance(
        kwargs.get("label_key", ""), str
    ):
        return None
    dataset = _bare_dataset(kwargs)
    found = []
    try:
        dataset._maybe_validate_prompt_template()
    except (AssertionError, UnicodeError) as exc:
        shown = {k: kwargs[k] for k in ("prompt_template", "label_key", "truncation_field") if k in kwargs}
        found.append(
            Violation(
                {f"{KW}.{k}": v for k, v in shown.items()} or {f"{KW}.prompt_template": dataset.prompt_template},
                f"GPTSFTDataset asserts '{exc}' when the dataset is built (the packing prep too), after the model",
                assignments=_template_fix(kwargs, str(exc)),
            )
        )
    if not kwargs.get("chat"):
        try:
            dataset._truncation([0, 1], 1)
        except ValueError as exc:
            found.append(
                Violation(
                    {f"{KW}.truncation_method": dataset.truncation_method},
                    f"GPTSFTDataset raises '{exc}' at the first example that needs truncation, mid-run",
                    assignments={f"{KW}.truncation_method": builder_defaults()["truncation_method"]},
                )
            )
    return found
