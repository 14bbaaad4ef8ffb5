"""The equivalence check at CP=2 (issue #38): each CP rank's part of the packed and unpacked micro batches, split by
Megatron-Bridge's own get_batch code in a real 2-process gloo world, compared per token and after the CP loss
reduction; TE's partition kernel is CUDA only here, so that part is undetermined (never OK); mutants of the split
(no partition, a wrong chunk order) fail."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from mbridge_seqpack import check
from mbridge_seqpack.config_paths import set_path
from tests.support.equivalence_configs import IN_BATCH, make_setup

SPECS = "dataset.offline_packing_specs"
KERNEL_NOTE = (
    "stood in here: Transformer Engine's thd_get_partitioned_indices kernel (CUDA only; here: RuntimeError: "
    "Found no NVIDIA driver on your system): each CP rank's packed split ran through Megatron-Bridge's "
    "_partition_packed_batch_for_cp with a transliteration of TE's thd_partition_indices_kernel in its place"
)
OFFLINE = {"pad_seq_to_mult": 4, "cp": 2, "per_token_loss": True}
INBATCH = {**IN_BATCH, "pad_seq_to_mult": 4, "cp": 2, "per_token_loss": True}


@pytest.fixture(scope="module")
def megatron(megatron_bridge: Any) -> Any:
    return megatron_bridge


def _cp(changes: dict[str, Any], **mutants: Any) -> Any:
    from mbridge_seqpack.equivalence.batches import packed_run, unpacked_run
    from mbridge_seqpack.equivalence.cp import cp_signals

    s = make_setup(**changes)
    return s, cp_signals(s, packed_run(s), unpacked_run(s), **mutants)


def test_the_kernel_transliteration_is_the_zigzag() -> None:
    """Rank r holds chunks r and 2*CP-1-r of every sequence (the project's reference of the THD split agrees), and
    positions past the last offset go where TE's binary search puts them."""
    from mbridge_seqpack.equivalence.cp import te_partition_indices
    from mbridge_seqpack.thd.reference import thd_cp_partition_indices

    cu = torch.tensor([0, 8, 16], dtype=torch.int32)
    assert te_partition_indices(cu, 16, 2, 0).tolist() == [0, 1, 6, 7, 8, 9, 14, 15]
    assert te_partition_indices(cu, 16, 2, 1).tolist() == [2, 3, 4, 5, 10, 11, 12, 13]
    packed = torch.tensor([0, 8, 12, 16, 28, 44, 64], dtype=torch.int32)
    for rank in (0, 1):
        assert te_partition_indices(packed, 64, 2, rank).tolist() == thd_cp_partition_indices(packed, 2, rank).tolist()
    assert te_partition_indices(torch.tensor([0, 8], dtype=torch.int32), 16, 2, 0).tolist()[4:] == [8, 9, 10, 11]
    with pytest.raises(RuntimeError, match="not a multiple of 2"):
        te_partition_indices(torch.tensor([0, 6, 16], dtype=torch.int32), 16, 2, 0)


def test_te_kernel_does_not_run_on_this_cpu(megatron: Any) -> None:
    """Megatron-Bridge's get_thd_cp_partition_indices, called on a 2-rank gloo group, reaches TE's kernel, which
    fails without CUDA: the measured failure is what the verdict reports."""
    from megatron.bridge.training.utils.packed_seq_utils import get_thd_cp_partition_indices

    from mbridge_seqpack.capture.cpu_world import ranks

    def call(rank: int, group: Any) -> str:
        try:
            get_thd_cp_partition_indices(
                torch.tensor([0, 8, 16], dtype=torch.int32), total_tokens=16, cp_group=group, device="cpu"
            )
        except RuntimeError as exc:
            return str(exc).split(". ")[0]
        return "ran"

    assert ranks(call) == ["Found no NVIDIA driver on your system"] * 2


@pytest.mark.parametrize(
    "changes, packed_ranks, unpacked_ranks, reported",
    [
        (OFFLINE, ((4.625, 3), (33.0, 21)), ((14.5, 10), (23.125, 14)), 37.625 / 24),
        (INBATCH, ((6.25, 4), (27.375, 19)), ((10.625, 7), (23.0, 16)), 33.625 / 23),
    ],
    ids=["offline_pad4", "in_batch_mult4"],
)
def test_each_rank_trains_its_part_and_the_reduction_agrees(
    megatron: Any, changes: dict, packed_ranks: tuple, unpacked_ranks: tuple, reported: float
) -> None:
    """Per rank (loss sum, trained tokens) as each run splits them (they differ: the zigzag is per document packed,
    per row unpacked); after the all-reduce over the CP group the reported and backward losses are the global token
    mean, the same packed and unpacked; every token is held by exactly one rank with the unpacked label, mask and
    loss contribution."""
    from mbridge_seqpack.equivalence.compare import Signals, context_parallel

    s, found = _cp(changes)
    assert found.packed.per_rank == packed_ranks and found.unpacked.per_rank == unpacked_ranks
    for side in (found.packed, found.unpacked):
        assert side.reported == pytest.approx(reported, rel=1e-6)
        assert side.backward == pytest.approx(reported, rel=1e-12)
        assert all(len(held) == 1 for sample in side.tokens for held in sample)
    assert sum(c for _, c in packed_ranks) == sum(c for _, c in unpacked_ranks)
    assert found.not_run == (KERNEL_NOTE,)
    assert context_parallel(Signals(s, [], [], cp=found)) is None


def _unsplit(batch: dict, group: Any, packed: bool) -> dict:
    """Mutant: the packed batch is not partitioned (every rank keeps the whole row)."""
    from mbridge_seqpack.equivalence.cp import _split

    return batch if packed else _split(batch, group, packed)


def _wrong_order(cu: torch.Tensor, total: int, world: int, rank: int) -> torch.Tensor:
    """Mutant kernel: rank r takes chunks r and r+CP of each sequence (not the mirrored 2*CP-1-r)."""
    bounds = [int(v) for v in cu.tolist()]
    out: list[int] = []
    for start, end in zip(bounds[:-1], bounds[1:]):
        size = (end - start) // (2 * world)
        for chunk in (rank, rank + world):
            out += range(start + chunk * size, start + (chunk + 1) * size)
    return torch.tensor(out, dtype=torch.int32)


@pytest.mark.parametrize(
    "changes, mutant, effect, example",
    [
        (
            OFFLINE,
            {"split": _unsplit},
            "CP=2: 35 of 35 tokens are held by more than one of the 2 CP ranks; 35 of 35 tokens sit where TE's CP "
            "attention does not read them",
            "sample 1, input position 0: on 2 CP ranks",
        ),
        (
            OFFLINE,
            {"kernel": _wrong_order},
            "CP=2: 13 of 35 tokens sit where TE's CP attention does not read them",
            "sample 1, input position 2: CP rank 0 holds position 14, TE reads position 15 there",
        ),
        (
            INBATCH,
            {"kernel": _wrong_order},
            "CP=2: 16 of 40 tokens sit where TE's CP attention does not read them",
            "sample 1, input position 4: CP rank 0 holds position 4, TE reads position 6 there",
        ),
    ],
    ids=["offline_no_partition", "offline_wrong_chunk_order", "in_batch_wrong_chunk_order"],
)
def test_a_mutant_of_the_split_fails(megatron: Any, changes: dict, mutant: dict, effect: str, example: str) -> None:
    """The mutant is caught by the CP comparison alone: the whole-row comparisons do not read the CP split."""
    from mbridge_seqpack.equivalence import compare

    s, found = _cp(changes, **mutant)
    signals = compare.Signals(s, [], [], cp=found)
    finding = compare.context_parallel(signals)
    assert (finding.signal, finding.effect, finding.example) == ("cp", effect, example)
    assert [c(signals) for c in compare.COMPARISONS if c is not compare.context_parallel] == [None] * 6


def test_a_dropped_token_and_a_changed_label_are_named(megatron: Any) -> None:
    """Hand-made sides (for what no 0.6.2 split reaches): a token on no rank, a token trained with another label."""
    import dataclasses

    from mbridge_seqpack.equivalence.compare import Signals, context_parallel

    s, found = _cp(OFFLINE)
    tokens = [list(sample) for sample in found.packed.tokens]
    tokens[0][1] = ()
    (held,) = tokens[1][5]
    tokens[1][5] = (dataclasses.replace(held, label=held.label + 1),)
    broken = dataclasses.replace(found.packed, tokens=tuple(tuple(t) for t in tokens))
    finding = context_parallel(Signals(s, [], [], cp=dataclasses.replace(found, packed=broken)))
    assert finding.effect == (
        "CP=2: 1 of 35 tokens are held by no CP rank; 1 of 35 tokens train another label, loss mask or loss on their "
        "CP rank"
    )
    assert finding.example == "sample 1, input position 1: on no CP rank"


def test_the_verdict_is_undetermined_never_ok(megatron: Any) -> None:
    """The whole check at CP=2: no finding, the kernel's part undetermined, in the verdict and its not_run."""
    from mbridge_seqpack.equivalence.compare import verdict

    found = verdict(make_setup(**OFFLINE))
    assert found.findings == ()
    assert found.undetermined == (KERNEL_NOTE,)
    assert found.not_run[-1] == KERNEL_NOTE


def test_the_rule_passes_cp2_and_the_verdict_keeps_it_undetermined(packed_cfg: Any) -> None:
    """On a real ConfigContainer at CP=2 (pad_seq_to_mult 4, per-token loss as validate asks): no equivalence rule
    fires, and the verdict the rules read holds the kernel's part as undetermined (the rules do not yet turn it
    into an undetermined violation: that would mark every CP>1 packed config)."""
    from mbridge_seqpack.equivalence.compare import verdict_of
    from mbridge_seqpack.equivalence.setup import setup_of

    set_path(packed_cfg, "model.context_parallel_size", 2)
    set_path(packed_cfg, f"{SPECS}.pad_seq_to_mult", 4)
    set_path(packed_cfg, "model.calculate_per_token_loss", True)
    set_path(packed_cfg, "ddp.average_in_collective", False)
    assert [v.rule_id for v in check(packed_cfg, world_size=8) if v.rule_id.startswith("equivalence.")] == []
    found = verdict_of(setup_of(packed_cfg))
    assert (found.setup.cp, found.setup.pad_seq_to_mult, found.findings) == (2, 4, ())
    assert found.undetermined == (KERNEL_NOTE,)
    # what stood in is said beside the verdict: the report's notes carry it
    notes = check(packed_cfg, world_size=8).notes
    assert [n for n in notes if n.startswith("equivalence check:")] == [f"equivalence check: {KERNEL_NOTE}"]


def test_a_cp_comparison_that_could_not_run_is_undetermined_never_ok(
    packed_cfg: Any, tmp_path: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    """Where no CPU world of the CP size can be made (here: torch.distributed already initialized in the checking
    process, as in a script that sets up its world before validate()), what each CP rank trains was not compared:
    the rule says so (undetermined, with what did not run), never a plain pass."""
    import torch.distributed as dist

    from mbridge_seqpack.equivalence.compare import forget_verdicts

    set_path(packed_cfg, "model.context_parallel_size", 2)
    set_path(packed_cfg, f"{SPECS}.pad_seq_to_mult", 4)
    set_path(packed_cfg, "model.calculate_per_token_loss", True)
    set_path(packed_cfg, "ddp.average_in_collective", False)
    forget_verdicts()
    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'store'}", rank=0, world_size=1)
    try:
        (found,) = [v for v in check(packed_cfg, world_size=8) if v.rule_id.startswith("equivalence.")]
    finally:
        dist.destroy_process_group()
    assert (found.rule_id, found.severity) == ("equivalence.labels", "undetermined")
    # that verdict came from the process's state, not the config: once the world is gone the same config is
    # computed again (a remembered "not determined" would outlive the world that caused it)
    assert [v.rule_id for v in check(packed_cfg, world_size=8) if v.rule_id.startswith("equivalence.")] == []
    forget_verdicts()
    assert found.fields["model.context_parallel_size"] == 2
    assert found.not_run == (
        "not determined here: no CPU world: the CP=2 split and its loss reductions (torch.distributed is already "
        "initialized in this process (forked ranks would share it))"
    )
    assert found.rule.startswith("packed and unpacked rows train the same per-token signal on the whole row")


def test_a_cp_size_beyond_a_cpu_world_is_undetermined_never_ok(megatron: Any) -> None:
    """CP=32 is more ranks than are forked inside a check (``capture/cpu_world.py`` MAX_RANKS): that part is not
    determined here, said with the limit, and nothing is forked."""
    from mbridge_seqpack.equivalence.compare import verdict

    found = verdict(make_setup(pad_seq_to_mult=64, cp=32, per_token_loss=True))
    assert (found.findings, found.cp_not_run) == ((), True)
    assert found.undetermined == (
        "not determined here: no CPU world: the CP=32 split and its loss reductions (a 32-rank world: a CPU world "
        "here has 1 to 16 ranks)",
    )
