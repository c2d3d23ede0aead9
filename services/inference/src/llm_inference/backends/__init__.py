"""Generation backends behind engine.api.GenerationBackend: torch (default) and tensorrt_llm."""
