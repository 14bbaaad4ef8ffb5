"""Mutation score of the THD / capture / CUDA-graph tests (issue #33). Not part of the test suite.

Each mutant rewrites one function of the code under test (a text substitution in its source, re-executed in its
module; or a table entry removed; or a text change of scripts/gpu_check.py, which tests/thd/test_gpu.py loads), then
the THD / capture / graph / gpu test files run in a fresh process (-x, the mutant's own group first); the mutant is
killed when any of them fails.

    PYTHONPATH=. python scripts/mutate_capture.py [--json out.json] [INDEX ...]   # every mutant, or the listed ones
    PYTHONPATH=. python scripts/mutate_capture.py --list

One process per mutant (Megatron-Bridge is imported in each: about 30-70 s a mutant on a 2-core machine).
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import inspect
import json
import os
import subprocess
import sys
import textwrap
import time
import warnings
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

FILES = {
    "capture": [
        "tests/devtools/test_capture_blind_spots.py",
        "tests/devtools/test_capture_recorder.py",
        "tests/devtools/test_capture_runs.py",
    ],
    "graph": ["tests/rules/test_graph_paths.py"],
    "thd": ["tests/thd/test_thd.py"],
    "gpu": ["tests/thd/test_gpu.py", "-k", "not dry_run and not without_cuda"],
}


@contextlib.contextmanager
def mutated(module_name: str, qualname: str, old: str, new: str):
    module = importlib.import_module(module_name)
    owner, name = module, qualname
    if "." in qualname:
        cls, name = qualname.split(".")
        owner = getattr(module, cls)
    original = owner.__dict__[name] if isinstance(owner, type) else getattr(owner, name)
    func = original
    if isinstance(original, (classmethod, staticmethod)):
        func = original.__func__
    elif isinstance(original, property):
        func = original.fget
    func = inspect.unwrap(func)
    source = textwrap.dedent(inspect.getsource(func))
    # drop decorators (e.g. @rule(...)); the registry entry is swapped below
    lines = source.splitlines(keepends=True)
    first = next(i for i, line in enumerate(lines) if line.lstrip().startswith("def "))
    source = "".join(lines[first:])
    assert source.count(old) >= 1, (qualname, old)
    namespace = dict(module.__dict__)
    exec(compile(source.replace(old, new), module.__file__, "exec"), namespace)
    replacement = namespace[func.__name__]
    if isinstance(original, staticmethod):
        replacement = staticmethod(replacement)
    elif isinstance(original, property):
        replacement = property(replacement)
    setattr(owner, name, replacement)
    rebound = []
    if owner is module:  # names imported elsewhere with `from module import name`
        for other in list(sys.modules.values()):
            try:
                bound = getattr(other, name, None)
            except Exception:  # noqa: BLE001  (modules with a raising __getattr__)
                continue
            if other is not module and bound is original:
                setattr(other, name, replacement)
                rebound.append(other)
    from mbridge_seqpack.rules import registry

    swapped = []
    for i, entry in enumerate(registry._CATALOG):
        if entry.fn is original:
            import dataclasses

            registry._CATALOG[i] = dataclasses.replace(entry, fn=replacement)
            swapped.append((i, entry))
    try:
        yield
    finally:
        setattr(owner, name, original)
        for other in rebound:
            setattr(other, name, original)
        for i, entry in swapped:
            registry._CATALOG[i] = entry


@contextlib.contextmanager
def gpu_source(old: str, new: str):
    """A mutant of scripts/gpu_check.py: tests/thd/test_gpu.py loads the script from SCRIPT."""
    import pathlib
    import tempfile

    import tests.thd.test_gpu as tg  # the module pytest then runs (--import-mode=importlib names it by its path)

    src = tg.SCRIPT.read_text()
    assert old in src, old
    tmp = pathlib.Path(tempfile.mkdtemp()) / "gpu_check.py"
    tmp.write_text(src.replace(old, new))
    saved = tg.SCRIPT
    tg.SCRIPT = tmp
    try:
        yield
    finally:
        tg.SCRIPT = saved


@contextlib.contextmanager
def dict_pop(module_name: str, attr: str, key_expr: str):
    module = importlib.import_module(module_name)
    table = getattr(module, attr)
    key = eval(key_expr, module.__dict__)
    value = table.pop(key)
    try:
        yield
    finally:
        table[key] = value


R = "devtools.capture.recorder"
ST = "mbridge_seqpack.capture.stand_ins"
IT = "devtools.capture.iteration"
LY = "devtools.capture.layers"
VD = "mbridge_seqpack.capture.verdicts"
CG = "mbridge_seqpack.rules.cuda_graphs"
GP = "mbridge_seqpack.analysis.graph_paths"
INJ = "mbridge_seqpack.thd.inject"
CO = "mbridge_seqpack.capture.conditions"
TL = "mbridge_seqpack.thd.layout"

MUTANTS = [
    ("recorder: tolist() not a read (hides RoPE's)", lambda: dict_pop(R, "_VALUE_READS", "_T.tolist"), "capture"),
    ("recorder: item() not a read", lambda: dict_pop(R, "_VALUE_READS", "_T.item"), "capture"),
    (
        "recorder: bool(tensor) not a read (hides the grad check)",
        lambda: dict_pop(R, "_VALUE_READS", "_T.__bool__"),
        "capture",
    ),
    (
        "recorder: repeat_interleave without output_size not recorded (hides seq_idx)",
        lambda: mutated(R, "HostReadRecorder.check_read", 'kwargs.get("output_size") is None', "False"),
        "capture",
    ),
    (
        "recorder: tensor slice bounds not recorded (hides MTP's roll)",
        lambda: mutated(
            R,
            "HostReadRecorder._check_indexing",
            "any(self.is_device(b) for b in (part.start, part.stop, part.step))",
            "False",
        ),
        "capture",
    ),
    (
        "recorder: .cpu() of a device tensor not recorded (hides max_seqlen's)",
        lambda: mutated(ST, "DeviceTracker.__torch_function__", 'self.record("device-to-host copy (.cpu())")', "pass"),
        "capture",
    ),
    (
        "recorder: torch.cuda.synchronize not recorded (hides the timers)",
        lambda: mutated(ST, "cuda_patches", 'tracker.record("synchronization (torch.cuda.synchronize)")', "pass"),
        "capture",
    ),
    (
        "recorder: t[mask] = scalar counted as a read (masked_fill_ fast path dropped)",
        lambda: mutated(
            R, "HostReadRecorder._masked_fill", "return len(masks) == 1 and not others and host_value", "return False"
        ),
        "capture",
    ),
    (
        "recorder: device tensors report the CPU (GPU branches not taken)",
        lambda: mutated(
            ST,
            "DeviceTracker.__torch_function__",
            "if owner is _DEVICE_GETTER or owner is _IS_CUDA_GETTER:",
            "if False:",
        ),
        "capture",
    ),
    (
        "recorder: reads recorded before the capture (data_read's work counted)",
        lambda: mutated(R, "HostReadRecorder.recording", "return self._recording and", "return"),
        "capture",
    ),
    (
        "recorder: a thread started in the step runs outside the mode (its reads unseen)",
        lambda: mutated(R, "_watches", "recorder.traced(thread)", "pass"),
        "capture",
    ),
    (
        "recorder: a collective over a host tensor not recorded",
        lambda: mutated(R, "HostReadRecorder._check_collective", "not self.is_device(leaf)", "False"),
        "capture",
    ),
    (
        "recorder: the real-device mode stands in like the CPU one (nothing on the GPU recorded)",
        lambda: mutated(
            R,
            "HostReadRecorder.is_device",
            "return isinstance(value, torch.Tensor) and value.device.type == self.real_device",
            "pass",
        ),
        "capture",
    ),
    (
        "recorder: a D2H copy_ into a host tensor not recorded",
        lambda: mutated(
            ST,
            "DeviceTracker.__torch_function__",
            'self.record("device-to-host copy (copy_ into a host tensor)")',
            "pass",
        ),
        "capture",
    ),
    (
        "iteration: the RoPE step skipped (probe settings lose the position embedding)",
        lambda: mutated(IT, "probe_config", "{**BASELINE, **settings}", "{**settings, **BASELINE}"),
        "capture",
    ),
    (
        "iteration: the run never installs the injection",
        lambda: mutated(IT, "run_iteration", "inject.installed(injected)", "inject.installed(False)"),
        "capture",
    ),
    (
        "iteration: data_read skipped (raw host batches go straight to the step)",
        lambda: mutated(
            IT,
            "_step_in_world",
            "forward_backward(parts, data, len(batches))",
            "forward_backward(parts, iter(batches), len(batches))",
        ),
        "capture",
    ),
    (
        "iteration: alignment ignored by the collate",
        lambda: mutated(IT, "collate_packed_rows", "dataset._pad_seq_to_mult = mult", "dataset._pad_seq_to_mult = 1"),
        "capture",
    ),
    (
        "layers: stand-ins on every layer (Megatron's _layer_is_graphable ignored)",
        lambda: mutated(LY, "_install_stand_ins", "if _layer_is_graphable(layer, config):", "if True:"),
        "capture",
    ),
    (
        "layers: the hybrid stack called without packed params",
        lambda: mutated(LY, "_hybrid_scope_in_world", "packed_seq_params=params,", "packed_seq_params=None,"),
        "capture",
    ),
    (
        "conditions: non-fused RoPE never present",
        lambda: mutated(CO, "_rope", 'in ("rope", "yarn", "mrope")', "in ()"),
        "graph",
    ),
    (
        "conditions: model kinds ignore the hybrid pattern",
        lambda: mutated(CO, "model_layer_kinds", "if pattern:", "if False:"),
        "graph",
    ),
    (
        "verdicts: safe_scope keeps failing modules ([attn, mamba] -> [mamba])",
        lambda: mutated(VD, "Verdicts.safe_scope", "and self.module_safe(m, kinds)]", "]"),
        "graph",
    ),
    (
        "verdicts: a module counts as safe when it graphs nothing",
        lambda: mutated(VD, "Verdicts.module_safe", "return bool(graphed) and", "return"),
        "graph",
    ),
    (
        "verdicts: asserting scopes not failing",
        lambda: mutated(
            VD, "ScopeVerdict.fails", 'return self.outcome == "asserts" or bool(self.reads)', "return bool(self.reads)"
        ),
        "graph",
    ),
    (
        "rules: capture_host_reads reports nothing for full iteration",
        lambda: mutated(CG, "capture_host_reads", "found = verdicts.present_conditions(ctx.cfg)", "found = []"),
        "graph",
    ),
    (
        "rules: capture_host_reads fixes a model condition by a field flip",
        lambda: mutated(
            CG,
            "capture_host_reads",
            "leave = [p.name for p, _ in found if p.fix is None or p.fix(ctx.cfg) is None]",
            "leave = []",
        ),
        "graph",
    ),
    (
        "rules: te_scope_inputs reports nothing",
        lambda: mutated(CG, "te_scope_inputs", "if not failing:", "if True:"),
        "graph",
    ),
    (
        "rules: a replaced data_read accepted",
        lambda: mutated(
            CG,
            "full_iteration_needs_injection",
            'if state in ("installed", "launch"):',
            'if state in ("installed", "launch", "replaced"):',
        ),
        "graph",
    ),
    (
        "inject: the env variable alone counts (start-up hook not checked)",
        lambda: mutated(
            INJ,
            "injection_state",
            "if env_mode() in ACTIVE_MODES and autoload_present():",
            "if env_mode() in ACTIVE_MODES:",
        ),
        "graph",
    ),
    (
        "inject: the class attribute not checked (module flag trusted)",
        lambda: mutated(
            INJ,
            "injection_state",
            'if is_installed():\n        return "replaced"',
            'if is_installed():\n        return "installed"',
        ),
        "graph",
    ),
    (
        "graph_paths: a scope's cell ignores its failing module",
        lambda: mutated(
            GP, "_te_capture", "return next((m for m in known if m in failing), known[0])", "return known[0]"
        ),
        "graph",
    ),
    (
        "inject: host max_seqlen not handed to the step",
        lambda: mutated(
            INJ, "host_max_seqlen", "out.append({**static, **host} if host else static)", "out.append(static)"
        ),
        "thd",
    ),
    (
        "gpu_check: max_diff lets NaN through (max(worst, nan))",
        lambda: gpu_source(
            "        if not (bool(torch.isfinite(x).all()) and bool(torch.isfinite(y).all())):\n"
            "            return math.inf\n",
            "",
        ),
        "gpu",
    ),
    (
        "gpu_check: compact inputs not masked (unwritten tail gradients flow back)",
        lambda: gpu_source(
            "torch.where(keep, t.index_select(0, where), torch.zeros_like(t))", "t.index_select(0, where)"
        ),
        "gpu",
    ),
    (
        "gpu_check: kernel output past the end not zeroed",
        lambda: gpu_source("    out_c = torch.where(keep, out_c, torch.zeros_like(out_c))\n", ""),
        "gpu",
    ),
    (
        "gpu_check: the launch path without the injection",
        lambda: gpu_source(
            "    with inject.installed(True):\n        [statics]",
            "    with contextlib.nullcontext():\n        [statics]",
        ),
        "gpu",
    ),
    (
        "gpu_check: the step's host reads not required empty",
        lambda: gpu_source('clean = not info["step_host_reads"] and', "clean ="),
        "gpu",
    ),
    (
        "gpu_check: non-finite noise passes",
        lambda: gpu_source("    if not math.isfinite(noise):\n        return 0.0\n", ""),
        "gpu",
    ),
    (
        "conditions: drop-and-pad MoE counted as capacity-limited",
        lambda: mutated(
            CO,
            "moe_mode",
            'return "drop_and_pad" if _m(cfg, "moe_pad_expert_input_to_capacity", False) else',
            "return",
        ),
        "graph",
    ),
    (
        "conditions: MoE needs more than 8 experts",
        lambda: mutated(CO, "model_layer_kinds", "if experts <= 1:", "if experts <= 8:"),
        "graph",
    ),
    (
        "thd: capacity padding repeats zero instead of the last boundary",
        lambda: mutated(
            TL, "pad_cu_seqlens", "tail = cu[..., -1:].expand(", "tail = torch.zeros_like(cu[..., -1:]).expand("
        ),
        "thd",
    ),
    (
        "thd: capacity overflow not refused",
        lambda: mutated(TL, "pad_cu_seqlens", "if n > capacity:", "if False:"),
        "thd",
    ),
    (
        "thd: decreasing boundaries accepted",
        lambda: mutated(TL, "validate_cu_seqlens", "if (steps < 0).any():", "if False:"),
        "thd",
    ),
    (
        "thd: a row short of the width is not closed by a padding segment",
        lambda: mutated(TL, "static_cu_seqlens", "if int(physical[-1]) < row_width:", "if False:"),
        "thd",
    ),
    (
        "thd: PackedSeqParams without the physical boundaries",
        lambda: mutated(TL, "static_packed_seq_params", "cu_seqlens_q_padded=padded,", "cu_seqlens_q_padded=None,"),
        "thd",
    ),
    (
        "inject: a changing batch shape accepted",
        lambda: mutated(INJ, "HostMaxSeqlen.check", "elif shapes != self.shapes:", "elif False:"),
        "thd",
    ),
    (
        "inject: a changing max_seqlen accepted",
        lambda: mutated(INJ, "HostMaxSeqlen.check", "if number != first:", "if False:"),
        "thd",
    ),
]


def run_one(index: int) -> dict:
    """In this process: apply mutant ``index`` and run the test groups until one fails."""
    warnings.simplefilter("ignore")
    sys.path.insert(0, str(ROOT))
    os.chdir(ROOT)
    import megatron.bridge.training.config  # noqa: F401  (imported before the mutant, as the tests do)
    import pytest

    name, make, group = MUTANTS[index] if index >= 0 else ("baseline (no mutant)", contextlib.nullcontext, "capture")
    start = time.time()
    killed_by = None
    with make():
        for g in [group] + [g for g in FILES if g != group]:
            code = pytest.main(["-x", "-q", "-p", "no:cacheprovider", "-W", "ignore", *FILES[g]])
            if code != 0:
                killed_by = g
                break
    return {"index": index, "mutant": name, "killed_by": killed_by, "seconds": round(time.time() - start)}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("indices", nargs="*", type=int)
    parser.add_argument("--json", default=None, help="write the results here")
    parser.add_argument("--list", action="store_true")
    parser.add_argument("--one", type=int, default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.list:
        for i, (name, _, group) in enumerate(MUTANTS):
            print(f"{i:3d} [{group}] {name}")
        return 0
    if args.one is not None:
        print("RESULT " + json.dumps(run_one(args.one)), flush=True)
        return 0
    results = []
    for i in [-1, *(args.indices or range(len(MUTANTS)))]:  # -1: the unmutated code must pass every group
        done = subprocess.run([sys.executable, __file__, "--one", str(i)], capture_output=True, text=True, cwd=ROOT)
        line = next((x for x in done.stdout.splitlines() if x.startswith("RESULT ")), None)
        if line is None:
            result = {"index": i, "mutant": str(i), "killed_by": None, "error": done.stderr[-2000:]}
        else:
            result = json.loads(line[len("RESULT ") :])
        if i < 0:
            if result["killed_by"] or "error" in result:
                print(f"BASELINE FAILS ({result.get('killed_by')}): fix the tests before scoring mutants", flush=True)
                return 1
            print(f"BASELINE passes every group ({result['seconds']} s)", flush=True)
            continue
        results.append(result)
        state = "KILLED by " + result["killed_by"] if result["killed_by"] else "SURVIVED"
        print(f"MUTANT {i} {state}: {result['mutant']}", flush=True)
        if args.json:
            Path(args.json).write_text(json.dumps(results, indent=1))
    killed = sum(1 for r in results if r["killed_by"])
    print(f"killed {killed} / {len(results)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
