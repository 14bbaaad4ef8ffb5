"""One full training iteration of Megatron-Bridge's packed SFT step, run on CPU under the host-read recorder.

What ``FullCudaGraphWrapper`` does on the GPU, in its order: ``data_read`` copies the raw micro batches into static
device buffers (outside the graph; through mbridge_seqpack's injection when it is installed), then the graph captures
``forward_backward_func``. Here the same two calls run, with the captured one under the recorder:

- the batches are Megatron-Bridge's own packed collate (``GPTSFTPackedDataset.collate_fn``, ``pad_cu_seqlens``,
  fixed width) over three packed rows;
- ``FullCudaGraphWrapper.data_read`` is the one on the class in this process (Megatron-Core's, or mbridge_seqpack's
  wrapper of it), with Megatron-Core's real ``StaticBufferLoader``;
- the captured call is Megatron-Core's ``forward_backward_no_pipelining`` with Megatron-Bridge's
  ``gpt_step.forward_step`` (``get_batch``, FLOPs metadata, ``get_packed_seq_params``, the masked next-token
  loss), a Megatron-Core ``GPTModel`` (embedding, RoPE, transformer layers, MoE, MTP, output layer, cross entropy)
  wrapped in Megatron-Core's ``DistributedDataParallel`` (grad buffers, bucket grad checks), ``finalize_model_grads``
  and Megatron's ``Timers``, all configured from Megatron-Bridge's SFT defaults (``recipes.common._sft_common``)
  with the probed fields set.

What does not run, and why: the attention kernel (TE's ``DotProductAttention``: CUDA only; the layer spec's core
attention is Megatron's ``IdentityOp``, so everything around it, RoPE included, runs), TE's fused kernels (where a CPU
stand-in with the kernel's shapes exists, ``kernels``, the run goes on past it and lists it in ``stood_in``; a run that
reaches any other stops there and says so, ``stopped_at``: its verdict is undetermined, never safe), the
context-parallel split (TE's ``thd_get_partitioned_indices`` kernel, and a one-rank world), the graph capture itself.
A config Megatron-Core refuses (its ``finalize()`` raises) is not run: ``refused`` holds its message.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, field
from typing import Any

import torch

from mbridge_seqpack.capture.cpu_world import keeps_environment
from mbridge_seqpack.capture.verdicts import HostRead
from mbridge_seqpack.frames import traceback_site

__all__ = [
    "IterationRun",
    "StepParts",
    "build_step",
    "forward_backward",
    "kernel_boundary",
    "collate_packed_rows",
    "packed_batches",
    "probe_config",
    "run_iteration",
    "unique_reads",
    "WIDTH",
    "ROWS",
]

WIDTH = 64
#: the tokens each sequence of three packed rows trains on (its EOS follows); two rows leave a tail of padding
ROWS = ((9, 19, 14), (29, 24), (11, 11, 11, 11))
EOS = 2

#: every probe starts from Megatron-Bridge's SFT defaults with these off, so a run adds only its own feature
BASELINE: dict[str, Any] = {
    "model.position_embedding_type": "learned_absolute",
    "model.apply_rope_fusion": False,
    "ddp.check_for_nan_in_grad": False,
    "ddp.check_for_large_grads": False,
    "rerun_state_machine.check_for_nan_in_loss": False,
    "rerun_state_machine.check_for_spiky_loss": False,
    "logger.timing_log_level": 0,
}


@dataclass
class IterationRun:
    """What one run found: the host reads inside the captured region, where it stopped (if it did: the site and what
    could not run there), the TE kernels stood in for on the way, and Megatron-Core's refusal of the config (if it
    refused it: then nothing ran)."""

    reads: list[HostRead] = field(default_factory=list)
    stopped_at: str | None = None
    stood_in: list[str] = field(default_factory=list)
    refused: str | None = None


def _tiny_provider() -> Any:
    from megatron.bridge.models import GPTModelProvider

    return GPTModelProvider(
        num_layers=2,
        hidden_size=32,
        ffn_hidden_size=64,
        num_attention_heads=4,
        num_query_groups=4,
        kv_channels=8,
        vocab_size=64,
        seq_length=WIDTH,
        use_cpu_initialization=True,
        hidden_dropout=0.0,
        attention_dropout=0.0,
        params_dtype=torch.float32,
        bf16=False,
        gradient_accumulation_fusion=False,  # APEX's CUDA extension
        add_bias_linear=False,
    )


def probe_config(settings: dict[str, Any]) -> Any:
    """Megatron-Bridge's SFT defaults, offline packed at ``WIDTH`` with ``pad_cu_seqlens``, the baseline's fields
    off, then ``settings`` (dotted paths) applied."""
    from megatron.bridge.recipes.common import _sft_common

    from mbridge_seqpack.config_paths import set_path

    cfg = _sft_common()
    cfg.model = _tiny_provider()
    cfg.dataset.seq_length = WIDTH
    cfg.dataset.dataset_kwargs = {"pad_to_max_length": True}
    cfg.dataset.offline_packing_specs.packed_sequence_size = WIDTH
    cfg.dataset.offline_packing_specs.pad_cu_seqlens = True
    for path, value in {**BASELINE, **settings}.items():
        set_path(cfg, path, value)
    return cfg


def collate_packed_rows(
    rows: Any, width: int, mult: int, metadata: list[dict[str, int]], *, eos: int = EOS
) -> list[dict[str, Any]]:
    """Megatron-Bridge's packed collate (``GPTSFTPackedDataset.collate_fn`` with ``pad_cu_seqlens``, fixed width
    ``width``) over packed rows of sequences that train on the given numbers of tokens: the raw micro batches its
    data loader yields. Each sequence is ``n`` tokens and its EOS, padded with EOS as its prep pads for
    ``pad_seq_to_mult`` (the runtime length, tokens - 1, up to a multiple of ``mult``). The dataset object carries
    only what ``collate_fn`` reads (no pack file, no tokenizer)."""
    from megatron.bridge.data.packing.gpt_sft import GPTSFTPackedDataset

    class _Tokenizer:
        eos_id = eos

    dataset = GPTSFTPackedDataset.__new__(GPTSFTPackedDataset)
    dataset.tokenizer = _Tokenizer()
    dataset.pad_to_max_length = True
    dataset.max_seq_length = width
    dataset.pad_seq_length_to_mult = 1
    dataset._pad_seq_to_mult = mult
    dataset.pad_cu_seqlens = True
    dataset.answer_only_loss = True
    dataset.return_cu_seqlen = True
    dataset.pack_metadata = metadata
    batches = []
    for lengths in rows:
        ids: list[int] = []
        bounds = [0]
        for n in lengths:
            ids += [eos + 1 + i % 50 for i in range(n)] + [eos] * (1 + -(-n // mult) * mult - n)
            bounds.append(len(ids))
        item = {"input_ids": ids, "seq_boundaries": bounds, "loss_mask": [1] * len(ids)}
        batches.append(dataset.collate_fn([item]))
    return batches


def packed_batches(mult: int) -> list[dict[str, Any]]:
    """:func:`collate_packed_rows` over :data:`ROWS` at :data:`WIDTH`."""
    metadata = [
        {"max_samples_per_bin": max(len(r) for r in ROWS), "dataset_max_seqlen": WIDTH, "min_packed_seqlen": 1}
    ]
    return collate_packed_rows(ROWS, WIDTH, mult, metadata)


def _model(cfg: Any, recorder: Any) -> Any:
    """Megatron-Core's GPTModel from its local (non-TE) layer specs, core attention left out, in its DDP."""
    from megatron.core.distributed import DistributedDataParallel
    from megatron.core.models.gpt import GPTModel
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_decoder_block_spec, get_gpt_mtp_block_spec
    from megatron.core.transformer.identity_op import IdentityOp

    provider = cfg.model
    provider.finalize()
    block = get_gpt_decoder_block_spec(provider, use_transformer_engine=False)
    for layer in block.layer_specs:
        layer.submodules.self_attention.submodules.core_attention = IdentityOp
    mtp = None
    if provider.mtp_num_layers:
        mtp = get_gpt_mtp_block_spec(provider, block.layer_specs[-1], use_transformer_engine=False)
    model = GPTModel(
        provider,
        block,
        vocab_size=provider.vocab_size,
        max_sequence_length=WIDTH,
        position_embedding_type=provider.position_embedding_type,
        mtp_block_spec=mtp,
    )
    for tensor in [*model.parameters(), *model.buffers()]:
        recorder.on_device(tensor)
    return DistributedDataParallel(provider, cfg.ddp, model)


