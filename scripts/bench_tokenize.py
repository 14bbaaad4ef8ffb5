"""Benchmark: ``pack`` end to end (tokenize, pack, balance, sealed write) against its limit, the tokenizer's own batch
encoding of the same texts, and against Megatron-Bridge's own ``prepare_gpt_sft_packed_data`` on the same JSONL and
tokenizer; best of 3 runs per contender, each contender in a process of its own; then every pack is checked to hold
exactly the sequences of Megatron-Bridge's (tokens and loss mask, byte for byte).

The limit. ``pack`` tokenizes with Megatron-Bridge's dataset code, but encodes the prompt-template pieces of a chunk
of examples in one call of the Hugging Face tokenizer (tokenization/batched_tokens.py). A first run records exactly the
text lists it passes to the tokenizer (each chunk's distinct pieces); the tokenizer's encoding is then timed alone on
those lists, as ``pack`` calls it (``transformers`` on the first text, which sets the Rust tokenizer's state, then
the Rust ``encode_batch_fast`` on the rest, the ids read out), with a freshly loaded tokenizer and the same cores.
On a machine shared with others the load changes by 2-3x within minutes, so the encoding is timed in every
contender's process beside each of its runs (before it on even runs, after it on odd ones). Each run gives one
ratio, the contender's time over the encoding beside it (the load of the moment cancels); a contender's ratio is the
median of its runs' (the spread printed beside it), and its best wall and CPU times are printed too (best of 3).
CPU seconds (user and system, every thread and worker) are reported beside wall seconds, and so is the CPU ratio.
``--resummarize JSON`` recomputes the ratios and the summary from the raw times a stored run holds.

Contenders: ``pack --no-balance`` (batched tokenization and best-fit decreasing only: the work Megatron-Bridge's
prep does) and ``pack`` as it runs by default (work balance and step leveling included); ``pack`` on
Megatron-Bridge's per-example tokenization (``batched=False``); Megatron-Bridge's prep with every core (its pool;
it packs first-fit-decreasing and does not balance) and with its default workers (-1: serial). Each run starts
from a fresh tokenizer, output directory, index directory and digest cache. The corpus is the embedded one
repeated, 56 copies by default (100,744 records), each copy's prompts and answers made distinct (no text repeats);
``--answers repeated`` keeps every answer as it is in each copy (answers shared across examples, which the pack
encodes once per chunk).

    uv run python scripts/bench_tokenize.py [--copies 56] [--answers repeated --out F] [--repeats 3]
    uv run python scripts/bench_tokenize.py --resummarize docs/bench/bench_tokenize.json
"""

from __future__ import annotations

import argparse
import collections
import functools
import hashlib
import json
import os
import pickle
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Callable

import numpy as np

os.environ.setdefault("TQDM_DISABLE", "1")
ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

CONTENDERS = (
    "mbridge_seqpack_no_balance",
    "mbridge_seqpack",
    "mbridge_seqpack_per_example",
    "megatron_bridge_all_cores",
    "megatron_bridge_default",
)
REFERENCE = "megatron_bridge_all_cores"  # the pack every other one must hold the sequences of


def _corpus(path: Path, copies: int, answers: str = "distinct") -> int:
    """The embedded corpus ``copies`` times, every prompt made distinct; every answer too, or (``repeated``) each
    answer the same in every copy (answers shared across examples: the pack encodes each distinct text once)."""
    from mbridge_seqpack.recipes.building_blocks import embedded_data_dir

    rows = [json.loads(line) for line in (embedded_data_dir() / "training.jsonl").read_text().splitlines()]
    with open(path, "w") as out:
        for copy in range(copies):
            for row in rows:
                variant = f" (variant {copy})"
                answer = row["output"] + variant if answers == "distinct" else row["output"]
                out.write(json.dumps({**row, "input": row["input"] + variant, "output": answer}) + "\n")
    return len(rows) * copies


