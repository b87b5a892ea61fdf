"""The KV cache: a plain module with two buffers allocated once and written in place by index.

k and v: [layers, lanes + 1, max_model_len, kv_heads, head_dim] in the model's dtype. Lane i is
region i; the extra last lane (`spare`) takes the writes of a decode round's padding rows, so a
padded row never touches a real lane.
"""
from __future__ import annotations

import torch
import torch.nn as nn

from engine.config import ModelConfig


class KVCache(nn.Module):
    def __init__(self, cfg: ModelConfig, lanes: int, max_len: int, dtype: torch.dtype, device):
        super().__init__()
        shape = (cfg.num_hidden_layers, lanes + 1, max_len, cfg.num_key_value_heads, cfg.head_dim)
        self.register_buffer("k", torch.zeros(shape, dtype=dtype, device=device), persistent=False)
        self.register_buffer("v", torch.zeros(shape, dtype=dtype, device=device), persistent=False)
        self.lanes, self.max_len, self.spare = lanes, max_len, lanes

    @staticmethod
    def bytes_for(cfg: ModelConfig, lanes: int, max_len: int, dtype: torch.dtype) -> int:
        """What a cache of `lanes` lanes (plus the spare) of `max_len` rows takes, K and V."""
        row = 2 * cfg.num_hidden_layers * cfg.num_key_value_heads * cfg.head_dim
        return row * (lanes + 1) * max_len * torch.empty(0, dtype=dtype).element_size()

    def nbytes(self) -> int:
        return self.k.numel() * self.k.element_size() * 2

    def row_bytes(self) -> int:
        """Bytes of K and V one token occupies across all layers."""
        l, _, _, h, d = self.k.shape
        return 2 * l * h * d * self.k.element_size()
