"""The one-rank CPU world (``capture/cpu_world.py``) leaves the process as it found it: the gloo threads of its
process groups end with it, whatever the run built. A check runs dozens of worlds in one process (the hook, the
capture verdicts, a test session); each ~60 threads left behind made a 2-core CI machine crawl (2,979 threads after
the capture verdicts, before this was fixed)."""

from __future__ import annotations

from typing import Any

from tests.support.threads import gloo_threads, needs_proc

pytestmark = needs_proc


def test_a_moe_step_leaves_no_gloo_thread_behind(megatron_bridge: Any) -> None:
    """A MoE step's dispatcher keeps a tensor of the step, whose autograd graph holds DDP's hooks, the wrapper and
    its process groups: a cycle through C++ that no collection frees, unless the world empties the wrapper."""
    from devtools.capture.iteration import run_iteration
    from devtools.capture.layers import MOE_SETTINGS

    before = gloo_threads()
    for _ in range(2):
        run = run_iteration(MOE_SETTINGS)
        assert run.stopped_at is None and run.refused is None
    assert gloo_threads() == before


def test_a_rope_step_leaves_no_gloo_thread_behind(megatron_bridge: Any) -> None:
    """``RotaryEmbedding.forward``'s class-wide ``lru_cache`` keeps each RoPE module and its CP group."""
    from devtools.capture.iteration import run_iteration

    before = gloo_threads()
    for fused in (False, True):
        run = run_iteration({"model.position_embedding_type": "rope", "model.apply_rope_fusion": fused})
        assert run.stopped_at is None and run.refused is None
    assert gloo_threads() == before


def test_a_graphed_layer_scope_leaves_no_gloo_thread_behind(megatron_bridge: Any) -> None:
    """A layer and its graph stand-in refer to each other (a cycle only a collection frees): the run's model lives
    in a frame that ends inside the world, so the world's own collection frees it."""
    from devtools.capture.layers import run_gpt_scope, run_hybrid_scope

    before = gloo_threads()
    assert run_gpt_scope(["mlp"], "dense").outcome == "replays"
    assert run_hybrid_scope(["mlp"], "mlp_layer").graphed
    assert gloo_threads() == before


def test_the_world_is_made_of_gloo_groups_whose_threads_it_counts(megatron_bridge: Any) -> None:
    """The count above sees the world's threads (else the tests above would pass on any leak)."""
    from mbridge_seqpack.capture.cpu_world import cpu_world

    before = gloo_threads()
    with cpu_world():
        assert gloo_threads() > before
    assert gloo_threads() == before


def test_a_world_over_the_rank_limit_forks_nothing() -> None:
    """A rank count comes from a config (its context-parallel size): a stray value once forked 600 copies of the
    checking process inside ``validate()`` and took the machine's memory."""
    import psutil
    import pytest

    from mbridge_seqpack.capture.cpu_world import MAX_RANKS, RanksUnavailable, ranks

    before = len(psutil.Process().children(recursive=True))
    for size in (MAX_RANKS + 1, 0):
        with pytest.raises(RanksUnavailable) as refused:
            ranks(_rank_of, world_size=size)
        assert str(refused.value) == f"a {size}-rank world: a CPU world here has 1 to 16 ranks"
    assert len(psutil.Process().children(recursive=True)) == before


def test_a_rank_copies_none_of_the_parents_heap_when_it_collects() -> None:
    """A collection in a forked rank writes the header of every object it visits; without the parent's objects
    frozen out of it, each rank copies the checking process's heap (~1.5 GB once Megatron-Bridge is imported)."""
    from mbridge_seqpack.capture.cpu_world import ranks

    ballast = [[i] for i in range(1_000_000)]  # 56 MB of object headers alone
    [copied] = ranks(_private_bytes_after_a_collection, world_size=1)
    assert copied < 24 << 20, f"{copied >> 20} MB"
    del ballast


def _rank_of(rank: int, group: Any) -> int:
    return rank


def _private_bytes_after_a_collection(rank: int, group: Any) -> int:
    import gc

    import psutil

    gc.collect()
    return psutil.Process().memory_full_info().uss
