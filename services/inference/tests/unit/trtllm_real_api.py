"""The real TensorRT-LLM LLM API surface the adapter may use, recorded from NVIDIA/TensorRT-LLM
sources (the package needs CUDA images and cannot be installed here). test_trtllm_api.py checks
the stand-in (tests/fakes/tensorrt_llm) and the adapter's actual calls against this table.

Target release: v1.3.0rc23 or later (PyTorch backend). Where each entry was read:
- LLM.__init__, generate_async, get_stats, get_kv_cache_capacity, shutdown:
  tensorrt_llm/llmapi/llm.py on main after PR #12362 ("Adding support for request priority in
  LLM API", merged 2026-03: `priority: float = DEFAULT_REQUEST_PRIORITY` (0.5), validated to
  [0, 1], honoured by the PyTorch executor's PRIORITY waiting queue, ignored under FCFS).
- RequestOutput.cached_tokens: PR #7637 ("Support cached tokens for Openai server", merged
  2025-09; trtllm-serve reports `rsp.cached_tokens` as prompt_tokens_details.cached_tokens);
  read through `generate_async` results on 1.3.0rc23 by ai-dynamo/dynamo#13567.
- CompletionOutput: the published 1.3.0rc26 API reference (llm-api/reference.html) and
  tensorrt_llm/executor/result.py (diff properties).
- KvCacheConfig, BaseLlmArgs fields: tensorrt_llm/llmapi/llm_args.py (pydantic, extra="forbid",
  so an unknown field is an error there too). enable_iter_perf_stats / enable_iter_req_stats:
  TorchLlmArgs.
- SamplingParams / GuidedDecodingParams: tensorrt_llm/sampling_params.py (commit a98a9061).
"""

from __future__ import annotations

RELEASE = "v1.3.0rc23+"

LLM_INIT = (
    "model", "tokenizer", "tokenizer_mode", "skip_tokenizer_init", "trust_remote_code",
    "tensor_parallel_size", "dtype", "revision", "tokenizer_revision",
)  # fmt: skip  # then **kwargs: TorchLlmArgs fields

# BaseLlmArgs / TorchLlmArgs fields (a subset: the ones the adapter or the stand-in name).
LLM_ARGS = frozenset(
    {
        "pipeline_parallel_size", "context_parallel_size", "kv_cache_config",
        "enable_chunked_prefill", "guided_decoding_backend", "max_batch_size", "max_input_len",
        "max_seq_len", "max_beam_width", "max_num_tokens", "backend", "return_perf_metrics",
        "scheduler_config", "enable_iter_perf_stats", "enable_iter_req_stats",
    }
)  # fmt: skip

GENERATE_ASYNC = (
    "inputs", "sampling_params", "lora_request", "prompt_adapter_request", "streaming",
    "kv_cache_retention_config", "disaggregated_params", "trace_headers", "_postproc_params",
    "scheduling_params", "conversation_params", "cache_salt", "priority",
)  # fmt: skip
DEFAULT_REQUEST_PRIORITY = 0.5

LLM_METHODS = frozenset(
    {
        "generate", "generate_async", "get_stats", "get_stats_async", "get_kv_cache_capacity",
        "get_kv_cache_events", "get_kv_cache_events_async", "shutdown", "tokenizer", "args",
    }
)  # fmt: skip

# RequestOutput (GenerationResult): attributes and methods a caller reads.
REQUEST_OUTPUT = frozenset(
    {
        "request_id", "prompt", "prompt_token_ids", "outputs", "context_logits", "finished",
        "cached_tokens", "abort", "aborted", "aresult", "result",
    }
)  # fmt: skip

COMPLETION_OUTPUT_FIELDS = (
    "index", "text", "token_ids", "cumulative_logprob", "logprobs", "prompt_logprobs",
    "finish_reason", "stop_reason", "generation_logits", "additional_context_outputs",
    "additional_generation_outputs", "disaggregated_params", "request_perf_metrics",
)  # fmt: skip
COMPLETION_OUTPUT = frozenset(
    {*COMPLETION_OUTPUT_FIELDS, "length", "text_diff", "token_ids_diff", "logprobs_diff"}
)

KV_CACHE_CONFIG = frozenset(
    {
        "enable_block_reuse", "max_tokens", "max_attention_window", "sink_token_length",
        "free_gpu_memory_fraction", "host_cache_size", "onboard_blocks",
        "cross_kv_cache_fraction", "secondary_offload_min_priority", "event_buffer_max_size",
        "attention_dp_events_gather_period_ms", "enable_partial_reuse", "copy_on_partial_reuse",
        "use_uvm", "max_gpu_total_bytes", "dtype", "mamba_ssm_cache_dtype", "tokens_per_block",
        "use_kv_cache_manager_v2", "max_util_for_resume",
    }
)  # fmt: skip

SAMPLING_PARAMS = (
    "end_id", "pad_id", "max_tokens", "bad", "bad_token_ids", "stop", "stop_token_ids",
    "include_stop_str_in_output", "embedding_bias", "logits_processor",
    "apply_batched_logits_processor", "n", "best_of", "use_beam_search", "top_k", "top_p",
    "top_p_min", "top_p_reset_ids", "top_p_decay", "seed", "temperature", "min_tokens",
    "beam_search_diversity_rate", "repetition_penalty", "presence_penalty",
    "frequency_penalty", "length_penalty", "early_stopping", "no_repeat_ngram_size", "min_p",
    "beam_width_array", "logprobs", "prompt_logprobs", "return_context_logits",
    "return_generation_logits", "exclude_input_from_output", "return_encoder_output",
    "return_perf_metrics", "additional_model_outputs", "lookahead_config", "guided_decoding",
    "ignore_eos", "detokenize", "add_special_tokens", "truncate_prompt_tokens",
    "skip_special_tokens", "spaces_between_special_tokens",
)  # fmt: skip

GUIDED_DECODING_PARAMS = ("json", "regex", "grammar", "json_object", "structural_tag")
