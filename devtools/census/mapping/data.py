"""Dataset builders, datasets, collates, loaders and samplers (Megatron-Bridge data/, Megatron-Core datasets/)."""

from __future__ import annotations

from devtools.census.mapping.common import (
    API_MISUSE,
    DATA_CONTENT,
    ENVIRONMENT,
    HOST_DATA,
    INVARIANT,
    RERAISE,
    config_class,
    known_value,
)
from devtools.census.verdicts import gap, groups, guarded, harmless, site, unreachable, validated

MB = "megatron/bridge/"
MC = "megatron/core/"
SPECS = "dataset.offline_packing_specs"

GPT_SFT_VALIDATE = config_class(
    "GPTSFTDatasetConfig.validate (ConfigContainer.validate -> dataset.validate, and again in "
    "resolve_gpt_sft_dataset_root)"
)
PACKED_PATH = guarded(
    "artifact.fingerprint_mismatch",
    "an explicit packed path that does not resolve: the rule resolves it as Megatron-Bridge does "
    "(data/packing/paths.py resolve_packed_parquet_paths) and reports the error",
    (f"{SPECS}.packed_train_data_path", f"{SPECS}.packed_val_data_path"),
)
NO_PACK_SIZE = unreachable(
    "only called when packed_sequence_size > 0 (the builder's packed branches; GPTSFTDatasetConfig.validate "
    "rejects packed specs with a size <= 0)"
)

#: a sampler's "no sample" assert, reached by an empty packed validation split (the two samplers share it)
EMPTY_SPLIT = site(
    "no sample to consume",
    guarded(
        "eval.packed_split_rows",
        "an empty split (packed: zero rows) reaches the sampler",
        (f"{SPECS}.packed_val_data_path",),
    ),
)

