"""The platform's Envoy configurations, rendered from one Python description."""