def _sequence_digests(path: Path) -> collections.Counter:
    """The multiset of sequences (tokens and stored loss mask, as int64 / int8 bytes) a packed parquet file holds."""
    import pyarrow.parquet as pq

    table = pq.read_table(str(path), columns=["input_ids", "loss_mask", "seq_start_id"])
    flat = {name: table.column(name).combine_chunks() for name in ("input_ids", "loss_mask", "seq_start_id")}
    tokens = flat["input_ids"].values.to_numpy(zero_copy_only=False).astype(np.int64)
    mask = flat["loss_mask"].values.to_numpy(zero_copy_only=False).astype(np.int8)
    row_starts = flat["input_ids"].offsets.to_numpy()
    starts_per_row = np.diff(flat["seq_start_id"].offsets.to_numpy())
    starts = flat["seq_start_id"].values.to_numpy().astype(np.int64) + np.repeat(row_starts[:-1], starts_per_row)
    ends = np.append(starts[1:], 0)
    ends[np.cumsum(starts_per_row) - 1] = row_starts[1:]  # a row's last sequence ends with the row
    return collections.Counter(
        hashlib.sha256(tokens[s:e].tobytes() + mask[s:e].tobytes()).digest() for s, e in zip(starts, ends)
    )


def _pack(src: Path, out: Path, pack_size: int, *, balance: bool, batched: bool) -> dict:
    from mbridge_seqpack.pipeline.pack import PackOptions, pack_jsonl
    from mbridge_seqpack.recipes.building_blocks import embedded_tokenizer_dir

    result = pack_jsonl(
        {"training": src},
        tokenizer=embedded_tokenizer_dir(),
        output_dir=out,
        options=PackOptions(pack_size=pack_size, balance=balance),
        batched=batched,
    )
    return result.splits["training"].to_json()


def capture_texts(src: Path, work: Path, pack_size: int) -> dict:
    """Run ``pack --no-balance`` once, recording every text list it passes to the tokenizer (each chunk's pieces
    not yet encoded), into ``work/texts.pkl``."""
    from mbridge_seqpack.tokenization import batched_tokens

    lists: list[list[str]] = []
    encode = batched_tokens.BatchedTokenizer.encode

    def recording(self: batched_tokens.BatchedTokenizer, texts: list[str]) -> None:
        lists.append([text for text in dict.fromkeys(texts) if text not in self._ids])
        encode(self, texts)

    batched_tokens.BatchedTokenizer.encode = recording  # type: ignore[method-assign]
    entry = _pack(src, work / "captured", pack_size, balance=False, batched=True)
    if entry["tokenization"] != "batched":
        raise SystemExit(f"pack did not batch its tokenization: {entry['tokenization']}")
    with open(work / "texts.pkl", "wb") as out:
        pickle.dump(lists, out)
    return {"calls": len(lists), "texts": sum(map(len, lists)), "characters": sum(len(t) for x in lists for t in x)}


def _encoding(work: Path) -> Callable[[], None]:
    """The tokenizer alone on the recorded lists, as ``pack`` calls it, with a tokenizer loaded for this run (the
    lists and the tokenizer are loaded before the timing starts)."""
    from mbridge_seqpack.recipes.building_blocks import embedded_tokenizer_dir
    from mbridge_seqpack.tokenization.batched_tokens import _hf_tokenizer
    from mbridge_seqpack.tokenization.sequences import load_megatron_tokenizer

    with open(work.parent / "texts.pkl", "rb") as handle:
        lists = pickle.load(handle)
    hf = _hf_tokenizer(load_megatron_tokenizer(embedded_tokenizer_dir()))

    def encode() -> None:
        for texts in lists:
            hf(texts[:1]).input_ids  # sets the Rust tokenizer's state (no truncation or padding), as pack's first call
            [encoding.ids for encoding in hf._tokenizer.encode_batch_fast(texts[1:], add_special_tokens=True)]

    return encode


def _megatron_bridge(src: Path, work: Path, pack_size: int, workers: int) -> Callable[[], None]:
    """Megatron-Bridge's prep, with its tokenizer loaded before the timing starts (``pack`` loads its own inside)."""
    from megatron.bridge.data.builders.gpt_sft import build_gpt_sft_split
    from megatron.bridge.data.packing.offline import prepare_gpt_sft_packed_data

    from mbridge_seqpack.recipes.building_blocks import embedded_tokenizer_dir
    from mbridge_seqpack.tokenization.sequences import load_megatron_tokenizer

    return functools.partial(
        prepare_gpt_sft_packed_data,
        input_path=src,
        output_path=work / "mb.idx.parquet",
        output_metadata_path=work / "mb_metadata.jsonl",
        packed_sequence_size=pack_size,
        tokenizer=load_megatron_tokenizer(embedded_tokenizer_dir()),
        max_seq_length=pack_size,
        seed=0,
        dataset_kwargs={"index_mapping_dir": str(work / "index")},
        pad_seq_to_mult=1,
        num_tokenizer_workers=workers,
        dataset_builder=build_gpt_sft_split,
    )


