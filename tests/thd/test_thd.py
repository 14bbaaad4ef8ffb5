"""Static THD PackedSeqParams, step injection, and packed-vs-unpacked parity on CPU."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from mbridge_seqpack.thd import (
    StaticShapeOverflowError,
    StaticTHDLayout,
    pad_cu_seqlens,
    static_cu_seqlens,
    static_packed_seq_params,
    static_thd_batch,
    static_thd_forward_step,
)
from mbridge_seqpack.thd.reference import (
    packed_token_loss,
    thd_cp_partition_indices,
    thd_cp_reassemble,
    varlen_causal_attention,
)


def cu(*values: int) -> torch.Tensor:
    return torch.tensor(values, dtype=torch.int32)


# ---- static shapes -------------------------------------------------------------------------------


@settings(max_examples=60, deadline=None)
@given(st.lists(st.lists(st.integers(1, 300), min_size=1, max_size=10), min_size=2, max_size=8))
def test_params_from_different_batches_have_identical_shapes(rows: list[list[int]]) -> None:
    capacity, width = 12, 3000
    seen = set()
    for lengths in rows:
        bounds = torch.cumsum(torch.tensor([0, *lengths]), 0).to(torch.int32)
        params = static_packed_seq_params(bounds, capacity=capacity, max_seqlen=width, row_width=width)
        assert params.qkv_format == "thd"
        seen.add(
            (
                tuple(params.cu_seqlens_q.shape),
                params.cu_seqlens_q.dtype,
                params.max_seqlen_q,
                tuple(params.cu_seqlens_kv.shape),
                params.max_seqlen_kv,
            )
        )
        n = len(lengths) + 1
        assert params.cu_seqlens_q[:n].tolist() == bounds.tolist()  # the unpadded prefix is the input
        assert params.cu_seqlens_q[n:].tolist() == [width] * (capacity - n)  # tail segment, then zero-length
    assert seen == {((capacity,), torch.int32, width, (capacity,), width)}


def test_padded_variant_keeps_logical_and_physical_aligned() -> None:
    c, p = static_cu_seqlens(cu(0, 5, 9), cu_seqlens_padded=cu(0, 8, 12), capacity=6, row_width=16)
    assert c.tolist() == [0, 5, 9, 9, 9, 9]  # logical: the tail is zero-length
    assert p.tolist() == [0, 8, 12, 16, 16, 16]  # physical: the tail covers the row
    params = static_packed_seq_params(
        cu(0, 5, 9), cu_seqlens_padded=cu(0, 8, 12), capacity=6, max_seqlen=8, row_width=16
    )
    assert params.cu_seqlens_q_padded.tolist() == [0, 8, 12, 16, 16, 16]
    assert params.cu_seqlens_kv_padded is params.cu_seqlens_q_padded


@pytest.mark.parametrize("end", [15, 16])
def test_the_row_is_closed_at_its_width_even_one_token_short(end: int) -> None:
    """A one-token tail is a segment too: the boundaries always end at the row width, never one short."""
    c, p = static_cu_seqlens(cu(0, 5, end), capacity=5, row_width=16)
    assert c.tolist() == ([0, 5, 15, 16, 16] if end == 15 else [0, 5, 16, 16, 16]) and p is None
    c, p = static_cu_seqlens(cu(0, 5, 9), cu_seqlens_padded=cu(0, 8, end), capacity=5, row_width=16)
    assert p.tolist() == ([0, 8, 15, 16, 16] if end == 15 else [0, 8, 16, 16, 16])
    assert c.tolist() == ([0, 5, 9, 9, 9] if end == 15 else [0, 5, 9, 9, 9])


def test_overflow_is_an_error_never_a_truncation() -> None:
    with pytest.raises(StaticShapeOverflowError) as info:
        static_packed_seq_params(cu(0, 2, 4, 6, 8), capacity=4, max_seqlen=8)
    assert str(info.value) == (
        "cu_seqlens has 5 entries (4 segments) but the static capacity is 4; raise the capacity to at least 5 "
        "(pack metadata max_samples_per_bin + 2), or pack fewer sequences per row. Rows are never truncated."
    )
    assert isinstance(info.value, ValueError)


@pytest.mark.parametrize(
    ("bounds", "kwargs", "message"),
    [
        (cu(0, 5, 3), {}, "cu_seqlens must be non-decreasing; cu_seqlens[2] = 3 < cu_seqlens[1] = 5"),
        (cu(0, -2, 3), {}, "cu_seqlens has a negative boundary: [0, -2, 3]"),
        (cu(1, 5), {}, "cu_seqlens[0] must be 0 (the first sequence starts the row), got 1"),
        (cu(0, 5, 20), {"row_width": 16}, "cu_seqlens[-1] = 20 is beyond the row width 16"),
        (torch.tensor([0.0, 4.0]), {}, "cu_seqlens must hold integers, got dtype torch.float32"),
        (
            torch.zeros(0, dtype=torch.int32),
            {},
            "cu_seqlens must be a non-empty 1-D tensor of boundaries, got shape (0,)",
        ),
    ],
)
def test_bad_metadata_names_the_field(bounds: torch.Tensor, kwargs: dict, message: str) -> None:
    with pytest.raises(ValueError) as info:
        static_packed_seq_params(bounds, capacity=8, max_seqlen=16, **kwargs)
    assert str(info.value) == message


def test_padding_is_shape_only_on_any_tensor() -> None:
    class Exploding(torch.Tensor):
        """A tensor subclass whose host reads fail, standing in for a device tensor."""

        def item(self) -> Any:  # type: ignore[override]
            raise AssertionError("host read in the step path")

        def tolist(self) -> Any:  # type: ignore[override]
            raise AssertionError("host read in the step path")

    bounds = cu(0, 3, 7).as_subclass(Exploding)
    out = pad_cu_seqlens(bounds, 6)
    assert out.shape == (6,)


def test_layout_from_pack_metadata(tmp_path: Any) -> None:
    meta = tmp_path / "m.json"
    meta.write_text(
        '[{"max_samples_per_bin": 9, "dataset_max_seqlen": 1000, "min_packed_seqlen": 3000},'
        ' {"max_samples_per_bin": 4, "dataset_max_seqlen": 800, "min_packed_seqlen": 3900}]'
    )
    assert StaticTHDLayout.from_pack_metadata(meta, 4096) == StaticTHDLayout(capacity=11, max_seqlen=1096, width=4096)
    meta.write_text("[{}]")
    with pytest.raises(ValueError, match=r"must be a JSON list of objects with max_samples_per_bin"):
        StaticTHDLayout.from_pack_metadata(meta, 4096)
    with pytest.raises(ValueError, match=r"does not exist; pass the <N>_metadata.jsonl written with the pack"):
        StaticTHDLayout.from_pack_metadata(tmp_path / "nope.json", 4096)


# ---- injection into the step -----------------------------------------------------------------------


@pytest.fixture(scope="module")
def mb_packed_batches(tmp_path_factory: pytest.TempPathFactory, megatron_bridge: Any) -> tuple[list, Any]:
    """Megatron-Bridge's own packed collate (pad_cu_seqlens, fixed width 2048) over a pack of the embedded
    corpus: the batches its data loader yields, and the pack's metadata path."""
    from tests.support.mb_batches import mb_packed_collate_batches

    return mb_packed_collate_batches(tmp_path_factory.mktemp("pack"), pad_seq_to_mult=4)


