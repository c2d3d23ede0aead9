"""A started generation: its sources, the output guard relay, answers and choices."""
