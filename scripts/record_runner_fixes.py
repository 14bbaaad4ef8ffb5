"""Record what Megatron-Bridge's own recipe runner does to a matrix of recipes x CP/TP/SP overrides.

Runs the runner's functions themselves (``recipe_runner.load_recipe``, ``apply_cli_overrides``,
``sync_model_pipeline_layout`` and the three ``sync_*`` fixes, in ``run_recipe.main``'s order) on Megatron-Bridge's
shipped recipes, built offline, and writes ``tests/recipes/runner_fixes.json``: the recipe function the runner
resolved, the training loop, and every field the fixes may set. ``tests/recipes/test_runner.py`` holds the plugin to
it.

    .venv/bin/python scripts/record_runner_fixes.py --runner-dir /opt/Megatron-Bridge/scripts/training

(the runner is not in the wheel: a Megatron-Bridge checkout's ``scripts/training`` of the installed release).
"""

from __future__ import annotations

import argparse
import json
import sys
import warnings
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

#: finetuning (offline packed, unpacked, PEFT, MoE, VLM in-batch) and pretraining recipes of Megatron-Bridge 0.6.2
RECIPES = (
    "llama3_8b_sft_2gpu_h100_bf16_config",
    "llama3_8b_peft_1gpu_h100_bf16_config",
    "llama32_1b_sft_1gpu_h100_bf16_config",
    "llama31_70b_sft_32gpu_h100_bf16_config",
    "qwen25_7b_sft_2gpu_h100_bf16_config",
    "llama32_3b_sft_1gpu_h100_bf16_config",
    "gpt_oss_20b_sft_8gpu_h100_bf16_config",
    "moonlight_16b_sft_8gpu_h100_bf16_config",
    "nemotron_3_nano_sft_8gpu_h100_bf16_config",
    "gemma3_vl_4b_sft_1gpu_h100_bf16_config",
    "llama31_8b_peft_1gpu_h100_bf16_config",
    "llama3_8b_pretrain_2gpu_h100_bf16_config",
    # benchmark recipes (megatron.bridge.perf_recipes): one exported by both packages, where the benchmark wins,
    # and one only the benchmark package has
    "llama3_70b_sft_32gpu_h100_bf16_config",
    "llama3_8b_sft_8gpu_h100_bf16_config",
)
OVERRIDES = (
    (),
    ("model.context_parallel_size=2",),
    ("model.tensor_model_parallel_size=2", "model.sequence_parallel=true", "model.context_parallel_size=2"),
    ("model.context_parallel_size=4", "dataset.seq_length=8192"),
)
FIELDS = (
    "model.calculate_per_token_loss",
    "ddp.average_in_collective",
    "dataset.offline_packing_specs.packed_sequence_size",
    "dataset.offline_packing_specs.pad_seq_to_mult",
    "model.seq_length",
)


def case_id(recipe: str, overrides: tuple[str, ...]) -> str:
    return recipe + "".join(f" {o}" for o in overrides)


def read(config: object, dotted: str) -> object:
    for part in dotted.split("."):
        config = getattr(config, part, None)
    return config


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runner-dir", required=True, help="Megatron-Bridge's scripts/training directory")
    parser.add_argument("--output", default=str(ROOT / "tests" / "recipes" / "runner_fixes.json"))
    args = parser.parse_args()
    sys.path.insert(0, args.runner_dir)
    warnings.simplefilter("ignore")
    import recipe_metadata
    import recipe_runner

    from tests.zoo.harness import offline

    cases = {}
    with offline():
        for recipe in RECIPES:
            mode = recipe_metadata.infer_recipe_mode(recipe)
            train = "pretrain" if mode == "pretrain" else "finetune"
            for overrides in OVERRIDES:
                peft = mode if mode in {"lora", "dora"} else None
                config = recipe_runner.load_recipe(recipe, peft_scheme=peft)
                benchmark = recipe_metadata.resolved_benchmark_recipe_metadata(recipe) is not None
                find = recipe_runner.find_benchmark_recipe if benchmark else recipe_runner.find_library_recipe
                builder = find(recipe)  # what load_recipe built
                config = recipe_runner.apply_cli_overrides(config, list(overrides))
                config = recipe_runner.sync_model_pipeline_layout(config, cli_overrides=list(overrides))
                config = recipe_runner.sync_finetuning_cp_invariants(config, mode=train)
                config = recipe_runner.sync_offline_packing_alignment(config)
                config = recipe_runner.sync_model_dataset_sequence_length(config)
                cases[case_id(recipe, overrides)] = {
                    "recipe": recipe,
                    "overrides": list(overrides),
                    "builder": f"{builder.__module__}:{builder.__qualname__}",
                    "train": train,
                    "fields": {f: read(config, f) for f in FIELDS},
                }
                print(case_id(recipe, overrides), cases[case_id(recipe, overrides)]["fields"])
    payload = {
        "source": "Megatron-Bridge r0.6.0 scripts/training (recipe_runner.py, run_recipe.py main order)",
        "cases": cases,
    }
    Path(args.output).write_text(json.dumps(payload, indent=1, sort_keys=True) + "\n")
    print(f"{len(cases)} cases -> {args.output}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
