"""Packed training against unpacked training, computed for the config (issue #38): the same sequences through
Megatron-Bridge's pack, collate and step and Megatron-Core's MTP roll and router, packed and unpacked, on CPU
(``mbridge_seqpack/equivalence``). A training signal that differs is an error naming the mechanism, the fields and
the measured effect; its fix is a setting the same check passes, where one exists.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from mbridge_seqpack.errors import ERROR, UNDETERMINED, Violation
from mbridge_seqpack.rules.context import DATASET_KWARGS_READS, EQUIVALENCE_READS, SPECS, RuleContext
from mbridge_seqpack.rules.field_types import BOOL, OPTIONAL_STR
from mbridge_seqpack.rules.registry import rule
from mbridge_seqpack.rules.shared import no_packing

__all__ = ["equivalence_verdict", "timings"]

#: seconds each computed verdict took (the cache's misses), for the README's figure and the tests
timings: list[float] = []

_HOW = (
    "computed on CPU: five short sequences packed by Megatron-Bridge's own prep and collate "
    "(data/packing/offline.py, algorithms.py, gpt_sft.py GPTSFTPackedDataset.collate_fn; in-batch: "
    "data/collators/sft.py _build_text_sft_batch) and its step's packed handling (training/gpt_step.py "
    "_packed_metadata_for_forward, training/utils/packed_seq_utils.py get_packed_seq_params), against the same "
    "sequences one per row through the unpacked collate (data/datasets/gpt_sft.py collate_fn)"
)


def equivalence_verdict(ctx: RuleContext) -> Any:
    """The check's verdict for this config (cached by the fields that decide it), or None where it builds no rows."""
    import time

    from mbridge_seqpack.equivalence.compare import is_remembered, verdict_of
    from mbridge_seqpack.equivalence.setup import setup_of

    setup = setup_of(ctx.cfg)
    if setup is None:
        return None
    computed = not is_remembered(setup)
    started = time.perf_counter()
    found = verdict_of(setup)
    if computed:
        timings.append(time.perf_counter() - started)
    return found


def _passes(setup: Any, signals: tuple[str, ...], **changes: Any) -> bool:
    from mbridge_seqpack.equivalence.compare import verdict_of

    return not verdict_of(dataclasses.replace(setup, **changes)).of(*signals)


def _layout_fields(ctx: RuleContext, setup: Any) -> dict[str, Any]:
    fields: dict[str, Any] = dict(ctx.packing_flags)
    if setup.mode == "offline":
        fields[f"{SPECS}.pad_seq_to_mult"] = setup.pad_seq_to_mult
        fields[f"{SPECS}.pad_cu_seqlens"] = setup.pad_cu_seqlens
        fields[ctx.pad_to_max_length_path] = setup.fixed_width
    else:
        fields["in-batch multiple"] = setup.pad_seq_to_mult
    return fields


def _not_run(verdict: Any) -> str:
    return "; ".join(verdict.not_run)


#: the signals equivalence.labels reports (the per-token signal and the loss, whole rows and per CP rank)
_LABEL_SIGNALS = ("labels", "loss_mask", "attention", "loss", "cp")


def _cp_not_compared(verdict: Any, fields: dict[str, Any]) -> Violation:
    """Every computed signal agrees, but the CP=N comparison did not run at all (no CPU world of N ranks could be
    made here): never an OK. Neither is a split Megatron-Bridge refuses (other rules name why), nor the stand-in for
    TE's CUDA-only partition kernel: the split then ran, and ``check`` says what stood in (the report's notes)."""
    cp = verdict.setup.cp
    return Violation(
        {"model.context_parallel_size": cp, **fields},
        f"packed and unpacked rows train the same per-token signal on the whole row; what each of the {cp} CP ranks "
        "trains was not compared here",
        fix="run the check where a CPU world of the CP size can be forked (not inside a daemonic process), or run one "
        "packed step on a GPU with CP and compare its per-rank loss masks and lm loss with an unpacked run",
        severity=UNDETERMINED,
        not_run="; ".join(verdict.undetermined),
    )


