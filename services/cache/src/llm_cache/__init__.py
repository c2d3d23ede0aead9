"""Cache service: exact and semantic response cache with tenant isolation."""
