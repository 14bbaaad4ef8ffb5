"""The launch in miniature on CPU: the model built and wrapped as the launch builds it, and one step through it.

Megatron-Bridge's ``provide_distributed_model`` with Megatron-Core's DDP over the config's ``ddp``, at shrunk widths
with every other switch kept, in a one-rank gloo world (``build.py``); one packed and one unpacked step of
``gpt_step.forward_step`` through that model (``step.py``; issue #49)."""

#: what the packed step covers, in words (a config outside it gets no step verdict: n/a, never OK)
STEP_SCOPE = (
    "Megatron-Bridge's GPT model (a provider that keeps GPTModelProvider.provide) with a GPT layer spec, at "
    "context_parallel_size 1, without virtual pipeline stages, MTP, multi-latent attention or the flex dispatcher"
)

#: the variable that turns the miniature launch on (``1``): opt-in until Megatron-Bridge's recipe zoo has been run
#: through it (its memory on the zoo's largest towers and expert counts is not yet bounded)
LAUNCH_ENV = "MBRIDGE_SEQPACK_LAUNCH"


def enabled() -> bool:
    """Whether the miniature launch runs in this process (``MBRIDGE_SEQPACK_LAUNCH=1``)."""
    import os

    return os.environ.get(LAUNCH_ENV, "").strip().lower() in ("1", "true", "on", "yes")