@pytest.mark.parametrize("takes_state", [True, False])
def test_forward_step_wrapper_keeps_the_calling_convention(
    megatron_bridge: Any, mb_packed_batches: tuple[list, Any], takes_state: bool
) -> None:
    """Through Megatron-Bridge's prepare_forward_step_func, then called as Megatron-Core's schedule calls it; the
    step sees Megatron-Bridge's batches with the layout's host max_seqlen."""
    from megatron.bridge.training.state import GlobalState
    from megatron.bridge.training.utils.train_utils import prepare_forward_step_func

    batches, meta = mb_packed_batches
    layout = StaticTHDLayout.from_pack_metadata(meta, 2048)
    seen: list[Any] = []

    def with_state(state: GlobalState, data_iterator: Any, model: Any, return_schedule_plan: bool = False) -> str:
        seen.append((state, next(data_iterator)))
        return "ran"

    def without_state(data_iterator: Any, model: Any, return_schedule_plan: bool = False) -> str:
        seen.append(("no state", next(data_iterator)))
        return "ran"

    step = static_thd_forward_step(with_state if takes_state else without_state, layout)
    state = GlobalState.__new__(GlobalState)
    ready = prepare_forward_step_func(step, state)
    it = iter(batches[:2])
    assert ready(it, None) == "ran" and ready(it, None, return_schedule_plan=True) == "ran"
    assert [who for who, _ in seen] == ([state, state] if takes_state else ["no state", "no state"])
    assert [b["cu_seqlens_q"].shape for _, b in seen] == [torch.Size([1, layout.capacity])] * 2
    assert {int(b["max_seqlen_q"]) for _, b in seen} == {layout.max_seqlen}
    assert step.__wrapped__ is (with_state if takes_state else without_state)


