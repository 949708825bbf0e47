"""CLI verbs, one module each (see `memlens.cli`)."""
