"""Megatron-Bridge's own GPT SFT datasets, counting what they truncate.

Megatron-Bridge's prep cuts examples longer than ``max_seq_length`` without a word (its workers run with its
logger quiet), so a corpus of long prompts packs into silently shortened examples. ``tokenize_split`` builds the
split with :func:`counting_gpt_sft_split`: Megatron-Bridge's builder, whose dataset object gets a subclass of its
own class that records, per example, how many tokens the truncation removed. Tokens and masks are Megatron-Bridge's
(the subclass adds one key to each example dict and changes nothing else); the classes live at module level so
its tokenizer worker pool can pickle them. Imported only where Megatron-Bridge runs.
"""

from __future__ import annotations

import pickle
from pathlib import Path
from typing import Any

from megatron.bridge.data.builders.gpt_sft import build_gpt_sft_split
from megatron.bridge.data.datasets import gpt_sft

__all__ = ["TRUNCATED_KEY", "counting_gpt_sft_split", "truncated_tokens"]

#: tokens Megatron-Bridge's truncation removed from one example (0: kept whole)
TRUNCATED_KEY = "mbridge_seqpack_truncated_tokens"


def _cut_template(dataset: Any, truncate: Any, template_ids: list[list[int]], keys: list[str]) -> Any:
    """Prompt-template examples: the template pieces before, context and answer after Megatron-Bridge's cut."""
    before = sum(len(ids) for ids in template_ids)
    context_ids, label_ids = truncate(template_ids, keys)
    dataset._truncated_tokens = before - len(context_ids) - len(label_ids)
    return context_ids, label_ids


def _counted(dataset: Any, process: Any, example: dict[str, Any]) -> dict[str, Any]:
    dataset._truncated_tokens = 0
    processed = process(example)
    config = getattr(dataset, "prompt_completion_config", None)
    if config is not None and processed["token_count"] >= dataset.max_seq_length:
        # prompt/completion preprocessing truncates inside one function: only an example that reached the limit
        # can have been cut, and only those are tokenized once more, uncut, to measure it
        whole = gpt_sft.tokenize_prompt_completion_example(
            example,
            dataset.tokenizer,
            config,
            max_length=None,
            skipped_tokens=gpt_sft.extract_skipped_token_ids(dataset.tokenizer),
            allow_missing_completion=dataset.is_test,
            prefix_token_ids=[dataset.tokenizer.eos_id] * dataset.virtual_tokens,
            minimum_completion_length=dataset.tokens_to_generate,
            sep_token_id=getattr(dataset, "sep_id", None),
        )
        dataset._truncated_tokens = int(whole.input_ids.numel()) - processed["token_count"]
    processed[TRUNCATED_KEY] = dataset._truncated_tokens
    return processed


# single inheritance: the instance layout stays Megatron-Bridge's, so the dataset object's class can be swapped


class CountingGPTSFTDataset(gpt_sft.GPTSFTDataset):
    """``GPTSFTDataset`` that records its truncation."""

    def _multiple_truncation(self, template_ids: list[list[int]], keys: list[str]) -> Any:
        return _cut_template(self, super()._multiple_truncation, template_ids, keys)

    def _process_example(self, example: dict[str, Any]) -> dict[str, Any]:
        return _counted(self, super()._process_example, example)


class CountingGPTSFTChatDataset(gpt_sft.GPTSFTChatDataset):
    """``GPTSFTChatDataset`` (its chat records are not truncated at prep: longer ones are dropped later)."""

    def _process_example(self, example: dict[str, Any]) -> dict[str, Any]:
        return _counted(self, super()._process_example, example)


_COUNTING = {gpt_sft.GPTSFTDataset: CountingGPTSFTDataset, gpt_sft.GPTSFTChatDataset: CountingGPTSFTChatDataset}


def counting_gpt_sft_split(
    *args: Any,
    batched: bool = False,
    refusals: list[str] | None = None,
    assembly: Any = None,
    **kwargs: Any,
) -> Any:
    """Megatron-Bridge's ``build_gpt_sft_split``; its dataset counts truncation when it is one of the two classes
    above (another class is left as it is, and its examples report nothing). ``batched``: its template pieces are
    encoded in one call (batched_tokens.py); why not, when that does not apply, goes to ``refusals``. With
    ``assembly`` (an ``AssemblyRequest``; batched only), the examples are assembled in arrays (assembly.py)
    and what is returned holds only those left to Megatron-Bridge's code."""
    try:
        dataset = build_gpt_sft_split(*args, **kwargs)
    except (EOFError, pickle.UnpicklingError) as exc:
        raise _damaged_index(args[0] if args else kwargs.get("path"), exc) from None
    if dataset is None:
        return None
    counting = _COUNTING.get(type(dataset))
    if counting is not None:
        dataset.__class__ = counting
    if batched:
        from mbridge_seqpack.tokenization.batched_tokens import batch_tokenize

        batch = batch_tokenize(dataset)
        if batch.refusal is not None and refusals is not None:
            refusals.append(batch.refusal)
        if assembly is not None:
            return assembly.build(dataset, batch)
    return dataset


def _damaged_index(path: Any, exc: BaseException) -> Exception:
    """Megatron-Bridge's JSONL index of ``path`` (``<file>.idx.npy`` / ``.idx.info`` under ``index_mapping_dir``,
    data/datasets/utils.py _JSONLMemMapDataset) could not be read back: its pickled info is cut short, as a disk
    that fills up while it is written leaves it, and ``safe_pickle_load`` raises EOFError. The machine's resource,
    not the plugin: exit 2, naming where."""
    from mbridge_seqpack.errors import InputError

    where = Path(str(path)).parent if path is not None else "the index directory"
    return InputError(
        f"Megatron-Bridge could not read back the index it wrote for {path} ({type(exc).__name__}: "
        f"{exc or 'the file ends early'}): the disk holding {where} is most likely full; free space there and run "
        "again"
    )


def truncated_tokens(item: dict[str, Any]) -> int:
    """Tokens removed from one materialized example (0 when not counted)."""
    return int(item.get(TRUNCATED_KEY, 0) or 0)