def _nothing_to_ready(work: Callable[[], object]) -> Callable[[], object]:
    return work


def _cpu() -> float:
    """CPU seconds of this process (every thread) and of its finished children (a worker pool)."""
    own, children = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime


def _timed(work: Callable[[], object]) -> tuple[float, float, object]:
    """Wall and CPU seconds of ``work()``, and what it returned."""
    wall, cpu = time.perf_counter(), _cpu()
    result = work()
    return time.perf_counter() - wall, _cpu() - cpu, result


def run_one(name: str, src: Path, work: Path, pack_size: int, repeats: int) -> dict:
    """``repeats`` runs of one contender in this process (the imports paid before the first), each in a fresh
    directory ``work/run<i>`` with a fresh digest cache, each beside one run of the tokenizer's encoding: wall and
    CPU seconds of both, and this process's peak RSS."""
    from mbridge_seqpack.recipes.building_blocks import embedded_tokenizer_dir
    from mbridge_seqpack.tokenization.sequences import load_megatron_tokenizer

    load_megatron_tokenizer(embedded_tokenizer_dir())  # the imports, not timed
    cores = len(os.sched_getaffinity(0))
    times: dict[str, list[float]] = {"seconds": [], "cpu_s": [], "encode_seconds": [], "encode_cpu_s": []}
    tokens = 0
    for index in range(repeats):
        run = work / f"run{index}"
        run.mkdir()
        os.environ["MBRIDGE_SEQPACK_CACHE_DIR"] = str(run / "digests")  # no digest remembered from a previous run
        if name.startswith("megatron_bridge"):
            workers = -1 if name == "megatron_bridge_default" else cores
            contender = functools.partial(_megatron_bridge, src, run, pack_size, workers)
        else:
            balance, batched = name != "mbridge_seqpack_no_balance", name != "mbridge_seqpack_per_example"
            pack = functools.partial(_pack, src, run / "ours", pack_size, balance=balance, batched=batched)
            contender = functools.partial(_nothing_to_ready, pack)  # pack loads its tokenizer itself, timed
        # (what is timed, made ready untimed): the encoding before the contender on even runs, after it on odd ones
        steps = [("encode", functools.partial(_encoding, work)), ("", contender)]
        for prefix, prepare in steps if index % 2 == 0 else steps[::-1]:
            wall, cpu, result = _timed(prepare())
            times[f"{prefix}_seconds".lstrip("_")].append(wall)
            times[f"{prefix}_cpu_s".lstrip("_")].append(cpu)
            if isinstance(result, dict):  # a pack's split entry
                tokens = int(result["stats"]["total_tokens"])
    children = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    peak = max(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss, children)
    return {**times, "peak_rss_mib": peak / 1024, "tokens": tokens}


def summarize(run: dict) -> dict:
    """The report of a run: per contender its best wall and CPU times (of ``repeats``), its time over the encoding
    beside it in each run (paired, so that the load of the moment cancels) and the median of those, the same for CPU,
    and its speed against Megatron-Bridge's prep (all cores) from those medians."""
    results = run["results"]
    for r in results.values():
        for key in ("seconds", "cpu_s", "encode_seconds", "encode_cpu_s"):
            r[f"best_{key}"] = min(r[key])
        r["paired_over_encode"] = [c / e for c, e in zip(r["seconds"], r["encode_seconds"])]
        r["paired_cpu_over_encode"] = [c / e for c, e in zip(r["cpu_s"], r["encode_cpu_s"])]
        r["over_encode"] = statistics.median(r["paired_over_encode"])
        r["cpu_over_encode"] = statistics.median(r["paired_cpu_over_encode"])
        r["best_over_best_encode"] = r["best_seconds"] / r["best_encode_seconds"]
    reference = results[REFERENCE]["over_encode"]
    return {
        **run,
        "tokenizer_encode_best_s": min(r["best_encode_seconds"] for r in results.values()),
        "time_over_tokenizer_encode": {name: r["over_encode"] for name, r in results.items()},
        "cpu_over_tokenizer_encode": {name: r["cpu_over_encode"] for name, r in results.items()},
        "megatron_bridge_all_cores_over": {name: reference / r["over_encode"] for name, r in results.items()},
    }


