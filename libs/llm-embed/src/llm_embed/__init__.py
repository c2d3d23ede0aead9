"""One sentence encoder (BERT + mean pooling) for every service that embeds text."""

from llm_embed.bert import BertConfig, BertEncoder, ModelLoadError, load_bert, mean_pool
from llm_embed.encoder import DEFAULT_MAX_LENGTH, Embedded, SentenceEncoder

__all__ = [
    "DEFAULT_MAX_LENGTH",
    "BertConfig",
    "BertEncoder",
    "Embedded",
    "ModelLoadError",
    "SentenceEncoder",
    "load_bert",
    "mean_pool",
]
