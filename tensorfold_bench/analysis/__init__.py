"""Figures from raw records (per scenario, with one registry of names and units), the
statistics of a comparison, token-hash exactness and predictions: pure functions, no I/O."""
