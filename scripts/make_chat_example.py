"""A small chat dataset and a chat tokenizer for the worked example of docs/own-data.md (run by its test).

    python scripts/make_chat_example.py DIR [--training N] [--validation N]

Writes ``DIR/training.jsonl`` and ``DIR/validation.jsonl`` (the package's embedded prompt/answer corpus as chat
records: ``{"messages": [{"role": "user", ...}, {"role": "assistant", ...}]}``, the schema Megatron-Bridge's chat
dataset reads) and ``DIR/tokenizer`` (the embedded tokenizer with a chat template that marks each assistant turn as
``{% generation %}``, which Megatron-Bridge's assistant-only loss mask needs). Offline; nothing is downloaded.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

#: a template in the shape of a chat model's, with the assistant turns inside {% generation %} blocks
CHAT_TEMPLATE = (
    "{% for m in messages %}{% if m['role'] == 'assistant' %}"
    "{% generation %}<assistant> {{ m['content'] }}{{ eos_token }}{% endgeneration %}\n"
    "{% else %}<{{ m['role'] }}> {{ m['content'] }}\n{% endif %}{% endfor %}"
)


def write_split(source: Path, target: Path, count: int) -> int:
    """The first ``count`` records of ``source`` as chat records in ``target``; how many were written."""
    written = 0
    with open(source, encoding="utf-8") as lines, open(target, "w", encoding="utf-8") as out:
        for line in lines:
            if written == count:
                break
            record = json.loads(line)
            turns = [{"role": "user", "content": record["input"]}, {"role": "assistant", "content": record["output"]}]
            out.write(json.dumps({"messages": turns}, ensure_ascii=False) + "\n")
            written += 1
    return written


def make_example(directory: Path, training: int = 800, validation: int = 400) -> dict[str, Path]:
    """The two splits and the tokenizer under ``directory``; their paths."""
    from mbridge_seqpack.recipes.building_blocks import embedded_data_dir, embedded_tokenizer_dir

    directory.mkdir(parents=True, exist_ok=True)
    data = embedded_data_dir()
    paths = {"training": directory / "training.jsonl", "validation": directory / "validation.jsonl"}
    write_split(data / "training.jsonl", paths["training"], training)
    write_split(data / "validation.jsonl", paths["validation"], validation)
    tokenizer = directory / "tokenizer"
    shutil.rmtree(tokenizer, ignore_errors=True)
    shutil.copytree(embedded_tokenizer_dir(), tokenizer)
    config_file = tokenizer / "tokenizer_config.json"
    config = json.loads(config_file.read_text(encoding="utf-8"))
    config_file.write_text(json.dumps({**config, "chat_template": CHAT_TEMPLATE}, indent=2), encoding="utf-8")
    return {**paths, "tokenizer": tokenizer}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("directory", type=Path)
    parser.add_argument("--training", type=int, default=800, help="training records (default 800)")
    parser.add_argument("--validation", type=int, default=400, help="validation records (default 400)")
    args = parser.parse_args(argv)
    made = make_example(args.directory, args.training, args.validation)
    for name, path in made.items():
        print(f"{name}: {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
