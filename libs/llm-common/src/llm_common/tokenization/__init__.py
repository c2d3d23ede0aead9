"""Hugging Face tokenizers and chat templates for models.yaml models (the `tokenization` extra)."""
