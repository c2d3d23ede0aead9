"""Prompt tokens: in-process tokenization, attestation, the memo, speculation."""
