"""``pack --ray`` on the session's local Ray cluster (tests/conftest.py, two CPUs): workers check, tokenize
(Megatron-Bridge's code) and write the rows; the pack is the local pack's, byte for byte, metadata included."""

from __future__ import annotations

import filecmp
import json
from pathlib import Path

import numpy as np
import pytest

from mbridge_seqpack.tokenization.sequences import InputError, check_jsonl

ray = pytest.importorskip("ray")
pytest.importorskip("ray.data")

pytestmark = pytest.mark.slow


def _same_files(one: Path, other: Path) -> None:
    names = sorted(p.name for p in one.iterdir())
    assert names == sorted(p.name for p in other.iterdir())
    for name in names:
        assert filecmp.cmp(one / name, other / name, shallow=False), name


def test_embedded_corpus_through_the_cli_is_the_local_pack(ray_cluster, tmp_path: Path, capsys) -> None:
    """Both splits, balanced rows, 20 kB shards (dozens of tasks over two workers): the same files."""
    from mbridge_seqpack.cli import main

    common = ["pack", "--pack-size", "2048", "--pad-seq-to-mult", "8", "--data-parallel", "2", "--json"]
    assert main([*common, "--output", str(tmp_path / "local")]) == 0
    assert main([*common, "--output", str(tmp_path / "ray"), "--ray", "local", "--ray-shard-mb", "0.02"]) == 0
    _same_files(tmp_path / "local", tmp_path / "ray")
    (metadata,) = (tmp_path / "ray").glob("*_metadata.jsonl")
    entries = {entry["split"]: entry for entry in json.loads(metadata.read_text())}
    assert entries["training"]["tokenization"] == "batched"
    assert entries["training"]["num_rows"] > 1 and "balance" in entries["training"]
    assert not list(tmp_path.glob(".ray.staging-*")) and not list((tmp_path / "ray").glob(".*"))


def _synthetic_corpus(path: Path, records: int) -> None:
    rng = np.random.default_rng(7)
    words = np.asarray(
        "the a packing sequence token rows model train GPU loss mask attention long context, data . ? 42".split()
        + ["héllo", "東京"]
    )
    prompt_words, answer_words = rng.integers(1, 40, records), rng.integers(0, 25, records)
    picks = rng.integers(0, words.size, int(prompt_words.sum() + answer_words.sum()))
    cursor = 0
    with open(path, "w", encoding="utf-8") as out:
        for p, a in zip(prompt_words.tolist(), answer_words.tolist()):
            prompt = " ".join(words[picks[cursor : cursor + p]])
            answer = " ".join(words[picks[cursor + p : cursor + p + a]])
            cursor += p + a
            out.write(json.dumps({"input": prompt, "output": answer}, ensure_ascii=False) + "\n")


def test_a_synthetic_100k_corpus_is_the_local_pack(ray_cluster, tmp_path: Path) -> None:
    from mbridge_seqpack.pipeline.pack import PackOptions, pack_jsonl
    from mbridge_seqpack.pipeline.ray_engine import RayEngine
    from mbridge_seqpack.recipes.building_blocks import embedded_tokenizer_dir

    corpus = tmp_path / "corpus.jsonl"
    _synthetic_corpus(corpus, 100_000)
    options = PackOptions(pack_size=1024, pad_seq_to_mult=4, balance=False)
    kwargs = dict(tokenizer=embedded_tokenizer_dir(), options=options)
    local = pack_jsonl({"training": corpus}, output_dir=tmp_path / "local", **kwargs)
    pack_jsonl(
        {"training": corpus}, output_dir=tmp_path / "ray", engine=RayEngine("local", shard_bytes=1 << 20), **kwargs
    )
    _same_files(tmp_path / "local", tmp_path / "ray")
    assert local.splits["training"].stats["num_sequences"] == 100_000


