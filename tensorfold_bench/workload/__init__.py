"""Workloads for `tfbench load`: what to send (datasets, synthetic lengths, traces, multi-turn
sessions) and when (arrival processes). Pure: no server, no clock; the same seed gives the same
requests at the same offsets in every run and variant.

    model     Item, Workload: the request model the player plays
    spec      from_flags (every flag and file line checked) -> LoadSpec: .levels, .build(level, vocab)
    arrivals  poisson, gamma (--burstiness), constant offsets
    lengths   --input-len / --output-len forms
    inject    --inject: cold long prompts at fixed times
    files     a file's records (requests or sessions, with their lines); readers: JSONL, ShareGPT, Mooncake
    ids       seeded random token ids and Mooncake blocks"""
