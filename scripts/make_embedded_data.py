"""Regenerate the embedded SFT corpus and tokenizer (run once; outputs are committed).

Corpus: question/answer pairs built from the docstrings of Python 3.12's standard library (real
English technical prose, license-compatible with the PSF license). Tokenizer: a byte-level BPE
(8192 tokens) trained on that corpus with Hugging Face ``tokenizers``, saved as a
``PreTrainedTokenizerFast`` directory so Megatron-Bridge's HuggingFaceTokenizer loads it offline.

    uv run python scripts/make_embedded_data.py
"""

from __future__ import annotations

import importlib
import inspect
import json
import random
import re
from pathlib import Path

MODULES = [
    "json",
    "os",
    "os.path",
    "collections",
    "itertools",
    "functools",
    "re",
    "math",
    "statistics",
    "textwrap",
    "string",
    "heapq",
    "bisect",
    "fractions",
    "datetime",
    "random",
    "shutil",
    "pathlib",
    "csv",
    "difflib",
    "operator",
    "copy",
    "pprint",
    "enum",
    "dataclasses",
    "typing",
    "contextlib",
    "abc",
    "io",
    "tempfile",
    "glob",
    "fnmatch",
    "zipfile",
    "tarfile",
    "gzip",
    "hashlib",
    "hmac",
    "secrets",
    "base64",
    "binascii",
    "struct",
    "codecs",
    "unicodedata",
    "locale",
    "calendar",
    "time",
    "zoneinfo",
    "sched",
    "queue",
    "threading",
    "multiprocessing",
    "concurrent.futures",
    "subprocess",
    "socket",
    "ssl",
    "select",
    "selectors",
    "signal",
    "asyncio",
    "email",
    "mailbox",
    "mimetypes",
    "html",
    "html.parser",
    "xml.dom.minidom",
    "urllib.parse",
    "urllib.request",
    "http.client",
    "http.server",
    "ftplib",
    "smtplib",
    "uuid",
    "ipaddress",
    "argparse",
    "logging",
    "getpass",
    "curses",
    "platform",
    "errno",
    "ctypes",
    "sqlite3",
    "zlib",
    "lzma",
    "bz2",
    "pickle",
    "shelve",
    "marshal",
    "dbm",
    "configparser",
    "tomllib",
    "netrc",
    "plistlib",
    "array",
    "weakref",
    "types",
    "graphlib",
    "numbers",
    "cmath",
    "decimal",
    "inspect",
    "dis",
    "ast",
    "tokenize",
    "traceback",
    "warnings",
    "unittest",
    "doctest",
    "pdb",
    "timeit",
    "trace",
    "gc",
    "site",
    "sysconfig",
    "importlib",
    "pkgutil",
    "zipimport",
    "runpy",
    "shlex",
    "cmd",
    "code",
    "codeop",
    "linecache",
    "filecmp",
    "stat",
    "wave",
    "colorsys",
    "gettext",
    "webbrowser",
    "wsgiref.util",
    "xml.etree.ElementTree",
    "socketserver",
]

#: validation only, read after MODULES (importing a submodule first would change its package's names): enough
#: held-out examples for the default recipe's evaluation batch at 8k rows; the tokenizer is trained without them
VALIDATION_MODULES = [
    "optparse", "getopt", "reprlib", "html.entities", "json.decoder", "json.encoder", "email.message", "email.utils",
    "email.parser", "email.policy", "http.cookies", "http.cookiejar", "urllib.error", "urllib.robotparser", "xml.sax",
    "xml.dom", "xmlrpc.client", "xmlrpc.server", "imaplib", "poplib", "pydoc", "tabnanny", "pyclbr", "py_compile",
    "compileall", "symtable", "keyword", "token", "mmap", "logging.handlers", "logging.config", "multiprocessing.pool",
    "multiprocessing.shared_memory", "asyncio.streams", "asyncio.subprocess", "importlib.metadata",
    "importlib.resources", "importlib.util", "email.mime.text", "zipapp", "ctypes.util", "stringprep", "bdb",
    "tracemalloc", "cProfile", "profile", "pstats", "contextvars", "copyreg", "collections.abc", "quopri",
    "unittest.mock", "concurrent.futures.process", "email.headerregistry", "email.charset", "asyncio.queues",
    "asyncio.locks", "asyncio.events", "sqlite3.dbapi2", "encodings.idna", "venv", "ensurepip",
]  # fmt: skip

QUESTIONS = [
    "What does {name} do?",
    "Explain {name} in Python.",
    "How is {name} used?",
    "Describe the behaviour of {name}.",
]


def clean(doc: str) -> str:
    text = inspect.cleandoc(doc)
    text = re.sub(r"[ \t]+", " ", text)
    return text.strip()


def examples(modules: list[str] = MODULES, seed: int = 20261129, seen: set[str] | None = None) -> list[dict[str, str]]:
    """Question/answer pairs from the docstrings of ``modules`` (an answer in ``seen`` is left out), shuffled."""
    rng = random.Random(seed)
    seen = set() if seen is None else seen
    out = []
    for module_name in modules:
        try:
            module = importlib.import_module(module_name)
        except Exception:
            continue
        items = [(module_name, module)] + [
            (f"{module_name}.{attr}", getattr(module, attr, None))
            for attr in sorted(dir(module))
            if not attr.startswith("_")
        ]
        for qualname, obj in items:
            doc = getattr(obj, "__doc__", None)
            if not isinstance(doc, str) or len(doc) < 40:
                continue
            answer = clean(doc)
            if answer in seen or len(answer) > 6000:
                continue
            seen.add(answer)
            question = rng.choice(QUESTIONS).format(name=qualname)
            out.append({"input": question, "output": answer})
    rng.shuffle(out)
    return out


def main() -> None:
    root = Path(__file__).resolve().parents[1] / "mbridge_seqpack" / "data"
    data_dir = root / "sft_sample"
    data_dir.mkdir(parents=True, exist_ok=True)
    rows = examples()
    n_val = max(1, len(rows) // 20)
    held_out = examples(VALIDATION_MODULES, seed=20261202, seen={row["output"] for row in rows})
    splits = {"validation": rows[:n_val] + held_out, "training": rows[n_val:]}
    for split, split_rows in splits.items():
        with open(data_dir / f"{split}.jsonl", "w", encoding="utf-8") as f:
            for row in split_rows:
                f.write(json.dumps(row, ensure_ascii=False) + "\n")

    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE(unk_token=None))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=8192,
        special_tokens=["<|endoftext|>", "<|pad|>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    texts = [r["input"] + " " + r["output"] for r in rows]
    tok.train_from_iterator(texts, trainer=trainer)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        eos_token="<|endoftext|>",
        bos_token="<|endoftext|>",
        pad_token="<|pad|>",
        model_max_length=131072,
    )
    fast.save_pretrained(str(root / "tokenizer"))
    print(
        f"{len(splits['training'])} training / {len(splits['validation'])} validation examples; "
        f"vocab {tok.get_vocab_size()}"
    )


if __name__ == "__main__":
    main()
