"""GPT SFT ``dataset_kwargs`` values the legacy prompt-template path refuses: the template must end with the label
placeholder and name the truncation fields, and the truncation method must be one the dataset knows. Megatron-Bridge's
own checks run (``GPTSFTDataset._maybe_validate_prompt_template``, ``GPTSFTDataset._truncation``) on a bare dataset
holding the config's values, with the defaults read from its builder."""

from __future__ import annotations

import ast
import inspect
import re
from functools import lru_cache
from typing import Any

from mbridge_seqpack.errors import ERROR, Violation
from mbridge_seqpack.rules.context import RuleContext
from mbridge_seqpack.rules.registry import rule

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
)
def prompt_template(ctx: RuleContext) -> list[Violation] | None:
    from mbridge_seqpack.packing.dataset_kwargs import config_dataset_kwargs

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
