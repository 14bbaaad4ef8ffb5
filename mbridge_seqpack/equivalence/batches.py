"""The check's micro batches, packed and unpacked, built by Megatron-Bridge's own code.

Offline packs: each sample is pre-padded as the prep pads it for ``pad_seq_to_mult`` (data/packing/offline.py
``_pre_pad_data_point``), binned and filled by data/packing/algorithms.py (``create_hist``,
``create_packing_strategy``, ``fill_packing_strategy``), and collated by data/packing/gpt_sft.py
``GPTSFTPackedDataset.collate_fn`` with the config's ``pad_seq_to_mult``, ``pad_cu_seqlens``, row width and loss
settings. Unpacked, each sample is one row of data/datasets/gpt_sft.py ``GPTSFTDataset.collate_fn`` (the chat
dataset's for chat data). In-batch packing: data/collators/sft.py ``_build_text_sft_batch`` with and without
``enable_in_batch_packing`` (``build_mcore_thd_sequence_batch_from_rows`` with the multiple ``validate`` sets), one
micro batch of ``micro_batch_size`` samples at a time.

The step's batch handling is then Megatron-Bridge's: training/gpt_step.py ``_packed_metadata_for_forward`` and
training/utils/packed_seq_utils.py ``get_packed_seq_params`` (at CP 1 ``get_batch_on_this_cp_rank`` returns the
batch as it is). Dataset objects are made with ``__new__`` and given only the attributes their collate reads (no
files, no tokenizer): the collate code is Megatron-Bridge's, unchanged.
"""

from __future__ import annotations

import contextlib
import io
import math
from dataclasses import dataclass, field
from typing import Any

import torch

from mbridge_seqpack.equivalence.sequences import EOS, PAD, Sample, samples_of
from mbridge_seqpack.equivalence.setup import Setup

__all__ = ["Placed", "Run", "packed_run", "unpacked_run", "width_of"]


@dataclass(frozen=True)
class Placed:
    """Where one sample's input positions are: micro batch, row, first position, count."""

    micro: int
    row: int
    start: int
    inputs: int


@dataclass
class Run:
    """Micro batches as the model gets them (tokens, labels, loss_mask, position_ids [rows, width]), their packed
    parameters (None unpacked), and where each sample is."""

    batches: list[dict[str, Any]]
    params: list[Any]
    placed: list[Placed] = field(default_factory=list)

    def real(self, micro: int) -> torch.Tensor:
        """[rows, width] True at the positions of a sample's input tokens (everything else is padding)."""
        tokens = self.batches[micro]["tokens"]
        mask = torch.zeros(tokens.shape, dtype=torch.bool)
        for p in self.placed:
            if p.micro == micro:
                mask[p.row, p.start : p.start + p.inputs] = True
        return mask


class _Tokenizer:
    """What the collates read of a tokenizer: the EOS id (``eos_id``, ``eod``) and the pad id."""

    eos_id = EOS
    eod = EOS
    pad_token_id = PAD