def test_a_bad_record_in_a_later_shard_is_named_by_file_and_line(ray_cluster, tmp_path: Path) -> None:
    """A worker's refusal reaches the driver as the local check words it: the input file, its line number."""
    from mbridge_seqpack.pipeline.pack import PackOptions, pack_jsonl
    from mbridge_seqpack.pipeline.ray_engine import RayEngine
    from mbridge_seqpack.recipes.building_blocks import embedded_data_dir, embedded_tokenizer_dir

    lines = (embedded_data_dir() / "training.jsonl").read_text().splitlines()
    lines[1500] = '{"input": "a", "output": 3}'
    corpus = tmp_path / "training.jsonl"
    corpus.write_text("\n".join(lines) + "\n")
    with pytest.raises(InputError) as local:
        check_jsonl(corpus, {})
    assert str(local.value).startswith(f"{corpus}:1501: field 'output' must be a string, got int 3")
    with pytest.raises(InputError) as remote:
        pack_jsonl(
            {"training": corpus},
            tokenizer=embedded_tokenizer_dir(),
            output_dir=tmp_path / "out",
            options=PackOptions(pack_size=2048),
            engine=RayEngine("local", shard_bytes=50_000),
        )
    assert str(remote.value) == str(local.value)
    assert not (tmp_path / "out").exists() or not any((tmp_path / "out").iterdir())


def test_a_shard_whose_worker_dies_on_every_try_stops_the_pack_in_one_line(ray_cluster, tmp_path: Path) -> None:
    """#52 item 3: Ray Data retries a task forever by default; here the worker tokenizing the shard is killed
    (SIGKILL, from outside) on every try, and the pack stops after ``task_failures`` tries with one line naming the
    shard and the last error, nothing left where the output goes."""
    import threading
    import time

    import psutil

    from mbridge_seqpack.pipeline.pack import PackOptions, pack_jsonl
    from mbridge_seqpack.pipeline.ray_engine import RayEngine
    from mbridge_seqpack.recipes.building_blocks import embedded_tokenizer_dir

    corpus = tmp_path / "corpus.jsonl"
    _synthetic_corpus(corpus, 20_000)  # one shard, long enough to tokenize that the kill lands before it is done
    stop, killed = threading.Event(), []

    def tries() -> int:
        return sum(path.read_text().count("\n") for path in tmp_path.glob(".out.staging-*/**/shard_000000/attempts"))

    def killer() -> None:
        seen = 0
        while not stop.is_set():
            now = tries()
            if now > seen:  # a new try began: kill the worker running it
                for proc in psutil.process_iter(["pid", "cmdline"]):
                    if "tokenize_shard" in " ".join(proc.info["cmdline"] or []):
                        try:
                            proc.kill()
                            killed.append(proc.info["pid"])
                            seen = now
                        except psutil.Error:
                            pass
            time.sleep(0.005)

    thread = threading.Thread(target=killer, daemon=True)
    thread.start()
    try:
        with pytest.raises(InputError) as info:
            pack_jsonl(
                {"training": corpus},
                tokenizer=embedded_tokenizer_dir(),
                output_dir=tmp_path / "out",
                options=PackOptions(pack_size=1024, balance=False),
                engine=RayEngine("local", shard_bytes=1 << 30, task_failures=2),
            )
    finally:
        stop.set()
        thread.join()
    text = str(info.value)
    size = corpus.stat().st_size
    assert text.startswith(
        f"--ray: shard 0 of {corpus} (bytes 0-{size}, from line 1), tried 2 time(s) of 2, failed ("
    ), text
    assert text.endswith("); nothing was written; see the Ray logs of the cluster (`ray logs`), then re-run pack")
    assert "\n" not in text and len(set(killed)) == 2
    assert not (tmp_path / "out").exists() and not list(tmp_path.glob(".out.staging-*"))


def test_task_failures_come_from_the_environment_and_must_be_positive(monkeypatch: pytest.MonkeyPatch) -> None:
    from mbridge_seqpack.pipeline.ray_engine import TASK_FAILURES_ENV, RayEngine

    monkeypatch.delenv(TASK_FAILURES_ENV, raising=False)
    assert RayEngine("local").task_failures == 3
    monkeypatch.setenv(TASK_FAILURES_ENV, "5")
    assert RayEngine("local").task_failures == 5
    for bad in ("0", "-1", "many"):
        monkeypatch.setenv(TASK_FAILURES_ENV, bad)
        with pytest.raises(InputError) as info:
            RayEngine("local")
        assert (
            str(info.value)
            == f"{TASK_FAILURES_ENV} must be a positive integer, got {bad if bad == '0' else repr(bad)}"
        )
