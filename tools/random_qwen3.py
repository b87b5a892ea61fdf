"""Write a random Qwen3 checkpoint directory (bf16 safetensors) that vLLM and tfengine both load.

    python -m tools.random_qwen3 DIR [--seed 0]

Shape of the CPU comparison against vLLM: hidden 512, 8 layers, 8/4 heads of 64, intermediate 1,536,
vocab 8,192. No tokenizer is written: both engines are driven with token-id prompts
(vLLM with --skip-tokenizer-init).
"""
from __future__ import annotations

import argparse
from pathlib import Path

import torch


def write(out: Path, seed: int = 0) -> None:
    from transformers import Qwen3Config, Qwen3ForCausalLM
    cfg = Qwen3Config(vocab_size=8192, hidden_size=512, intermediate_size=1536, num_hidden_layers=8,
                      num_attention_heads=8, num_key_value_heads=4, head_dim=64,
                      max_position_embeddings=16384, rope_theta=1_000_000.0, rms_norm_eps=1e-6,
                      tie_word_embeddings=False, eos_token_id=1, bos_token_id=0)
    torch.manual_seed(seed)
    model = Qwen3ForCausalLM(cfg).to(torch.bfloat16)
    model.save_pretrained(out, safe_serialization=True)


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("dir", type=Path)
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args()
    write(a.dir, a.seed)
    print(f"wrote {a.dir}")
