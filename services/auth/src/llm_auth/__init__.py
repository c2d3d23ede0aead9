"""The auth service: API keys, JWT, scopes and exact distributed rate limits."""
