"""The long-prompt flags the tests give the tiny engine, in one place.

B goes out at 0.25 s. The tiny engine decoded A's whole reply in ~0.6 s in the default context
(751 tokens of room), and on an AVX-512 EPYC in bf16 before B's first token: a run where A ends
before B's first token is invalid (and a mixed server carries no decode rows). A context of 2,048
gives A 2,031 tokens, past any B of 600 tokens in 64-row cuts."""
LONG_PROMPT = ["--model", "tiny", "--b-at", "0.25", "--c-after", "0.2", "--b-tokens", "600", "--prefill-rows", "64",
               "--max-model-len", "2048"]