#: the docs/packing.md table's name of each contender
LABELS = {
    "megatron_bridge_default": "Megatron-Bridge `prepare_gpt_sft_packed_data`, default `num_tokenizer_workers=-1` "
    "(serial)",
    "megatron_bridge_all_cores": "the same with 2 workers (its pool pickles every example back)",
    "mbridge_seqpack_per_example": "`pack` on Megatron-Bridge's per-example path (`batched=False`), balance on",
    "mbridge_seqpack_no_balance": "`pack --no-balance`: batched tokenization, assembly in arrays, BFD, sealed write",
    "mbridge_seqpack": "`pack` (default): plus work balance and step leveling",
}


def table(distinct: dict, shared: dict) -> str:
    """The docs/packing.md table of two recorded runs, distinct text and answers shared (``scripts/generate.py``
    renders it from the JSON); ours in bold: the speeds, and the distinct-text ratio the goal is about."""

    def cells(report: dict, name: str, bold: bool, bold_ratio: bool) -> str:
        r = report["results"][name]
        ratio = f"{r['over_encode']:.2f}x"
        spread = f"({min(r['paired_over_encode']):.2f}-{max(r['paired_over_encode']):.2f})"
        speed = f"{report['megatron_bridge_all_cores_over'][name]:.2f}x"
        if bold:
            ratio, speed = (f"**{ratio}**" if bold_ratio else ratio), f"**{speed}**"
        best = f"{r['best_seconds']:.1f} s / {r['best_cpu_s']:.1f} s"
        return f"{ratio} {spread} / {r['cpu_over_encode']:.2f}x | {best} | {speed}"

    lines = [
        f"| contender | distinct: x the encoding, wall (spread) / CPU | best of {distinct['repeats']}, wall / CPU | "
        f"speed vs MB | answers shared: x the encoding, wall (spread) / CPU | best of {shared['repeats']} | "
        "speed vs MB |",
        "|---|---|---|---|---|---|---|",
    ]
    for name, label in LABELS.items():
        ours = name in ("mbridge_seqpack_no_balance", "mbridge_seqpack")
        lines.append(f"| {label} | {cells(distinct, name, ours, True)} | {cells(shared, name, ours, False)} |")
    return "\n".join(lines)


def show(report: dict) -> None:
    results, repeats = report["results"], report["repeats"]
    print(f"the tokenizer's encoding alone: best {report['tokenizer_encode_best_s']:.1f} s")
    for name, r in results.items():
        print(
            f"{name:30s} {r['best_seconds']:7.1f} s, {r['best_cpu_s']:6.1f} s CPU (best of {repeats}); "
            f"{r['over_encode']:5.2f}x the encoding beside it ({min(r['paired_over_encode']):.2f}-"
            f"{max(r['paired_over_encode']):.2f}x; {r['cpu_over_encode']:.2f}x its CPU; medians of {repeats}); "
            f"{report['megatron_bridge_all_cores_over'][name]:5.2f}x Megatron-Bridge's speed (all cores); peak RSS "
            f"{r['peak_rss_mib']:.0f} MiB"
        )
    texts, load = report["tokenizer_texts"], report["load_average"]
    print(
        f"{report['records']:,} records ({report['answers']} answers), {report['tokens']:,} tokens, "
        f"{report['cores']} cores; the tokenizer encoded {texts['texts']:,} texts in {texts['calls']} call"
        f"{'s' * (texts['calls'] != 1)}; every "
        f"pack holds exactly the sequences (tokens and loss mask, byte for byte) of Megatron-Bridge's prep; load "
        f"average {load['start'][0]:.1f} -> {load['end'][0]:.1f}"
    )