def test_forward_step_wrapper_passes_missing_and_pipeline_iterators(megatron_bridge: Any) -> None:
    layout = StaticTHDLayout(capacity=4, max_seqlen=64, width=64)

    def no_data_step(state: Any, data_iterator: Any, model: Any) -> Any:
        return data_iterator  # ranks without data get None; virtual pipeline gets a list

    assert static_thd_forward_step(no_data_step, layout)(None, None, None) is None
    wrapped = static_thd_forward_step(no_data_step, layout)(None, [iter([]), None], None)
    assert [type(w).__name__ for w in wrapped] == ["StaticTHDBatches", "NoneType"]


def test_max_seqlen_stays_on_the_host_for_a_device_batch() -> None:
    """A batch whose max_seqlen lives on another device (a meta tensor stands in for CUDA here) gets a host
    max_seqlen: Megatron-Bridge's get_batch_from_iterator .cpu()s it, a device-to-host copy inside capture."""
    layout = StaticTHDLayout(capacity=4, max_seqlen=96, width=128)
    batch = {
        "tokens": torch.zeros(1, 128, dtype=torch.long, device="meta"),
        "cu_seqlens_q": torch.zeros(1, 4, dtype=torch.int32, device="meta"),
        "cu_seqlens_kv": torch.zeros(1, 4, dtype=torch.int32, device="meta"),
        "max_seqlen_q": torch.zeros(1, 1, dtype=torch.int32, device="meta"),
        "max_seqlen_kv": torch.zeros(1, 1, dtype=torch.int32, device="meta"),
    }
    out = static_thd_batch(batch, layout)
    for key in ("max_seqlen_q", "max_seqlen_kv"):
        assert (out[key].device.type, out[key].shape, out[key].dtype) == ("cpu", (1, 1), torch.int32)
        assert int(out[key]) == 96
    assert out["cu_seqlens_q"].device.type == "meta" and out["cu_seqlens_q"].shape == (1, 4)


# TE's thd_get_partitioned_indices, written out by hand for fixed cases: each sequence of padded length L is cut
# into 2*CP chunks of L/(2*CP); rank r holds chunk r and chunk 2*CP-1-r of every sequence, sequence by sequence.
CP_ORACLE = [
    ([0, 8, 12], 2, [[0, 1, 6, 7, 8, 11], [2, 3, 4, 5, 9, 10]]),
    ([0, 16], 4, [[0, 1, 14, 15], [2, 3, 12, 13], [4, 5, 10, 11], [6, 7, 8, 9]]),
    ([0, 4, 4, 12], 2, [[0, 3, 4, 5, 10, 11], [1, 2, 6, 7, 8, 9]]),
]


@pytest.mark.parametrize("bounds, cp, expected", CP_ORACLE)
def test_cp_partition_matches_the_kernel_formula(bounds: list[int], cp: int, expected: list[list[int]]) -> None:
    cu = torch.tensor(bounds)
    assert [thd_cp_partition_indices(cu, cp, r).tolist() for r in range(cp)] == expected
    contiguous = torch.arange(bounds[-1]).chunk(cp)  # the mutant a self-consistent round trip cannot tell apart
    assert [c.tolist() for c in contiguous] != expected


