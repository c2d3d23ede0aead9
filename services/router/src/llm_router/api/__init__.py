"""The public surface: the LLMService servicer, request validation and the caller's identity."""
