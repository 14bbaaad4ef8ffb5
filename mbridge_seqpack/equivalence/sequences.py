"""The check's sequences: short, distinct, as a prompt / answer SFT dataset and a multi-turn chat give them.

Each is the stored form the dataset's preprocessing hands to packing (tokens and the final EOS) with a per-token
answer mask over those stored tokens. One has EOS tokens inside it, as chat templates end each turn with one.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["EOS", "PAD", "VOCAB", "Sample", "SAMPLES", "PLAIN", "samples_of"]

EOS = 2
PAD = 0  # the in-batch collate's pad token (tokenizer.pad_token_id)
VOCAB = 64


@dataclass(frozen=True)
class Sample:
    """Stored tokens (ending in EOS) and which of them are answer tokens (trained as labels)."""

    ids: tuple[int, ...]
    answer: tuple[int, ...]

    @property
    def inputs(self) -> int:
        """Input positions at run time: every stored token but the last (labels are the next token)."""
        return len(self.ids) - 1


def _prompt_answer(first: int, prompt: int, answer: int) -> Sample:
    ids = tuple(first + i for i in range(prompt + answer)) + (EOS,)
    return Sample(ids, (0,) * prompt + (1,) * (answer + 1))


def _chat(first: int) -> Sample:
    """user turn, EOS, header, assistant turn, EOS, user turn, EOS, header, assistant turn, EOS."""
    u1, a1, u2, a2 = (first, first + 1), (first + 2, first + 3, first + 4), (first + 5,), (first + 6, first + 7)
    head = first + 8
    ids = (*u1, EOS, head, *a1, EOS, *u2, EOS, head, *a2, EOS)
    mask = (0, 0, 0, 0, 1, 1, 1, 1, 0, 0, 0, 1, 1, 1)
    return Sample(ids, mask)


#: five sequences of 4, 9, 3, 13 and 6 input positions; the fourth is the chat one (a prompt / answer dataset gets a
#: prompt / answer sequence of the same length there: its texts hold no EOS)
SAMPLES: tuple[Sample, ...] = (
    _prompt_answer(11, 2, 2),
    _prompt_answer(21, 4, 5),
    _prompt_answer(31, 1, 2),
    _chat(41),
    _prompt_answer(51, 3, 3),
)
PLAIN: tuple[Sample, ...] = SAMPLES[:3] + (_prompt_answer(41, 6, 7),) + SAMPLES[4:]


def samples_of(chat: bool) -> tuple[Sample, ...]:
    """The check's sequences for a chat dataset (EOS inside turns) or a prompt / answer one."""
    return SAMPLES if chat else PLAIN