def test_layout_from_config(megatron_bridge: Any, tmp_path: Any) -> None:
    from megatron.bridge.training import gpt_step

    from mbridge_seqpack.recipes import build_recipe
    from mbridge_seqpack.thd import layout_from_config, static_forward_step

    with pytest.raises(ValueError, match="the config asks for no static THD shapes"):
        layout_from_config(build_recipe("qwen25_vl_3b_sft_in_batch_4k"))
    graphs = build_recipe("llama3_8b_sft_packed_8k_cuda_graphs")
    graphs.dataset.offline_packing_specs.pad_cu_seqlens = True
    with pytest.raises(ValueError, match="packed_metadata_path is None"):
        layout_from_config(graphs)
    meta = tmp_path / "8192_metadata.jsonl"
    meta.write_text('[{"max_samples_per_bin": 30, "dataset_max_seqlen": 4000, "min_packed_seqlen": 8000}]')
    graphs.dataset.offline_packing_specs.packed_metadata_path = str(meta)
    assert layout_from_config(graphs) == StaticTHDLayout(capacity=32, max_seqlen=4000, width=8192)
    assert static_forward_step(graphs).__wrapped__ is gpt_step.forward_step


# ---- parity ----------------------------------------------------------------------------------------


def _qkv(total: int, heads: int = 2, dim: int = 8, seed: int = 0) -> tuple[torch.Tensor, ...]:
    g = torch.Generator().manual_seed(seed)
    return tuple(torch.randn(total, heads, dim, generator=g, dtype=torch.float64) for _ in range(3))


@settings(max_examples=40, deadline=None)
@given(st.lists(st.integers(1, 24), min_size=1, max_size=6))
def test_packed_attention_equals_each_sequence_alone(lengths: list[int]) -> None:
    total = sum(lengths)
    q, k, v = _qkv(total)
    bounds = torch.cumsum(torch.tensor([0, *lengths]), 0)
    packed = varlen_causal_attention(q, k, v, bounds)
    start = 0
    for n in lengths:
        alone = torch.nn.functional.scaled_dot_product_attention(
            q[start : start + n].transpose(0, 1),
            k[start : start + n].transpose(0, 1),
            v[start : start + n].transpose(0, 1),
            is_causal=True,
        ).transpose(0, 1)
        torch.testing.assert_close(packed[start : start + n], alone, rtol=1e-12, atol=1e-12)
        start += n
    static = static_packed_seq_params(bounds.to(torch.int32), capacity=len(lengths) + 5, max_seqlen=total)
    torch.testing.assert_close(varlen_causal_attention(q, k, v, static.cu_seqlens_q), packed, rtol=0, atol=0)


def test_contamination_is_detected() -> None:
    """Dropping the boundaries (the Megatron-Bridge #2952 failure) changes the output: the test can fail."""
    q, k, v = _qkv(12)
    isolated = varlen_causal_attention(q, k, v, torch.tensor([0, 5, 12]))
    leaked = varlen_causal_attention(q, k, v, torch.tensor([0, 12]))
    assert not torch.allclose(isolated[5:], leaked[5:])
    torch.testing.assert_close(isolated[:5], leaked[:5])


class TinyLM(torch.nn.Module):
    """Embedding -> one causal attention layer (driven by cu_seqlens) -> vocabulary head."""

    def __init__(self, vocab: int = 50, dim: int = 16, heads: int = 2) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.heads = heads
        self.emb = torch.nn.Embedding(vocab, dim, dtype=torch.float64)
        self.pos = torch.nn.Embedding(64, dim, dtype=torch.float64)
        self.qkv = torch.nn.Linear(dim, 3 * dim, dtype=torch.float64)
        self.out = torch.nn.Linear(dim, vocab, dtype=torch.float64)

    def forward(self, tokens: torch.Tensor, positions: torch.Tensor, cu_seqlens: torch.Tensor) -> torch.Tensor:
        h = self.emb(tokens) + self.pos(positions)
        q, k, v = self.qkv(h).view(tokens.shape[0], 3, self.heads, -1).unbind(1)
        return self.out(h + varlen_causal_attention(q, k, v, cu_seqlens).reshape(tokens.shape[0], -1))