def _subprocess(args: list[str]) -> dict:
    done = subprocess.run([sys.executable, __file__, *args], capture_output=True, text=True)
    if done.returncode != 0:
        raise SystemExit(f"{args[:2]} failed:\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--copies", type=int, default=56, help="copies of the embedded corpus (1,799 records each)")
    parser.add_argument("--pack-size", type=int, default=4096)
    parser.add_argument(
        "--answers",
        choices=("distinct", "repeated"),
        default="distinct",
        help="make every answer distinct too, or keep each answer the same in every copy",
    )
    parser.add_argument("--repeats", type=int, default=3, help="runs per contender: best times, median ratios")
    parser.add_argument(
        "--contenders", default=",".join(CONTENDERS), help=f"comma-separated subset of {', '.join(CONTENDERS)}"
    )
    parser.add_argument("--out", default=str(ROOT / "docs" / "bench" / "bench_tokenize.json"))
    parser.add_argument("--one", choices=CONTENDERS, help=argparse.SUPPRESS)
    parser.add_argument("--capture", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--resummarize", metavar="JSON", help="recompute the summary of a stored run's times")
    parser.add_argument("--src", help=argparse.SUPPRESS)
    parser.add_argument("--work", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.resummarize:
        stored = json.loads(Path(args.resummarize).read_text())
        kept = ("seconds", "cpu_s", "encode_seconds", "encode_cpu_s", "peak_rss_mib", "tokens")
        if not all(isinstance(r.get("seconds"), list) for r in stored["results"].values()):
            raise SystemExit(f"{args.resummarize} holds no per-run times (written before they were kept)")
        stored["results"] = {name: {k: r[k] for k in kept} for name, r in stored["results"].items()}
        report = summarize(stored)  # its summary keys are computed anew
        show(report)
        Path(args.resummarize).write_text(json.dumps(report, indent=2) + "\n")
        return
    if args.capture:
        print(json.dumps(capture_texts(Path(args.src), Path(args.work), args.pack_size)))
        return
    if args.one:
        print(json.dumps(run_one(args.one, Path(args.src), Path(args.work), args.pack_size, args.repeats)))
        return

    names = [name for name in CONTENDERS if name in args.contenders.split(",")]
    if REFERENCE not in names:
        raise SystemExit(f"--contenders must include {REFERENCE} (the pack the others are compared with)")
    cores = len(os.sched_getaffinity(0))
    load = {"start": os.getloadavg()}
    results: dict[str, dict] = {}
    with tempfile.TemporaryDirectory() as tmp:
        src = Path(tmp) / "train.jsonl"
        records = _corpus(src, args.copies, args.answers)
        common = ["--src", str(src), "--pack-size", str(args.pack_size)]
        texts = _subprocess(["--capture", *common, "--work", tmp])
        for name in names:
            work = Path(tmp) / name
            work.mkdir()
            results[name] = r = _subprocess(
                ["--one", name, *common, "--work", str(work), "--repeats", str(args.repeats)]
            )
            print(
                f"{name:30s} {' '.join(f'{x:.1f}' for x in r['seconds'])} s, the encoding beside each "
                f"{' '.join(f'{x:.1f}' for x in r['encode_seconds'])} s",
                flush=True,
            )
        load["end"] = os.getloadavg()
        last = f"run{args.repeats - 1}"
        theirs = _sequence_digests(Path(tmp) / REFERENCE / last / "mb.idx.parquet")
        identical = {
            name: _sequence_digests(next((Path(tmp) / name / last / "ours").glob("training_*.idx.parquet"))) == theirs
            for name in names
            if name.startswith("mbridge_seqpack")
        }
    if not all(identical.values()):
        raise SystemExit(f"the packs hold other sequences than Megatron-Bridge's prep: {identical}")
    report = summarize(
        {
            "records": records,
            "answers": args.answers,
            "tokens": next(r["tokens"] for r in results.values() if r["tokens"]),
            "cores": cores,
            "repeats": args.repeats,
            "load_average": load,
            "tokenizer_texts": texts,
            "same_sequences_as_megatron_bridge": identical,
            "results": results,
        }
    )
    print()
    show(report)
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(report, indent=2) + "\n")


if __name__ == "__main__":
    main()
