"""`tfbench calibrate`: the client's own error, measured against a synthetic server whose every
send time is known."""