@rule(
    "equivalence.labels",
    "Packed rows train the same labels and loss mask per token, within the same sequence, as unpacked rows.",
    severity=ERROR,
    evidence=(
        f"{_HOW}. Compared per real token: the label, the loss mask and the sequence the token attends within as "
        "Transformer Engine reads PackedSeqParams (segment [cu_seqlens_q_padded[k], cu_seqlens_q_padded[k+1]), "
        "real for its first cu_seqlens_q[k+1]-cu_seqlens_q[k] tokens; the kernel itself is CUDA only). Then the "
        "loss: Megatron-Bridge's masked_next_token_loss (training/losses.py) and Megatron-Core's "
        "forward_step_calc_loss (pipeline_parallel/schedules.py) over a fixed per-token stand-in loss (logits need "
        "a model): per sequence the loss sum and token count, the lm loss the step reports (training/train.py "
        "train_step: [sum, tokens] summed over micro batches), and with calculate_per_token_loss the loss backward "
        "runs on. At CP > 1, each CP rank's part in a real CP-process gloo world: the split of "
        "training/gpt_step.py get_batch (_partition_packed_batch_for_cp packed, megatron/core/utils.py "
        "get_batch_on_this_cp_rank unpacked), per rank the tokens held, their labels, loss masks and loss "
        "contributions and the position TE's CP attention reads them at, and the loss after the all-reduce over the "
        "CP group (training/train.py, finalize_model_grads); TE's thd_get_partitioned_indices is CUDA only, so where "
        "it fails the split runs with a transliteration of its kernel, and the verdict's not_run says so. Found this "
        "way: GPTSFTPackedDataset._build_loss_mask with answer_only_loss=False trains every non-EOS input token "
        "where the unpacked chat collate (GPTSFTChatDataset.collate_fn) trains the chat loss mask."
    ),
    reads={**EQUIVALENCE_READS, **DATASET_KWARGS_READS, "dataset.enable_offline_packing": BOOL},
)
def labels(ctx: RuleContext) -> list[Violation] | None:
    verdict = equivalence_verdict(ctx)
    if verdict is None:
        return None
    findings = verdict.of(*_LABEL_SIGNALS)
    setup = verdict.setup
    fields = _layout_fields(ctx, setup)
    if not findings and verdict.cp_not_run:
        return [_cp_not_compared(verdict, fields)]
    if not findings:
        return []
    assignments: dict[str, Any] = {}
    if setup.mode == "offline" and not setup.answer_only_loss:
        fields["dataset.dataset_kwargs.answer_only_loss"] = False
        if _passes(setup, _LABEL_SIGNALS, answer_only_loss=True):
            assignments = {"dataset.dataset_kwargs.answer_only_loss": True}
    if not assignments:
        assignments = no_packing(ctx)
    effect = "; ".join(f.effect for f in findings)
    # a finding of the reduced loss alone (the step's reported or backward loss) has no per-token example
    example = next((f" (e.g. {f.example})" for f in findings if f.example), "")
    return [
        Violation(
            {**fields, "measured": effect},
            f"{effect}{example}: packed training does not train what unpacked training trains",
            assignments=assignments,
            not_run=_not_run(verdict),
        )
    ]


