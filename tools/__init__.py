"""Developer tools, out of the server's way: benches, GPU checks and their measured notes (PERF.md)."""