def _ceil(n: int, m: int) -> int:
    return -(-n // m) * m


def width_of(setup: Setup) -> int:
    """A pack width that holds every sample after alignment padding and leaves a tail of row padding."""
    mult = max(1, setup.pad_seq_to_mult)
    used = sum(_ceil(len(s.ids), mult) for s in samples_of(setup.chat))
    return _ceil(used + 3, math.lcm(16, mult, max(1, setup.row_mult)))


def _example(sample: Sample, chat: bool) -> dict[str, Any]:
    """The processed example the dataset yields (``_process_example``): a prompt / answer dataset's carries
    ``answer_start_idx`` (the answer runs from there); a chat dataset's its ``loss_mask`` (as
    ``_chat_preprocess`` returns it)."""
    ids = list(sample.ids)
    first = sample.answer.index(1)
    example: dict[str, Any] = {
        "input_ids": ids,
        "context_ids": ids[:first],
        "answer_ids": ids[first:],
        "context_length": first,
        "metadata": {},
        "token_count": len(ids),
    }
    if chat:
        example["loss_mask"] = [int(a) for a in sample.answer]
    else:
        example["answer_start_idx"] = first
    return example


def _packed_rows(setup: Setup, width: int) -> tuple[list[dict[str, Any]], dict[str, int], list[int]]:
    """Megatron-Bridge's prep over the samples: pre-padded, binned and filled into packed rows; the pack
    metadata; and, per packed row, the sample indices in their order."""
    import numpy as np
    from megatron.bridge.data.packing.algorithms import create_hist, create_packing_strategy, fill_packing_strategy
    from megatron.bridge.data.packing.offline import _pre_pad_data_point

    items = []
    samples = samples_of(setup.chat)
    for sample in samples:
        item = _example(sample, setup.chat)
        if setup.pad_seq_to_mult > 1:
            target = min(_ceil(sample.inputs, setup.pad_seq_to_mult), width) + 1
            _pre_pad_data_point(item, width, target, EOS)
        items.append(item)
    state = np.random.get_state()
    np.random.seed(0)
    try:
        with contextlib.redirect_stderr(io.StringIO()):  # tqdm's progress bars
            sequences, histogram = create_hist(np.array(items), width)
            assignments, metadata = create_packing_strategy(histogram, width, "first_fit_shuffle")
            rows = fill_packing_strategy(assignments, sequences, width, EOS)
    finally:
        np.random.set_state(state)
    firsts = {s.ids[0]: i for i, s in enumerate(samples)}
    order = [[firsts[row["input_ids"][start]] for start in row["seq_start_id"]] for row in rows]
    return rows, metadata, order


def _packed_dataset(setup: Setup, width: int, metadata: dict[str, int]) -> Any:
    from megatron.bridge.data.packing.gpt_sft import GPTSFTPackedDataset

    dataset = GPTSFTPackedDataset.__new__(GPTSFTPackedDataset)
    dataset.tokenizer = _Tokenizer()
    dataset.pad_to_max_length = setup.fixed_width
    dataset.max_seq_length = width
    dataset.pad_seq_length_to_mult = setup.row_mult
    dataset.ceil_to_power_2 = False
    dataset._pad_seq_to_mult = setup.pad_seq_to_mult
    dataset.pad_cu_seqlens = setup.pad_cu_seqlens
    dataset.answer_only_loss = setup.answer_only_loss
    dataset.return_cu_seqlen = True
    dataset.pack_metadata = [metadata]
    return dataset


def _unpacked_dataset(setup: Setup, width: int) -> Any:
    from megatron.bridge.data.datasets.gpt_sft import GPTSFTChatDataset, GPTSFTDataset

    dataset = (GPTSFTChatDataset if setup.chat else GPTSFTDataset).__new__(
        GPTSFTChatDataset if setup.chat else GPTSFTDataset
    )
    dataset.tokenizer = _Tokenizer()
    dataset.pad_to_max_length = False
    dataset.max_seq_length = width
    dataset.pad_seq_length_to_mult = math.lcm(max(1, setup.row_mult), _cp_multiple(setup))
    dataset.ceil_to_power_2 = False
    dataset.tokens_to_generate = 0
    dataset.get_attention_mask_from_fusion = True
    dataset.answer_only_loss = setup.answer_only_loss
    return dataset


def _cp_multiple(setup: Setup) -> int:
    """Unpacked rows at CP > 1 are padded to a multiple of 2*CP: Megatron-Core's per-sequence split
    (``_get_batch_on_this_cp_rank_per_sequence_balancing``) views each row as 2*CP equal chunks."""
    return 2 * setup.cp if setup.cp > 1 else 1


def _step_view(batch: dict[str, Any]) -> tuple[dict[str, Any], Any]:
    """The step's packed handling at CP 1: the metadata ``get_batch`` forwards and the ``PackedSeqParams`` the
    model gets (None for an unpacked batch)."""
    from megatron.bridge.training.gpt_step import _packed_metadata_for_forward
    from megatron.bridge.training.utils.packed_seq_utils import get_packed_seq_params

    metadata = _packed_metadata_for_forward(batch)
    return batch, (get_packed_seq_params(metadata) if metadata is not None else None)


def _offline_packed(setup: Setup) -> Run:
    width = width_of(setup)
    rows, metadata, order = _packed_rows(setup, width)
    samples = samples_of(setup.chat)
    dataset = _packed_dataset(setup, width, metadata)
    run = Run([], [])
    placed: dict[int, Placed] = {}
    for micro, row in enumerate(rows):
        item = {
            "input_ids": row["input_ids"],
            "seq_boundaries": row["seq_start_id"] + [len(row["input_ids"])],
            "loss_mask": row["loss_mask"],
        }
        batch, params = _step_view(dataset.collate_fn([item]))
        run.batches.append(batch)
        run.params.append(params)
        bounds = item["seq_boundaries"]
        start = 0
        for k, index in enumerate(order[micro]):
            placed[index] = Placed(micro, 0, start, samples[index].inputs)
            start += bounds[k + 1] - bounds[k] - 1
    run.placed = [placed[i] for i in range(len(samples))]
    return run


def _offline_unpacked(setup: Setup) -> Run:
    width = width_of(setup)
    dataset = _unpacked_dataset(setup, width)
    run = Run([], [])
    for index, sample in enumerate(samples_of(setup.chat)):
        example = _example(sample, setup.chat)
        if setup.chat:  # the chat dataset's examples hold tensors (its collate calls .tolist())
            example = {k: torch.tensor(v) if isinstance(v, list) else v for k, v in example.items()}
        batch, _ = _step_view(dataset.collate_fn([example]))
        run.batches.append(batch)
        run.params.append(None)
        run.placed.append(Placed(index, 0, 0, sample.inputs))
    return run


def _text_rows(samples: list[Sample]) -> list[Any]:
    from megatron.bridge.data.collators.sft import _TokenizedTextSFTRow

    return [
        _TokenizedTextSFTRow(input_ids=torch.tensor(s.ids), loss_mask=torch.tensor(s.answer, dtype=torch.bool))
        for s in samples
    ]


def _in_batch(setup: Setup, packed: bool) -> Run:
    from megatron.bridge.data.collators.sft import _build_text_sft_batch

    width = width_of(setup)
    size = max(1, setup.micro_batch)
    run = Run([], [])
    samples = samples_of(setup.chat)
    for micro, first in enumerate(range(0, len(samples), size)):
        chunk = list(samples[first : first + size])
        batch = _build_text_sft_batch(
            [{} for _ in chunk],
            _text_rows(chunk),
            _Tokenizer(),
            torch.tensor([], dtype=torch.long),
            [{} for _ in chunk],
            max_length=width,
            pad_to_max_length=False,
            pad_to_multiple_of=1 if packed else _cp_multiple(setup),
            ignore_index=-100,
            enable_in_batch_packing=packed,
            in_batch_packing_pad_to_multiple_of=setup.pad_seq_to_mult,
        )
        batch, params = _step_view(batch)
        run.batches.append(batch)
        run.params.append(params)
        start = 0
        for row, sample in enumerate(chunk):
            n = len(sample.ids)  # the in-batch collate feeds every stored token (the last one's label is ignored)
            run.placed.append(Placed(micro, 0 if packed else row, start if packed else 0, n))
            start += _ceil(n, setup.pad_seq_to_mult)
    return run


def packed_run(setup: Setup) -> Run:
    """The samples as this config's packing and collate give them to the model."""
    return _offline_packed(setup) if setup.mode == "offline" else _in_batch(setup, True)


def unpacked_run(setup: Setup) -> Run:
    """The same samples without packing, one per row, through the same dataset kind's collate."""
    return _offline_unpacked(setup) if setup.mode == "offline" else _in_batch(setup, False)
