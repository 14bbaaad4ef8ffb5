"""contract/observations.py's runner: every generator seeded before each observation (a function that draws from
Python's, NumPy's or torch's global state observes the same draws in every record), and an observation's own
failure recorded, never raised."""

from __future__ import annotations

import random
from pathlib import Path

import numpy as np
import torch

from mbridge_seqpack.contract.observations import Absent, Context, NotRun, Observation, _one


def _draws(ctx: Context) -> list[float]:
    return [random.random(), float(np.random.rand()), float(torch.rand(1).item())]


def test_each_observation_starts_from_the_same_seeds(tmp_path: Path) -> None:
    ctx = Context(tmp_path)
    obs = Observation("draws", "random:random", "three draws", _draws)
    first = _one(obs, ctx)
    _draws(ctx)  # the global state moved on between observations
    assert _one(obs, ctx) == first
    assert first["status"] == "ok" and len(set(first["value"])) == 3


def test_what_cannot_be_observed_is_recorded_with_why(tmp_path: Path) -> None:
    ctx = Context(tmp_path)

    def absent(ctx: Context) -> None:
        raise Absent("megatron.bridge.training.gpt_step:get_batch: ImportError: mcore")

    def not_run(ctx: Context) -> None:
        raise NotRun("needs a GPU")

    def broken(ctx: Context) -> None:
        raise KeyError("row")

    got = [_one(Observation(f.__name__, "m:f", "i", f), ctx) for f in (absent, not_run, broken)]
    assert [(g["status"], g["why"]) for g in got] == [
        ("absent", "megatron.bridge.training.gpt_step:get_batch: ImportError: mcore"),
        ("not_run", "needs a GPU"),
        ("not_run", "KeyError: 'row'"),
    ]
