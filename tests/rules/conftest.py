"""Fixtures the rule-evidence tests share."""

from __future__ import annotations

import pytest


@pytest.fixture(scope="module")
def tiny_pack(tmp_path_factory, megatron_bridge):
    """Three records as JSONL and packed at 64 tokens (parquet and metadata), for Megatron-Bridge's builder."""
    import json

    from mbridge_seqpack.pipeline.pack import PackOptions, pack_jsonl
    from mbridge_seqpack.recipes.building_blocks import embedded_tokenizer_dir

    root = tmp_path_factory.mktemp("tiny_pack")
    source = root / "training.jsonl"
    source.write_text("".join(json.dumps({"input": f"q{i}", "output": f"a{i}"}) + "\n" for i in range(3)))
    pack_jsonl(
        {"training": source},
        tokenizer=embedded_tokenizer_dir(),
        output_dir=root / "pack",
        options=PackOptions(pack_size=64),
    )
    return root
