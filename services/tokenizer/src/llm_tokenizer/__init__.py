"""The tokenizer service: Hugging Face tokenizers and chat templates behind llmapi.tokenizer.v1."""
