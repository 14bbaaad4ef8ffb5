"""Where Megatron-Bridge's GPT SFT dataset builder looks for a packed dataset when no packed path is set.

``GPTSFTDatasetBuilder.default_pack_path`` (data/builders/gpt_sft.py) is
``<dataset_root>/packed/<tokenizer name>_pad_seq_to_mult<M>_sft_<fingerprint>``, with ``training_<N>.idx.parquet``,
``validation_<N>.idx.parquet`` and ``<N>_metadata.jsonl`` inside; ``_prepare_packed_split`` skips its own prep when
the file is there, so a pack written there trains with no path override. The name and fingerprint come from the
builder's own ``_extract_tokenizer_model_name`` and ``_packing_fingerprint``. The property itself is not called: it
creates the directory, which a config-time check must not do.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from types import FunctionType, SimpleNamespace
from typing import TYPE_CHECKING, Any

from mbridge_seqpack.artifact.store import metadata_path, split_paths

if TYPE_CHECKING:
    from megatron.bridge.training.config import ConfigContainer

__all__ = ["BuilderLocation", "builder_location", "jsonl_root"]


@dataclass(frozen=True)
class BuilderLocation:
    """The packed files Megatron-Bridge's builder reads for a config that sets no packed path."""

    directory: Path
    pack_size: int

    def split_path(self, split: str) -> Path:
        return split_paths(self.directory, self.pack_size)[split]

    @property
    def metadata(self) -> Path:
        return metadata_path(self.directory, self.pack_size)


def _tokenizer_model_name(tokenizer_cfg: Any, specs: Any) -> str | None:
    """The builder's ``_extract_tokenizer_model_name`` for the tokenizer ``build_tokenizer(cfg.tokenizer)`` will
    make, without loading it: for a Hugging Face tokenizer the name depends only on its path (the configured
    ``tokenizer_model``), which the builder reads from the tokenizer object. Other tokenizer types are named by a
    hash of the loaded tokenizer's identifiers, and a hub id with a pinned revision by its download path: None."""
    from megatron.bridge.data.builders.gpt_sft import GPTSFTDatasetBuilder
    from megatron.core.tokenizers.text.libraries import HuggingFaceTokenizer

    if getattr(specs, "tokenizer_model_name", None) is not None:
        return str(specs.tokenizer_model_name)
    model = getattr(tokenizer_cfg, "tokenizer_model", None)
    if getattr(tokenizer_cfg, "tokenizer_type", None) != "HuggingFaceTokenizer" or not isinstance(model, str):
        return None
    if (getattr(tokenizer_cfg, "hf_tokenizer_kwargs", None) or {}).get("revision") and not Path(model).exists():
        return None
    # the method reads only these attributes: the tokenizer's library class (an instance, never initialised: the
    # builder only tests isinstance) and the path build_tokenizer gives it, which is tokenizer_model
    loaded = SimpleNamespace(_tokenizer=HuggingFaceTokenizer.__new__(HuggingFaceTokenizer), path=model)
    builder = SimpleNamespace(tokenizer=loaded, offline_packing_specs=specs)
    try:
        return GPTSFTDatasetBuilder._extract_tokenizer_model_name(builder)  # type: ignore[arg-type]
    except AttributeError:  # a later Megatron-Bridge reads more of the tokenizer: no location rather than a wrong one
        return None


def _resolver_without_mkdir() -> Any:
    """Megatron-Bridge's own ``resolve_gpt_sft_dataset_root``, run with a ``get_dataset_root`` that only names the
    folder: the real one creates it, and a config-time look must neither create a folder in the datasets cache nor
    remove one (every rank runs the check at once, and a folder another rank's builder just made is not empty for
    long). The function's code and every other name it uses are Megatron-Bridge's; its module is not touched.
    None when a later Megatron-Bridge no longer names the folder through ``get_dataset_root``."""
    from megatron.bridge.data.builders import gpt_sft as builders
    from megatron.bridge.data.datasets.gpt_sft import NEMO_DATASETS_CACHE

    resolve = builders.resolve_gpt_sft_dataset_root
    if "get_dataset_root" not in resolve.__code__.co_names:
        return None
    names = {**resolve.__globals__, "get_dataset_root": lambda name: Path(NEMO_DATASETS_CACHE) / name}
    return FunctionType(resolve.__code__, names, resolve.__name__, resolve.__defaults__, resolve.__closure__)


def jsonl_root(cfg: ConfigContainer) -> Path | None:
    """The directory Megatron-Bridge's GPT SFT builder reads ``<split>.jsonl`` from and packs under:
    ``dataset.dataset_root``, or for a Hugging Face dataset the one its ``resolve_gpt_sft_dataset_root`` names
    (``hf_output_root``, or a folder of its datasets cache named by a digest of the source); None for other
    datasets or a config Megatron-Bridge's validation refuses. Nothing is created or removed."""
    from megatron.bridge.data.builders.gpt_sft import GPTSFTDatasetConfig

    dataset = getattr(cfg, "dataset", None)
    if not isinstance(dataset, GPTSFTDatasetConfig):
        return None
    if dataset.dataset_root is not None:
        return Path(str(dataset.dataset_root))
    if dataset.hf_dataset is None:
        return None
    resolve = _resolver_without_mkdir()
    if resolve is None:
        return None
    try:
        return Path(resolve(dataset))
    except Exception:  # noqa: BLE001  (a source it cannot resolve: its own validation reports it; no location)
        return None


def builder_location(cfg: ConfigContainer, root: Path | None = None) -> BuilderLocation | None:
    """The packed location Megatron-Bridge's builder uses for ``cfg`` (under ``root``, default
    :func:`jsonl_root`), or None when it sets a packed training path, does not pack offline or uses a tokenizer
    whose name needs it loaded."""
    from megatron.bridge.data.builders.gpt_sft import GPTSFTDatasetConfig, _packing_fingerprint

    dataset = getattr(cfg, "dataset", None)
    specs = getattr(dataset, "offline_packing_specs", None)
    if not isinstance(dataset, GPTSFTDatasetConfig) or specs is None:
        return None
    root = root if root is not None else jsonl_root(cfg)
    if root is None:
        return None
    size = specs.packed_sequence_size
    if not isinstance(size, int) or isinstance(size, bool) or size <= 0:
        return None
    name = _tokenizer_model_name(getattr(cfg, "tokenizer", None), specs)
    if name is None:
        return None
    try:
        fingerprint = _packing_fingerprint(dataset, dataset.dataset_kwargs)
    except (TypeError, ValueError):  # an unserialisable value: Megatron-Bridge's own validation reports it
        return None
    folder = f"{name}_pad_seq_to_mult{specs.pad_seq_to_mult}_sft_{fingerprint}"
    return BuilderLocation(root / "packed" / folder, size)