MAPPING = (
    *groups(
        MB + "data/builders/gpt_sft.py",
        {
            "GPTSFTDatasetConfig.validate": GPT_SFT_VALIDATE,
            "resolve_gpt_sft_dataset_root": unreachable(
                "after validate(): exactly one of dataset_root / hf_dataset is set, so hf_dataset is not None here"
            ),
            "materialize_hf_dataset": unreachable("called only when config.hf_dataset is set (prepare_data)"),
            "GPTSFTDatasetBuilder.__init__": unreachable(
                "the training setup builds the tokenizer before the datasets (training/setup.py build_tokenizer)"
            ),
            "gpt_sft_train_valid_test_datasets_provider": unreachable(
                "the training setup builds the tokenizer before the datasets (training/setup.py build_tokenizer)"
            ),
            "GPTSFTDatasetBuilder.prepare_data": unreachable(
                "_source_root is set in __init__ whenever hf_dataset is set (resolve_gpt_sft_dataset_root)"
            ),
            "GPTSFTDatasetBuilder.pack_metadata": NO_PACK_SIZE,
            "GPTSFTDatasetBuilder.train_path_packed": NO_PACK_SIZE,
            "GPTSFTDatasetBuilder.validation_path_packed": NO_PACK_SIZE,
        },
    ),
    *groups(
        MB + "data/datasets/gpt_sft.py",
        {
            "GPTSFTDataset._maybe_validate_prompt_template": guarded(
                "gpt_sft.prompt_template",
                "a legacy prompt_template (dataset_kwargs) that is missing, does not end with the label placeholder, "
                "or does not name the truncation fields asserts when the dataset is built, after the model; the rule "
                "runs this check on the config's values",
                ("dataset.dataset_kwargs['prompt_template']", "dataset.dataset_kwargs['truncation_field']"),
            ),
            "GPTSFTDataset.__getitem__": (
                HOST_DATA,
                site("assert idx <", INVARIANT),
                site("raise e", RERAISE),
            ),
            "GPTSFTDataset._multiple_truncation": guarded(
                "gpt_sft.prompt_template",
                "an unknown truncation_method passed through dataset_kwargs raises at the first example that needs "
                "truncation (mid-training); the rule runs GPTSFTDataset._truncation on the config's value",
                ("dataset.dataset_kwargs['truncation_method']",),
            ),
            "GPTSFTDataset._truncation": guarded(
                "gpt_sft.prompt_template",
                "an unknown truncation_method passed through dataset_kwargs raises at the first example that needs "
                "truncation (mid-training); the rule runs GPTSFTDataset._truncation on the config's value",
                ("dataset.dataset_kwargs['truncation_method']",),
            ),
            "GPTSFTDataset._process_example": (HOST_DATA, site("raise e", RERAISE)),
            "GPTSFTDataset._maybe_cast_to_list": HOST_DATA,
            "GPTSFTDataset.collate_fn": harmless(
                "cannot fail: max_length is max_seq_length (pad_to_max_length) or min(max_seq_length, ...)"
            ),
            "GPTSFTChatDataset.__init__": (
                config_class("ChatSFTPreprocessingConfig.validate (loss_mode, at validate())"),
                site(
                    "apply_chat_template",
                    gap(
                        ("dataset.dataset_kwargs['use_hf_tokenizer_chat_template']", "tokenizer.tokenizer_type"),
                        "chat SFT over a tokenizer without apply_chat_template raises when the dataset is built, "
                        "after the model",
                        general=True,
                    ),
                ),
            ),
            "GPTSFTChatDataset.collate_fn": (
                HOST_DATA,
                site("assert max_length <=", harmless("cannot fail: max_length is min(max_seq_length, ...)")),
            ),
        },
    ),
    *groups(
        MB + "data/datasets/utils.py",
        {
            "build_index_from_memdata": HOST_DATA,
            "_TextMemMapDataset.__init__": INVARIANT,
            "_TextMemMapDataset.__getitem__": (
                unreachable("indices come from the samplers, which draw them below len(dataset)"),
                site("raise e", RERAISE),
            ),
            "_TextMemMapDataset.load_file": DATA_CONTENT,
            "_JSONLMemMapDataset._build_data_from_text": RERAISE,
            "_OnlineSampleMapping.__getitem__": INVARIANT,
            "_OnlineSampleMapping.get_sample_block": INVARIANT,
            "build_index_files": INVARIANT,
            "handle_index": INVARIANT,
            "_get_samples_mapping": (
                INVARIANT,
                site("ImportError", ENVIRONMENT),
            ),
            "_make_indexed_dataset_compatibility": INVARIANT,
            "_convert_to_openai_messages": DATA_CONTENT,
            "_chat_template_input_ids": (HOST_DATA, site("raise", DATA_CONTENT, "raise")),
            "_chat_preprocess": (
                HOST_DATA,
                site("not a HuggingFace AutoTokenizer", DATA_CONTENT),
                site("generation %}", DATA_CONTENT),
            ),
            "_preprocess": (
                HOST_DATA,
                site("mask role not in", DATA_CONTENT),
                site("loss_mask is empty", DATA_CONTENT),
            ),
            "_mask_targets": (HOST_DATA, site("skip_name_len", DATA_CONTENT)),
            "_get_header_conversation_type_mask_role": DATA_CONTENT,
            "_add_speaker_and_signal": DATA_CONTENT,
            "_response_value_formater": DATA_CONTENT,
            "_identify_start_index_of_subsequence": HOST_DATA,
            "_build_memmap_index_files": DATA_CONTENT,
        },
    ),
    *groups(
        MB + "data/packing/gpt_sft.py",
        {
            "GPTSFTPackedDataset.__init__": (
                guarded(
                    "offline.no_p_tuning",
                    "virtual_tokens > 0 (P-Tuning) in dataset_kwargs reaches GPTSFTPackedDataset through "
                    "build_gpt_sft_split and asserts 'P-Tuning with packed sequence is not supported' when the "
                    "packed dataset is built, after the model",
                    ("dataset.dataset_kwargs['virtual_tokens']", "dataset.enable_offline_packing"),
                ),
                site(
                    "a metadata json file is required",
                    unreachable(
                        "the builder always passes pack_metadata_file_path for packed splits (the default "
                        "<pack>/…_metadata.jsonl or packed_metadata_path); a missing file is "
                        "cuda_graphs.pad_cu_seqlens_needs_metadata"
                    ),
                ),
                site(
                    "pad_to_max_length=True",
                    guarded(
                        "cuda_graphs.pad_cu_seqlens_needs_fixed_width",
                        "pad_cu_seqlens without pad_to_max_length (ConfigContainer.validate raises it too)",
                        (f"{SPECS}.pad_cu_seqlens", "dataset.dataset_kwargs['pad_to_max_length']"),
                    ),
                ),
            ),
            "GPTSFTPackedDataset._maybe_cast_to_list": HOST_DATA,
            "GPTSFTPackedDataset.collate_fn": (
                guarded(
                    "artifact.fingerprint_mismatch",
                    "a packed row wider than max_seq_length (= packed_sequence_size) means a pack built for a "
                    "larger size; the rule refuses a sealed pack whose size differs from the config",
                    (f"{SPECS}.packed_sequence_size",),
                ),
                site("assert max_length <=", harmless("cannot fail: max_length is min(max_seq_length, ...)")),
                site(
                    "input_ids and position_ids",
                    unreachable("position_ids are built from the same seq_boundaries as input_ids just above"),
                ),
            ),
        },
    ),
    *groups(
        MB + "data/packing/parquet.py",
        {
            "_lazy_import_pyarrow": ENVIRONMENT,
            "GPTSFTPackedParquetDataset._load_dataset": guarded(
                "artifact.fingerprint_mismatch",
                "a packed file without the columns or rows Megatron-Bridge's writer gives (foreign or truncated "
                "pack): a sealed pack's columns and row count are checked at validate(); an unsealed one is data",
                (f"{SPECS}.packed_train_data_path", f"{SPECS}.packed_val_data_path"),
            ),
            "GPTSFTPackedParquetDataset.validate_row": guarded(
                "artifact.fingerprint_mismatch",
                "row-level corruption of a packed file: a sealed pack's per-column sha256 is checked at "
                "validate(); an unsealed one is data",
                (f"{SPECS}.packed_train_data_path", f"{SPECS}.packed_val_data_path"),
            ),
        },
    ),
    *groups(
        MB + "data/packing/offline.py",
        {
            "_pre_pad_data_point": unreachable(
                "tokenize_dataset passes max_stored_length_to_pad <= runtime max + 1 (ceil to the pad multiple "
                "capped at max_runtime_pad_cap + 1)"
            ),
            "tokenize_dataset": (
                config_class("PackedSequenceSpecs.__post_init__ (pad_seq_to_mult <= 0)"),
                site(
                    "must be at least the effective padding multiple",
                    guarded(
                        "offline.pad_multiple_within_length",
                        "a pad_seq_to_mult larger than the longest allowed sequence (max_single_sequence_length, "
                        "else seq_length) raises in the rank-0 prep, after the model is built",
                        (f"{SPECS}.pad_seq_to_mult", f"{SPECS}.max_single_sequence_length", "dataset.seq_length"),
                    ),
                ),
                site("GPT SFT input path does not exist", DATA_CONTENT),
            ),
            "prepare_gpt_sft_packed_data": DATA_CONTENT,
        },
    ),
    *groups(
        MB + "data/packing/algorithms.py",
        {
            "fill_packing_strategy": (HOST_DATA, site("raise ValueError", DATA_CONTENT), site("left over", INVARIANT)),
            "get_seqlen_list": INVARIANT,
            "calculate_avg_seqlen": (
                unreachable(
                    "FLOP accounting (training/utils/flop_utils.py, Llama-3-70B LoRA SQuAD only) over the train "
                    "pack: a pack with fewer rows than one global batch is refused first by the loaders ('Not "
                    "enough train samples', mapped in data/loaders.py)"
                ),
                site("No sequences found", DATA_CONTENT),
            ),
        },
    ),
    *groups(
        MB + "data/packing/paths.py",
        {
            "_resolve_parquet_paths": PACKED_PATH,
            "resolve_packed_parquet_paths_with_retry": RERAISE,
        },
    ),
    *groups(
        MB + "data/packing/config.py",
        {
            "PackedSequenceSpecs.__post_init__": config_class(
                "PackedSequenceSpecs.__post_init__ (when the specs are built; offline.max_single_within_pack "
                "reports the bound too)"
            ),
            "PackedSequenceSpecs._validate_packed_path": config_class(
                "PackedSequenceSpecs.__post_init__ -> _validate_packed_path (explicit packed paths must resolve)",
                (f"{SPECS}.packed_train_data_path", f"{SPECS}.packed_val_data_path"),
            ),
        },
    ),
    *groups(
        MB + "data/packing/in_batch.py",
        {
            "_token_key": unreachable("the VLM collates always emit input_ids (or tokens) as a 2D tensor"),
            "_right_padded_sequence_lengths": (
                HOST_DATA,
                site(
                    "right-padded",
                    unreachable(
                        "the collates pad on the right (collators/sequence_padding.use_processor_right_padding "
                        "wraps the processor call)"
                    ),
                ),
            ),
            "_validate_sequence_tensor": unreachable("the collates build every key with the token shape"),
            "_validate_sequence_row_tensor": unreachable("the collates build every key with the token shape"),
            "build_mcore_thd_sequence_batch_from_rows": (
                unreachable(
                    "called by the model collates with rows they unpadded themselves, pad_to_multiple_of from "
                    "ConfigContainer.validate (lcm(2*CP, CP*TP), >= 1) and sequence_length = dataset.seq_length"
                ),
                site(
                    "exceeds configured sequence_length",
                    harmless(
                        "data content: an example longer than dataset.seq_length after the processor's expansion "
                        "(the collates truncate before packing, except Kimi's, which refuses: see its collate)"
                    ),
                ),
            ),
            "pack_right_padded_sequence_batch_to_mcore_thd": (
                unreachable("the sequence collate passes the batch it built (2D tokens, position_ids, mask)"),
                site("empty sequence row", DATA_CONTENT),
            ),
        },
    ),
    *groups(
        MB + "data/builders/direct_hf_sft.py",
        {
            "DirectHFSFTDatasetConfig.validate": config_class("DirectHFSFTDatasetConfig.validate (validate())"),
            "load_direct_hf_sft_processor": unreachable(
                "the training setup builds the tokenizer / processor before the datasets"
            ),
            "select_direct_hf_sft_collate": gap(
                ("dataset.preprocessing",),
                "multimodal rows with a chat loss_mode other than 'assistant', or prompt-completion preprocessing "
                "over multimodal rows, raise when the dataset is built, after the model (data-dependent)",
                general=True,
            ),
            "build_direct_hf_sft_split": gap(
                ("dataset.preprocessing", "dataset.hf_processor_path"),
                "a processor whose collate is required for all examples (Nemotron Omni) with prompt-completion "
                "preprocessing raises when the dataset is built",
                general=True,
            ),
            "DirectHFSFTDatasetBuilder.build": gap(
                ("dataset.do_validation", "dataset.do_test", "dataset.validation_source", "dataset.test_source"),
                "a Hugging Face source without a validation / test split while do_validation / do_test is on "
                "raises when the datasets are built; GPTSFTDatasetConfig.validate checks this at config time, "
                "DirectHFSFTDatasetConfig.validate does not",
                general=True,
            ),
        },
    ),
    *groups(
        MB + "data/builders/mock_vlm_sft.py",
        {"MockVLMSFTDatasetConfig.validate": config_class("MockVLMSFTDatasetConfig.validate (validate())")},
    ),
    *groups(
        MB + "data/builders/energon.py",
        {
            "_validate_hf_path": config_class("Energon task-encoder config validate (validate())"),
            "HFEnergonTaskEncoderConfig.validate": config_class("HFEnergonTaskEncoderConfig.validate (validate())"),
            "QwenVLEnergonTaskEncoderConfig.validate": config_class(
                "QwenVLEnergonTaskEncoderConfig.validate (validate())"
            ),
            "NemotronOmniEnergonTaskEncoderConfig.validate": config_class(
                "NemotronOmniEnergonTaskEncoderConfig.validate (validate())"
            ),
            "EnergonDatasetConfig.validate": config_class("EnergonDatasetConfig.validate (validate())"),
            "EnergonDatasetBuilder.build": unreachable("EnergonDatasetConfig.validate requires a non-empty path"),
        },
    ),
    *groups(
        MB + "data/datasets/direct_sft.py",
        {
            "_collate_kwargs_for_impl": guarded(
                "vlm.collate_refuses_packing",
                "in-batch packing with a collate that takes no enable_in_batch_packing argument raises when the "
                "dataset is built",
                ("dataset.enable_in_batch_packing",),
            ),
            "DirectSFTDataset.__init__": (
                DATA_CONTENT,
                site("collate_impl is not None", unreachable("the builder resolves a collate before this")),
            ),
            "DirectSFTDataset.__getitem__": DATA_CONTENT,
        },
    ),
    *groups(
        MB + "data/collators/registry.py",
        {
            "resolve_model_collate": (
                gap(
                    ("dataset.hf_processor_path",),
                    "a DirectHF / Energon VLM dataset whose processor has no registered collate (and no collate "
                    "passed) raises at the first batch, after the model is built",
                    general=True,
                ),
                site("is not callable", INVARIANT),
            ),
        },
    ),
    *groups(
        MB + "data/collators/sequence_padding.py",
        {
            "_token_key": unreachable("the collates always emit input_ids (or tokens) as a 2D tensor"),
            "_pad_or_truncate_2d": unreachable("the collates pass 2D sequence tensors they built"),
            "_pad_or_truncate_position_ids": unreachable("the collates pass 2D position_ids they built"),
            "_pad_or_truncate_attention_mask": unreachable("the collates pass the processor's 2D attention mask"),
            "pad_or_truncate_sequence_batch": (
                unreachable("called with the collate's 2D tokens and dataset.seq_length (> 0 at validate())"),
                site(
                    "removed every supervised token",
                    harmless(
                        "data content vs dataset.seq_length: rows whose supervised tokens all lie past "
                        "seq_length; raised at the first such batch with the rows named",
                        ("dataset.seq_length",),
                    ),
                ),
                site("", HOST_DATA, "tolist"),
                site("", HOST_DATA, "dynamic_shape"),
            ),
        },
    ),
    *groups(
        MB + "data/collators/sft.py",
        {"_build_text_sft_batch": (HOST_DATA, site("at least one example", INVARIANT))},
    ),
    *groups(
        MB + "data/sft_processing.py",
        {
            "ChatSFTPreprocessingConfig.validate": config_class("ChatSFTPreprocessingConfig.validate (validate())"),
            "PromptCompletionSFTPreprocessingConfig.validate": config_class(
                "PromptCompletionSFTPreprocessingConfig.validate (validate())"
            ),
            "validate_sft_preprocessing_config": config_class("validate_sft_preprocessing_config (validate())"),
            "_canonical_prompt_completion_values": DATA_CONTENT,
            "normalize_sft_example": DATA_CONTENT,
            "normalize_sft_examples": DATA_CONTENT,
            "_tokenize_text": (DATA_CONTENT, site("cpu()", HOST_DATA)),
            "tokenize_prompt_completion_example": DATA_CONTENT,
        },
    ),
    *groups(
        MB + "data/conversation_processing.py",
        {
            "normalize_energon_vlm_sample": DATA_CONTENT,
            "normalize_hf_vlm_example": DATA_CONTENT,
            "_as_token_id_list": HOST_DATA,
            "shared_chat_template_kwargs_from_examples": DATA_CONTENT,
            "normalize_chat_conversation": DATA_CONTENT,
            "_apply_tokenized_chat_template": DATA_CONTENT,
            "tokenize_chat_example": (HOST_DATA, site("raise", DATA_CONTENT, "raise")),
            "apply_chat_loss_mode": (HOST_DATA, site("raise", DATA_CONTENT, "raise")),
            "assistant_mask_boundary_config_from_markers": DATA_CONTENT,
            "_apply_skipped_tokens": HOST_DATA,
            "_warn_if_all_masked": HOST_DATA,
            "_assistant_mask_from_conversation_turns": HOST_DATA,
            "_assistant_mask_from_boundary_config": DATA_CONTENT,
            "build_assistant_loss_mask": (HOST_DATA, site("raise", DATA_CONTENT, "raise")),
        },
    ),
    *groups(
        MB + "data/energon/base_energon_datamodule.py",
        {"EnergonMultiModalDataModule.datasets_provider": API_MISUSE},
    ),
    *groups(
        MB + "data/energon/hf_task_encoder.py",
        {
            "HFTaskEncoder._collate_batch_kwargs": (
                HOST_DATA,
                site(
                    "exceeds seq_length",
                    unreachable(
                        "the registered collates pad or truncate to sequence_length (= dataset.seq_length, "
                        "collators/sequence_padding.py) before this check; only a user collate can trip it"
                    ),
                ),
            ),
        },
    ),
    *groups(
        MB + "data/energon/task_encoder_utils.py",
        {"_tensor_to_pil": HOST_DATA, "extract_chatml_tools": DATA_CONTENT, "cook_chatml_sample": DATA_CONTENT},
    ),
    *groups(
        MB + "models/qwen_vl/data/energon.py",
        {
            "_visual_token_count": HOST_DATA,
            "QwenVLTaskEncoder.encode_sample": harmless(
                "SkipSample: Energon drops a sample that does not fit (by design), the run continues"
            ),
        },
    ),
    # -- the registered VLM collates ------------------------------------------------------------------------------
    *groups(MB + "models/qwen_vl/data/collate_fn.py", {"qwen2_5_collate_fn": ENVIRONMENT}),
    *groups(
        MB + "models/qwen_omni/data/collate_fn.py",
        {
            "qwen3_omni_collate_fn": (
                DATA_CONTENT,
                site(
                    "does not support in-batch packing",
                    guarded(
                        "vlm.collate_refuses_packing",
                        "Qwen3-Omni's collate raises on enable_in_batch_packing at the first batch",
                        ("dataset.enable_in_batch_packing",),
                    ),
                ),
            ),
        },
    ),
    *groups(
        MB + "models/nemotron_vl/data/collate_fn.py",
        {
            "nemotron_nano_v2_vl_collate_fn": (
                HOST_DATA,
                site(
                    "does not support in-batch packing",
                    guarded(
                        "vlm.collate_refuses_packing",
                        "Nemotron-VL's collate raises on enable_in_batch_packing at the first batch",
                        ("dataset.enable_in_batch_packing",),
                    ),
                ),
                site(
                    "only supports batch size == 1",
                    gap(
                        ("train.micro_batch_size",),
                        "Nemotron Nano VL v2 video samples with a micro batch > 1 assert in the collate at the "
                        "first video batch (data-dependent: image-only batches pass); no rule ties the family to "
                        "micro batch 1",
                        general=True,
                    ),
                ),
            ),
        },
    ),
    *groups(
        MB + "models/nemotron_omni/data/collate_fn.py",
        {
            "_validate_nemotron_omni_visual_keys": config_class(
                "NemotronOmniEnergonTaskEncoderConfig.validate checks visual_keys too"
            ),
            "_pad_text_rows": INVARIANT,
            "_pil_images": DATA_CONTENT,
            "_tensor_image_to_uint8": HOST_DATA,
            "_pixel_shuffled_token_count": DATA_CONTENT,
            "_render_text_conversation": DATA_CONTENT,
            "_prepare_temporal_rows": DATA_CONTENT,
            "_audio_waveform": HOST_DATA,
            "_add_audio_inputs": (
                HOST_DATA,
                site("raise", DATA_CONTENT, "raise"),
                site("assert", INVARIANT, "assert"),
            ),
            "_adjust_image_placeholders": (HOST_DATA, site("raise", DATA_CONTENT, "raise")),
            "_pack_dynamic_images": DATA_CONTENT,
            "_model_merge_row_lengths": (HOST_DATA, site("raise", DATA_CONTENT, "raise")),
            "_nonpacked_multimodal_compact_width": (
                HOST_DATA,
                site("pad_to_multiple_of must be >= 1", unreachable("pad_to_multiple_of >= 1 at validate()")),
                site("cannot shrink", INVARIANT),
                site(
                    "cannot fit the rectangular",
                    harmless("data content vs dataset.seq_length: images expand a row past seq_length"),
                ),
            ),
            "_pack_omni_rows_to_mcore_thd": (
                HOST_DATA,
                site("in_batch_packing_pad_to_multiple_of must be", unreachable("set >= 1 by validate()")),
                site("pad_to_max_length requires", unreachable("sequence_length is dataset.seq_length")),
                site(
                    "divisible by in_batch_packing_pad_to_multiple_of",
                    validated(
                        "ConfigContainer.validate: seq_length % lcm(2*CP, CP*TP) (the value it assigns to "
                        "in_batch_packing_pad_to_multiple_of)",
                        "duplicated by collate.seq_length_alignment",
                        ("dataset.seq_length", "model.context_parallel_size", "model.tensor_model_parallel_size"),
                    ),
                ),
                site("expects 2D input_ids", INVARIANT),
                site("requires an attention mask", INVARIANT),
                site("right-padded", unreachable("the processor call is wrapped in use_processor_right_padding")),
                site("empty Nemotron Omni sequence row", DATA_CONTENT),
                site("one entry per Nemotron Omni input row", INVARIANT),
                site("cannot shrink", INVARIANT),
                site("exceed configured sequence_length", harmless("data content vs dataset.seq_length")),
                site("assert sequence_length is not None", unreachable("sequence_length is dataset.seq_length")),
                site("to match input_ids", INVARIANT),
            ),
            "nemotron_omni_collate_fn": DATA_CONTENT,
        },
    ),
    *groups(
        MB + "models/qwen_audio/data/collate_fn.py",
        {"qwen2_audio_collate_fn": (DATA_CONTENT, site("tolist", HOST_DATA))},
    ),
    *groups(MB + "models/glm_vl/data/collate_fn.py", {"_build_glm4v_assistant_loss_mask": DATA_CONTENT}),
    *groups(
        MB + "models/kimi_vl/data/collate_fn.py",
        {
            "_expand_image_tokens_and_aligned_mask": HOST_DATA,
            "kimi_k25_vl_collate_fn": harmless(
                "data content vs dataset.seq_length: Kimi's collate refuses to truncate a record longer than "
                "seq_length, with its message",
                ("dataset.seq_length",),
            ),
        },
    ),
    # -- Megatron-Core pretraining datasets ------------------------------------------------------------------------
    *groups(
        MC + "datasets/gpt_dataset.py",
        {
            "GPTDatasetConfig.__post_init__": config_class(
                "GPTDatasetConfig.__post_init__ (Megatron-Bridge's GPTDatasetConfig.finalize at validate())"
            ),
            "GPTDataset.build_low_level_dataset": config_class(
                "object-storage paths need object_storage_cache_path: GPTDatasetConfig (finalize) sets it"
            ),
            "GPTDataset.__getitem__": HOST_DATA,
            "GPTDataset._query_document_sample_shuffle_indices": INVARIANT,
            "GPTDataset._build_document_sample_shuffle_indices": INVARIANT,
            "GPTDataset._get_num_tokens_per_epoch": HOST_DATA,
            "MockGPTDataset.__init__": unreachable(
                "built only for mock configs (the builder picks it by config.mock)"
            ),
        },
    ),
    *groups(
        MC + "datasets/data_schedule.py",
        {
            "HybridCPDataLoaderWrapper.__init__": guarded(
                "cp.hybrid_context_parallel",
                "the hybrid-CP data iterator needs the hybrid DP-CP groups parallel_state builds only for "
                "hybrid_context_parallel, which Megatron-Bridge 0.6.2 does not wire through",
                ("model.hybrid_context_parallel",),
            ),
            "HybridCPDataLoaderWrapper.get_global_seqlens": guarded(
                "cp.hybrid_context_parallel",
                "host reads of gathered sequence lengths in the hybrid-CP iterator (outside any graph: it runs "
                "before the step); reached only with hybrid_context_parallel",
                ("model.hybrid_context_parallel",),
            ),
        },
    ),
    # -- loaders and samplers -------------------------------------------------------------------------------------
    *groups(
        MB + "data/loaders.py",
        {
            "get_blend_and_blend_per_split": config_class("GPTDatasetConfig.finalize: blend xor blend_per_split"),
            "build_train_valid_test_datasets_for_num_epochs": (
                validated(
                    "ConfigContainer.validate (num_epochs needs GPTSFTDatasetConfig and dataloader_type='batch')",
                    "duplicated at validate()",
                ),
                site("requires a training dataset", DATA_CONTENT),
            ),
            "build_train_valid_test_data_loaders": (
                harmless("host reads of the do_train / do_valid / do_test flags, once at setup, outside any graph"),
                site("MegatronMIMO", unreachable("MIMO models only; not a packing path")),
                site("num_epochs is currently supported only", validated("ConfigContainer.validate", "duplicated")),
                site(
                    "drop_last=False requires GPTSFTDatasetConfig",
                    gap(
                        ("dataset.dataloader_type", "dataset.drop_last", "train.global_batch_size"),
                        "dataloader_type='batch' with drop_last=False over a non-GPT-SFT dataset (DirectHF, "
                        "Energon, mock VLM) whose length is not a multiple of the global batch raises when the "
                        "loaders are built (after the model); the length is data, the combination is config",
                        general=True,
                    ),
                ),
                site(
                    "Not enough train samples",
                    guarded(
                        "offline.train_split_rows",
                        "a packed train split with fewer rows (or max_train_samples) than one global batch raises "
                        "when the loaders are built; an unpacked JSONL split's length is its line count, which no "
                        "rule reads (a data size)",
                        ("train.global_batch_size", f"{SPECS}.packed_train_data_path", "dataset.max_train_samples"),
                    ),
                ),
            ),
            "build_train_valid_test_data_iterators": known_value("dataset.dataloader_type"),
            "build_train_valid_test_data_iterators._get_iterator": known_value("dataset.dataloader_type"),
        },
    ),
    *groups(
        MB + "data/samplers.py",
        {
            "build_pretraining_data_loader": (
                known_value("dataset.dataloader_type"),
                site(
                    "global_batch_size must be provided",
                    unreachable("the loaders always pass train.global_batch_size / eval_gbs"),
                ),
            ),
            "MegatronPretrainingSampler.__init__": (
                unreachable("micro batch, DP size and rank are positive and consistent by construction"),
                EMPTY_SPLIT,
                site(
                    "no samples left to consume",
                    guarded(
                        "resume.repacked_data",
                        "consumed_samples from a checkpoint beyond the current split's length (the data was "
                        "re-packed into fewer rows since the checkpoint)",
                        ("checkpoint.load", f"{SPECS}.packed_sequence_size"),
                    ),
                ),
            ),
            "MegatronPretrainingBatchSampler.__init__": (
                unreachable("micro batch, DP size and rank are positive and consistent by construction"),
                EMPTY_SPLIT,
                site(
                    "is not divisible by",
                    guarded(
                        "batch.global_batch_divisible",
                        "the train global batch not divisible by micro batch x DP (the micro-batch calculator asserts "
                        "the same at setup); for the eval loaders ConfigContainer.validate asserts "
                        "eval_global_batch_size % (eval micro batch x DP) itself",
                        ("train.global_batch_size", "validation.eval_global_batch_size"),
                    ),
                ),
            ),
            "MegatronPretrainingBatchSampler._active_total_samples": guarded(
                "eval.packed_split_rows",
                "a split (the packed validation split, typically small) with fewer rows than one global batch "
                "under drop_last asserts at the first evaluation",
                ("validation.eval_global_batch_size", "train.global_batch_size", f"{SPECS}.packed_val_data_path"),
            ),
            "MegatronPretrainingBatchSampler.__iter__": (
                HOST_DATA,
                site("assert len(all_indices)", INVARIANT),
            ),
            "MegatronPretrainingRandomSampler.__init__": unreachable(
                "micro batch, DP size and rank are positive by construction; an empty split is the same as for "
                "the batch sampler (eval.packed_split_rows) but 'cyclic' is the pretraining validation loader, "
                "not the packed SFT one"
            ),
            "MegatronPretrainingRandomSampler.__iter__": (HOST_DATA, site("assert", INVARIANT, "assert")),
        },
    ),
    *groups(
        MB + "data/batch_utils.py",
        {
            "split_batch_into_microbatches": unreachable(
                "splits a global batch the batch sampler built as num_microbatches x micro batch"
            ),
        },
    ),
    *groups(MB + "data/utils.py", {"get_dataset_provider": API_MISUSE}),
    *groups(
        MB + "data/base.py",
        {
            "DatasetProvider.build_datasets": API_MISUSE,
            "validate_declarative_mapping._validate": config_class("validate_declarative_mapping (validate())"),
            "validate_declarative_mapping": config_class("validate_declarative_mapping (validate())"),
        },
    ),
)
