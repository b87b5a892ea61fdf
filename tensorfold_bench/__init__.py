"""tfbench: launches fresh engine servers, plays scripted request scenarios, timestamps every
token, hashes every reply and writes receipts (Markdown + JSON + a timeline picture)."""

__version__ = "0.1.0"
SCHEMA = "tfbench.receipt/4"  # the receipt's data as the driver writes it; report.store reads every older one
