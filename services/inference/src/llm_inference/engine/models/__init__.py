"""Decoder model definitions (the Llama family) and their configuration."""
