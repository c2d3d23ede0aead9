"""Settlement: billing what was produced, and the durable outbox for what billing could not take."""