@rule(
    "equivalence.mtp_labels",
    "MTP labels of packed rows stay within their sequence, as they do unpacked.",
    severity=ERROR,
    evidence=(
        f"{_HOW}, then Megatron-Core's process_mtp_loss (transformer/multi_token_prediction.py) on both, with the "
        "step's PackedSeqParams. roll_tensor -> _roll_tensor_packed_seq rolls each sequence within "
        "packed_seq_params.cu_seqlens_q; get_packed_seq_params sets cu_seqlens_q to the logical offsets whenever "
        "the batch carries padded ones (packed_seq_utils.py: cu_seqlens_q_padded for pad_seq_to_mult > 1, and "
        "in-batch packing with a CP/SP multiple > 1), so with alignment padding between sequences the roll works "
        "on spans that are not the sequences: e.g. tokens [11,12,13,14,2,2,2,21,...] with cu_seqlens [0,4,10,10] "
        "and padded [0,7,14,16] roll sequence 2's first token into sequence 1. Compared per real token and depth: "
        "the MTP target and whether it is trained (its gradient through MTPLossAutoScaler). CP>1 (the roll's CP "
        "branch) is mtp.packed_context_parallel's."
    ),
    reads={**EQUIVALENCE_READS, **DATASET_KWARGS_READS, "dataset.enable_offline_packing": BOOL},
)
def mtp_labels(ctx: RuleContext) -> list[Violation] | None:
    verdict = equivalence_verdict(ctx)
    if verdict is None or not verdict.setup.mtp_layers or verdict.setup.cp > 1:
        return None
    findings = verdict.of("mtp")
    if not findings:
        return []
    (finding,) = findings
    setup = verdict.setup
    assignments: dict[str, Any] = {"model.mtp_num_layers": None}
    fix = ""
    if setup.mode == "offline" and setup.pad_seq_to_mult > 1 and _passes(setup, ("mtp",), pad_seq_to_mult=1):
        assignments = {f"{SPECS}.pad_seq_to_mult": 1}
        fix = f"cfg.{SPECS}.pad_seq_to_mult = 1 (and repack: the pack's sequences carry the alignment padding)"
    elif setup.mode == "in_batch" and ctx.topology.sequence_parallel:
        from mbridge_seqpack.equivalence.setup import in_batch_multiple

        plain = in_batch_multiple(setup.cp, ctx.topology.tp, False)
        if _passes(setup, ("mtp",), pad_seq_to_mult=plain):
            assignments = {"model.sequence_parallel": False}
    return [
        Violation(
            {"model.mtp_num_layers": setup.mtp_layers, **_layout_fields(ctx, setup), "measured": finding.effect},
            f"{finding.effect} (e.g. {finding.example}): Megatron-Core rolls MTP labels on the logical cu_seqlens_q "
            "while the rows carry alignment padding between sequences, so MTP trains on the neighbouring "
            "sequence's tokens and on padding",
            fix=fix,
            assignments=assignments,
            not_run=_not_run(verdict),
        )
    ]


def _padding_free(ctx: RuleContext, setup: Any) -> tuple[dict[str, Any], dict[str, Any]]:
    """(assignments, setup changes) that leave the packed rows without padding, where settings can."""
    if setup.mode == "offline":
        if setup.cp > 1:
            return {}, {}
        assignments: dict[str, Any] = {}
        changes: dict[str, Any] = {}
        if setup.fixed_width:
            assignments[ctx.pad_to_max_length_path] = False
            changes["fixed_width"] = False
        if setup.pad_cu_seqlens:
            assignments[f"{SPECS}.pad_cu_seqlens"] = False
            changes["pad_cu_seqlens"] = False
        if setup.pad_seq_to_mult > 1:
            assignments[f"{SPECS}.pad_seq_to_mult"] = 1
            changes["pad_seq_to_mult"] = 1
        if setup.row_mult > 1:
            assignments["dataset.dataset_kwargs.pad_seq_length_to_mult"] = 1
            changes["row_mult"] = 1
        return assignments, changes
    if setup.cp == 1 and ctx.topology.sequence_parallel:
        return {"model.sequence_parallel": False}, {"pad_seq_to_mult": 1}
    return {}, {}


def _padding_bound(setup: Any) -> str:
    """The padding this config's own rows carry, in words (the check's rows are short; a pack's share is its own)."""
    parts = []
    if setup.pad_seq_to_mult > 1:
        parts.append(f"up to {setup.pad_seq_to_mult - 1} alignment tokens per sequence")
    if setup.mode == "offline" and setup.fixed_width:
        parts.append("the unused tail of every full-width row")
    elif setup.mode == "offline" and setup.row_mult > 1:
        parts.append(f"up to {setup.row_mult - 1} tail tokens per row (the width rounds up to {setup.row_mult})")
    return " and ".join(parts) or "padding"


