"""Sentence embeddings for embedding deployments: a BERT encoder with mean pooling."""