def kernel_boundary(exc: BaseException) -> str | None:
    """The TE/Megatron kernel a run stopped at (a CUDA-only call made with host tensors), else None."""
    if not isinstance(exc, (RuntimeError, torch.AcceleratorError)) or "CUDA" not in str(exc):
        return None
    return traceback_site(exc)


def first_line(exc: BaseException) -> str:
    return (str(exc).strip().split("\n")[0] or type(exc).__name__)[:300]


@dataclass
class StepParts:
    """What a step needs, built inside the CPU world: the config, the global state, the DDP-wrapped model, the
    process groups and Megatron-Bridge's forward step with the state injected."""

    cfg: Any
    state: Any
    model: Any
    pg: Any
    forward_step: Any


def build_step(cfg: Any, recorder: Any) -> StepParts:
    """The model and step wiring ``setup()`` gives a run (its ``_update_model_config_funcs``; the grad
    finalization an optimizer would bring; the run's ``Timers``)."""
    from megatron.bridge.training import gpt_step
    from megatron.bridge.training.setup import _update_model_config_funcs
    from megatron.bridge.training.state import GlobalState
    from megatron.bridge.training.utils.train_utils import prepare_forward_step_func
    from megatron.core.distributed import finalize_model_grads
    from megatron.core.process_groups_config import ProcessGroupCollection

    state = GlobalState()
    state.cfg = cfg
    ddp = _model(cfg, recorder)
    pg = ProcessGroupCollection.use_mpu_process_groups()
    provider = cfg.model
    provider.timers = state.timers
    _update_model_config_funcs([ddp], provider, cfg.ddp, None, pg_collection=pg)
    provider.finalize_model_grads_func = functools.partial(finalize_model_grads, pg_collection=pg)
    return StepParts(cfg, state, ddp, pg, prepare_forward_step_func(gpt_step.forward_step, state))


