"""The router service: the public LLMService — validation, admission, routing, guard, settlement."""
