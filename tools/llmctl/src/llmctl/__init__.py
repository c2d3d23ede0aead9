"""llmctl: the platform from the command line, through the edge."""
