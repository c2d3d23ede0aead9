"""OpenAI-compatible HTTP API (/v1/chat/completions, /v1/completions, /v1/embeddings,
/v1/models) as a thin translator onto the router's own LLMService."""

from llm_router.api.openai_http.server import OpenAIHttp, start_openai_http

__all__ = ["OpenAIHttp", "start_openai_http"]
