"""Replica discovery: which replicas each deployment has, found statically, by DNS or from
Kubernetes EndpointSlices, and admitted only once probed (see watcher.py)."""
