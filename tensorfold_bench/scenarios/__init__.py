"""The scenarios, each a `session.driver.Scenario`: long-prompt (a cold prompt against a decoding
stream and a short chat: a script built from its flags, played as scripts are), script (a YAML
timeline of streams), sweep (concurrent decode at several stream counts), load (a workload at
each level); the gate composes them for CI. Each says what it plays on a run's server and what
it measures; the driver does the rest."""
