"""Continuous-batching PyTorch inference engine with a paged KV cache and prefix caching."""