def forward_backward(parts: StepParts, data: Any, num_microbatches: int) -> Any:
    """Megatron-Core's schedule, called with the arguments Megatron-Bridge's ``train_step`` passes."""
    from megatron.core.pipeline_parallel.schedules import forward_backward_no_pipelining

    return forward_backward_no_pipelining(
        forward_step_func=parts.forward_step,
        data_iterator=data,
        model=[parts.model],
        num_microbatches=num_microbatches,
        seq_length=WIDTH,
        micro_batch_size=1,
        decoder_seq_length=WIDTH,
        forward_only=False,
        pg_collection=parts.pg,
    )


def unique_reads(reads: list[HostRead]) -> list[HostRead]:
    """Each (op, site) once, in the order first seen."""
    seen: set[tuple[str, str]] = set()
    out = []
    for read in reads:
        if (read.op, read.site) not in seen:
            seen.add((read.op, read.site))
            out.append(read)
    return out


@keeps_environment
def run_iteration(settings: dict[str, Any], *, injected: bool = True) -> IterationRun:
    """One full-iteration-graph step with the probe's ``settings`` (see :func:`probe_config`); ``injected`` puts
    mbridge_seqpack's ``data_read`` wrapper on the class for the run (or takes it off), as a launch with or without
    the plugin."""
    from devtools.capture.kernels import kernel_stand_ins
    from devtools.capture.recorder import recording_world
    from mbridge_seqpack.thd import inject

    run = IterationRun()
    cfg = probe_config(settings)
    try:
        cfg.model.finalize()
    except (AssertionError, ValueError) as exc:
        run.refused = f"{first_line(exc)} ({traceback_site(exc)})"
        return run
    batches = packed_batches(cfg.dataset.offline_packing_specs.pad_seq_to_mult)
    with inject.installed(injected), recording_world() as recorder, kernel_stand_ins(recorder, run.stood_in):
        _step_in_world(cfg, batches, recorder, run)
    run.reads = unique_reads(recorder.reads)
    return run


def _step_in_world(cfg: Any, batches: list[Any], recorder: Any, run: IterationRun) -> None:
    """The build and the captured step of :func:`run_iteration`, inside its world, recorded on ``run``: what they
    make is this frame's, freed before the world's collection (and with it the world's process groups)."""
    from megatron.core.full_cuda_graph import FullCudaGraphWrapper
    from megatron.core.pipeline_parallel.schedules import forward_backward_no_pipelining

    try:
        parts = build_step(cfg, recorder)
    except (AssertionError, ImportError) as exc:  # the one-rank CPU world lacks it (flex: TP x EP > 1, HybridEP)
        run.stopped_at = f"{traceback_site(exc)}: {first_line(exc)}"
        return
    wrapper = FullCudaGraphWrapper(forward_backward_no_pipelining, cuda_graph_warmup_steps=1)
    data = wrapper.data_read(iter(batches), [parts.model], True, len(batches))  # before the capture
    with recorder.capturing(True):
        try:
            forward_backward(parts, data, len(batches))
        except Exception as exc:
            site = kernel_boundary(exc)
            if site is None:
                raise
            run.stopped_at = f"{site}: {first_line(exc)}"
