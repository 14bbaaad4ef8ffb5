#!/usr/bin/env bash
# Main job. Builds the environment if needed, then, on the embedded default:
#   1. packs the embedded SFT corpus into 8k rows exactly as the default recipe asks (`pack --recipe`: pack size,
#      alignment, tokenizer and dataset_kwargs from the recipe; tokenized by Megatron-Bridge's own dataset code),
#   2. inspects and verifies the artifact (writes a PNG of sequence lengths against the pack size and the fill of each row),
#   3. checks the default recipe (Llama-3-8B SFT, packed 8k, 8 GPUs) pointed at that artifact:
#      every packing/CP rule, the stale-pack fingerprint rule, and Megatron-Bridge's own validation.
# With arguments, runs only `mbridge-seqpack check ARGS...` (e.g. model.context_parallel_size=2).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup_env.sh >&2
cli=.venv/bin/mbridge-seqpack
if [ "$#" -gt 0 ]; then
  exec "$cli" check "$@"
fi
out="${MBRIDGE_SEQPACK_OUT:-out/embedded_pack_8192}"
"$cli" pack --recipe llama3_8b_sft_packed_8k --output "$out" --overwrite
"$cli" verify "$out" --rows 4
"$cli" inspect "$out" --png "out/lengths_and_fill_8192.png"
specs=dataset.offline_packing_specs
"$cli" check llama3_8b_sft_packed_8k \
  "$specs.packed_train_data_path=$out/training_8192.idx.parquet" \
  "$specs.packed_val_data_path=$out/validation_8192.idx.parquet"
cat <<EOF

next:
  # what breaks, and the fix; then the overrides that clear it
  $cli check llama3_8b_sft_packed_8k model.context_parallel_size=2
  $cli check llama3_8b_sft_packed_8k model.context_parallel_size=2 --fix
  # your data, as the recipe packs it; the packaged recipes
  $cli pack --recipe llama3_8b_sft_packed_8k dataset.dataset_root=DIR
  $cli recipes
  # the rules inside validate(), with no code
  MBRIDGE_SEQPACK_MODE=error python your_training_script.py
EOF