def test_packed_loss_equals_unpacked_loss_and_padding_rows_contribute_zero() -> None:
    g = torch.Generator().manual_seed(3)
    seqs = [torch.randint(0, 50, (n,), generator=g) for n in (7, 12, 5)]
    masks = [torch.cat([torch.zeros(2), torch.ones(n - 3), torch.zeros(1)]) for n in (7, 12, 5)]
    model = TinyLM()
    # unpacked: each sequence alone
    total, count = torch.zeros((), dtype=torch.float64), torch.zeros((), dtype=torch.float64)
    for s, m in zip(seqs, masks):
        logits = model(s[:-1], torch.arange(len(s) - 1), torch.tensor([0, len(s) - 1]))
        loss, n = packed_token_loss(logits, s[1:], m[1:])
        total, count = total + loss, count + n
    # packed: one row, padded to a static width with an all-zero-loss tail
    width = 32
    tokens = torch.cat([s[:-1] for s in seqs])
    labels = torch.cat([s[1:] for s in seqs])
    mask = torch.cat([m[1:] for m in masks])
    positions = torch.cat([torch.arange(len(s) - 1) for s in seqs])
    used = tokens.numel()
    tokens = torch.cat([tokens, torch.zeros(width - used, dtype=tokens.dtype)])
    labels = torch.cat([labels, torch.zeros(width - used, dtype=labels.dtype)])
    mask = torch.cat([mask, torch.zeros(width - used)])
    positions = torch.cat([positions, torch.arange(width - used)])
    bounds = torch.cumsum(torch.tensor([0, *[len(s) - 1 for s in seqs]]), 0).to(torch.int32)
    params = static_packed_seq_params(bounds, capacity=8, max_seqlen=width, row_width=width)
    loss, n = packed_token_loss(model(tokens, positions, params.cu_seqlens_q), labels, mask)
    torch.testing.assert_close(loss, total, rtol=1e-12, atol=1e-12)
    assert n == count
    # a padding row (mapped padding sample): all-zero loss mask -> zero loss and zero gradient
    model.zero_grad()
    pad_loss, pad_n = packed_token_loss(model(tokens, positions, params.cu_seqlens_q), labels, torch.zeros(width))
    pad_loss.backward()
    assert pad_loss.item() == 0.0 and pad_n.item() == 0.0
    assert all(p.grad is None or not p.grad.any() for p in model.parameters())


@settings(max_examples=60, deadline=None)
@given(st.sampled_from([1, 2, 4, 8]), st.lists(st.integers(0, 6), min_size=1, max_size=6))
def test_cp_partition_then_reassembly_gives_the_tokens_back(cp: int, units: list[int]) -> None:
    lengths = [u * 2 * cp for u in units]  # pad_seq_to_mult = 2*CP; zero-length segments allowed
    bounds = torch.cumsum(torch.tensor([0, *lengths]), 0)
    total = int(bounds[-1])
    tokens = torch.arange(100, 100 + total)
    shards = [tokens[thd_cp_partition_indices(bounds, cp, r)] for r in range(cp)]
    assert len({s.numel() for s in shards}) == 1  # every rank holds the same number of tokens
    torch.testing.assert_close(thd_cp_reassemble(shards, bounds), tokens)
    if cp > 1 and total:
        first = lengths[0] // (2 * cp) if lengths[0] else 0
        if first:  # rank 0 holds the first and the last chunk of the first document (zigzag)
            assert shards[0][:first].tolist() == tokens[:first].tolist()


def test_cp_partition_rejects_unaligned_sequences() -> None:
    with pytest.raises(ValueError) as info:
        thd_cp_partition_indices(torch.tensor([0, 8, 15]), 2, 0)
    assert str(info.value) == (
        "segment [8, 15) has length 7, not a multiple of 2*CP = 4; pad sequences to "
        "pad_seq_to_mult (THD would silently drop tokens)"
    )
