"""The client: requests and their raw records (`stream`), the HTTP/1.1 wire under it, worker
processes for wide bursts, sampling parameters, and the client's self-check. It knows nothing
of scenarios, sessions or receipts."""
