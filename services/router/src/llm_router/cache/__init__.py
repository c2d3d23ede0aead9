"""The response cache seen from the router: lookups, the near cache and its feed."""
