"""The inference service: continuous-batching generation and sentence embeddings over gRPC."""
