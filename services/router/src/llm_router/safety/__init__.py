"""Per-tenant safety: policies, the input guard, the streaming output guard, PII."""
