"""Shaped like Megatron-Bridge's ``run_recipe.py --dry-run`` for a library recipe: build, override, write the YAML
(``recipe_runner.save_config`` -> ``ConfigContainer.to_yaml``) without ``runtime_config_update()``. It never imports
mbridge_seqpack."""

import os
import sys

from megatron.bridge.training.utils.omegaconf_utils import process_config_with_overrides

from tests.scripts.tiny_recipe import recipe

cfg = process_config_with_overrides(recipe(), cli_overrides=sys.argv[1:])
cfg.to_yaml(os.environ["DRY_RUN_YAML"])
print("written")