@rule(
    "equivalence.router_padding",
    "The MoE router of packed rows counts no padding (unpacked sequences have none).",
    severity=ERROR,
    evidence=(
        f"{_HOW}, then Megatron-Core's TopKRouter (transformer/moe/router.py routing) built from the config's router "
        "settings in a one-rank CPU world, over the packed rows as Megatron-Bridge 0.6.2 calls it (training/"
        "gpt_step.py passes no padding_mask, so MoELayer gives the router none and alignment padding and the row "
        "tail are routed) and over the real tokens alone (the same as padding_mask). Compared: routed padding, "
        "tokens per expert (expert-bias counts, the aux loss's load), the load-balancing loss and z-loss the "
        "metrics tracker records, and real tokens the capacity drops. Upstream fixed it after 0.6.2 "
        "(Megatron-Bridge PR 5470; Megatron-LM PRs 2121, 5542, 6114). With the opt-in correction router_padding_mask "
        "(the PR backported for Megatron-Bridge 0.6.2 with Megatron-Core 0.19.2: mbridge_seqpack/corrections/"
        "router_padding.py) in effect, the packed pass is the corrected step's: each micro batch through the wrapped "
        "gpt_step.get_batch_from_iterator and _packed_metadata_for_forward, the mask they hand on given to the "
        "router as MoELayer.forward passes it; the rule then passes only where the counts and losses equal the real "
        "tokens' alone (capacity is not corrected: apply_router_token_dropping takes no mask)."
    ),
    reads={
        **EQUIVALENCE_READS,
        **DATASET_KWARGS_READS,
        "dataset.enable_offline_packing": BOOL,
        # what the correction does not cover (corrections/router_padding.py uncovered)
        "model.cuda_graph_impl": OPTIONAL_STR,
        "model.overlap_moe_expert_parallel_comm": BOOL,
    },
)
def router_padding(ctx: RuleContext) -> list[Violation] | None:
    verdict = equivalence_verdict(ctx)
    if verdict is None or verdict.setup.router is None or not verdict.setup.router.counting_terms:
        return None
    findings = verdict.of("router")
    if not findings:
        return []
    (finding,) = findings
    setup = verdict.setup
    assignments, changes = _padding_free(ctx, setup)
    fix = ""
    if not assignments or not _passes(setup, ("router",), **changes):
        assignments = {}
        fix = (
            "no Megatron-Bridge 0.6.2 setting removes the padding of these rows (the CP/SP alignment needs it): "
            "turn packing off, or take Megatron-Bridge PR 5470 (the step passes padding_mask to the model)"
        )
    correction = _correction_words(ctx, setup)
    if correction:
        from mbridge_seqpack.errors import format_assignment

        fix = fix or "; ".join(format_assignment(k, v) for k, v in assignments.items())
        fix = f"{fix}; {correction}" if fix else correction
    if setup.router.padding_mask:
        message = (
            f"{finding.effect} on the check's rows: the step hands the router the padding mask (correction "
            "router_padding_mask), and still the router does not train what the unpacked rows train"
        )
    else:
        message = (
            f"{finding.effect} on the check's rows: Megatron-Bridge 0.6.2 gives the router no padding_mask, so the "
            "padding of packed rows is routed and counted in the aux loss, z-loss, expert-bias counts and capacity; "
            f"this config's rows carry {_padding_bound(setup)}"
        )
    return [
        Violation(
            {
                "model.num_moe_experts": setup.router.experts,
                "router terms": setup.router.counting_terms,
                **_layout_fields(ctx, setup),
                "measured": finding.effect,
            },
            message,
            fix=fix,
            assignments=assignments,
            not_run=_not_run(verdict),
        )
    ]


def _correction_words(ctx: RuleContext, setup: Any) -> str:
    """What the opt-in correction router_padding_mask would do here, or why it does not: for the fix text."""
    from mbridge_seqpack.corrections import CORRECTIONS_ENV
    from mbridge_seqpack.corrections import router_padding as correction

    state = correction.state()
    uncovered = correction.uncovered(ctx.model)
    if state.state == "not_installable":
        return f"the correction router_padding_mask is requested but not installable: {state.why}"
    if uncovered is not None:
        return f"the correction router_padding_mask does not cover {uncovered}"
    if state.state == "not_launched":
        return f"the correction router_padding_mask is requested but not installed at launch: {state.why}"
    if state.in_effect or setup.router.padding_mask or correction.not_installable() is not None:
        return ""
    on = dataclasses.replace(setup, router=dataclasses.replace(setup.router, padding_mask=True))
    if not _passes(on, ("router",)):
        return ""
    return (
        f"or turn on the correction router_padding_mask ({CORRECTIONS_ENV}=router_padding_mask with "
        "MBRIDGE_SEQPACK_MODE, or mbridge_seqpack.install(corrections=['router_padding_mask'])): Megatron-Bridge "
        "PR 5470 backported, the same check passes with it"
    )
