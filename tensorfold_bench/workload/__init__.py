"""Workloads for `tfbench load`: what to send (datasets, synthetic lengths, traces, multi-turn
sessions) and when (arrival processes). Pure: no server, no clock; the same seed gives the same
requests at the same offsets in every run and variant."""
