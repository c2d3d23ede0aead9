"""Shared runtime for the platform's gRPC services (import the submodules directly)."""
