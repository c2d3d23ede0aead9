"""Model routing, replica load and selection, and dispatch with failover."""
