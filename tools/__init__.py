"""Developer tools, out of the server's way: benches, device checks and probes (tools/README.md)."""
