"""Typed clients of the services the router calls, one module per dependency: per-call
deadlines, breakers, domain errors (`calls`), and nothing of the router's own logic."""
