"""The ``dataset.*`` rules: a real ConfigContainer breaking only the rule gives exactly its violation,
and the fix repairs it (the cases: ``tests/support/rule_cases/dataset.py``)."""

from __future__ import annotations

from typing import Any

import pytest

from tests.support.rule_cases import Case, breaks_and_fix_repairs
from tests.support.rule_cases.dataset import CASES


@pytest.mark.parametrize("case", CASES, ids=[c.rule_id for c in CASES])
def test_rule_breaks_and_fix_repairs(case: Case, request: pytest.FixtureRequest) -> None:
    breaks_and_fix_repairs(case, request)


def test_a_mask_need_beyond_any_node_is_an_error_naming_the_figure(pretrain_cfg: Any) -> None:
    """Megatron-Bridge's 128k pretraining layout (seq 131072, 8 workers per rank, 8 ranks per node): each of the 64
    mask-building processes holds two float32 S x S tensors while torch.tril(torch.ones((S, S))) runs and one bool
    mask after (gpt_dataset.py:798-800), 9 * S^2 bytes each: 9,216 GiB per node, beyond a 2 TiB node. The advisory's
    own figure proves the failure, so it is an error; at 32k (144 GiB) it stays an advisory (its case in
    tests/support/rule_cases/dataset.py)."""
    from mbridge_seqpack import check
    from mbridge_seqpack.errors import ERROR

    pretrain_cfg.model.seq_length = pretrain_cfg.dataset.seq_length = 131072
    pretrain_cfg.dataset.num_workers = 8
    need = 64 * 9 * 131072**2
    [v] = [v for v in check(pretrain_cfg, world_size=64) if v.rule_id == "dataset.create_attention_mask"]
    assert (v.severity, v.fields["host GiB per node"]) == (ERROR, need / 2**30) == (ERROR, 9216.0)
    assert v.proven == (
        "9,216 GiB of host memory per node is beyond a node of 2 TiB: the dataloader workers run out of memory on "
        "any machine"
    )
    assert v.assignments == {"dataset.create_attention_mask": False}
