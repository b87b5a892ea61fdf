"""Configuration passed explicitly to every constructor: the model's shape and the engine's knobs."""
from __future__ import annotations

import json
import math
import os
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path

SHORT_ROWS = 512  # a prompt with at most this many rows left goes in whole, before the next round


class ConfigError(ValueError):
    """Bad configuration: reported as one line, never a traceback."""


@dataclass(frozen=True)
class ModelConfig:
    """The subset of a Hugging Face Qwen3 `config.json` that the model uses."""

    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    rms_norm_eps: float = 1e-6
    rope_theta: float = 1_000_000.0
    max_position_embeddings: int = 40_960
    tie_word_embeddings: bool = False
    eos_token_id: int = 0
    bos_token_id: int | None = None

    @classmethod
    def from_dict(cls, d: dict) -> "ModelConfig":
        names = {f.name for f in fields(cls)}
        kw = {k: v for k, v in d.items() if k in names}
        if isinstance(kw.get("eos_token_id"), list):
            kw["eos_token_id"] = kw["eos_token_id"][0]
        if "head_dim" not in kw:
            kw["head_dim"] = d["hidden_size"] // d["num_attention_heads"]
        return cls(**kw)

    @classmethod
    def from_json(cls, path: str | Path) -> "ModelConfig":
        return cls.from_dict(json.loads(Path(path).read_text()))

    def to_hf_dict(self) -> dict:
        d = asdict(self)
        d.update(architectures=["Qwen3ForCausalLM"], model_type="qwen3", hidden_act="silu",
                 attention_bias=False, torch_dtype="float32")
        return d

    def num_parameters(self) -> int:
        h, i, l = self.hidden_size, self.intermediate_size, self.num_hidden_layers
        q = self.num_attention_heads * self.head_dim
        kv = self.num_key_value_heads * self.head_dim
        layer = h * q + 2 * h * kv + q * h + 3 * h * i + 2 * h + 2 * self.head_dim
        emb = self.vocab_size * h * (1 if self.tie_word_embeddings else 2)
        return l * layer + emb + h


def share_from_env(flag: float | None) -> float:
    """The prefill share: the flag wins over TENSORFOLD_PREFILL_SHARE; unset means 1."""
    if flag is not None:
        return flag
    raw = os.environ.get("TENSORFOLD_PREFILL_SHARE")
    if raw is None or raw.strip() == "":
        return 1.0
    try:
        return float(raw)
    except ValueError:
        return math.nan  # the host's guard turns it into 1 with a warning


@dataclass(frozen=True)
class KernelConfig:
    """Which kernels the model runner uses. The server runs the defaults; benches and GPU checks
    turn one off to measure or check the path beside it."""

    # The decode round as one CUDA graph. None: on for CUDA, off on the CPU (asking for it on the
    # CPU falls back to eager rounds and records why).
    cuda_graph: bool | None = None
    fused: bool = True  # CUDA: Triton kernels around the matmuls (off: plain torch ops)
    # CUDA, with fused: decode rounds' matmuls in Triton (engine/kernels_skinny.py) on the shapes
    # where they measured faster than cuBLAS: qwen3-8b's round 4.91 -> 4.59 ms (engine/dev/PERF.md run 5).
    skinny: bool = True
    # CUDA, with fused: prompt cuts of <= SHORT_ROWS rows through row-invariant Triton tiles, alone
    # or several in one forward (ModelRunner.prefill_many). Off: the tiles take 1.5-2x cuBLAS's
    # time, so one short prompt alone fills slower (engine/dev/PERF.md runs 8-10).
    batch_cuts: bool = False


@dataclass
class EngineConfig:
    """Everything `tfengine serve` is told, minus where to listen."""

    model: str = "tiny"  # preset name or a local Hugging Face layout directory
    load_format: str = "dummy"  # dummy | safetensors
    device: str = "cpu"
    dtype: str = "float32"  # float32 | bfloat16
    parallel: int = 4
    max_model_len: int = 4096
    prefill_rows: int = 256
    prefill_mode: str = "stepped"  # stepped | whole
    prefill_share: float = 1.0
    prompt_cache: bool = True
    drafter: str | None = None
    drafts: bool = True
    seed: int = 0
    aging_s: float = 30.0  # a prompt waiting longer than this is filled before younger ones
    out_queue: int = 64  # tokens a client may leave undrained before its stream is paused
    trace: bool = False  # keep a per-step trace (reads the clock every step)
    trace_len: int = 50_000  # the trace is a ring of the last this many steps (~90 bytes each as JSON)
    kernels: KernelConfig = field(default_factory=KernelConfig)

    def __post_init__(self):
        if self.load_format not in ("dummy", "safetensors"):
            raise ConfigError(f"--load-format must be dummy or safetensors, not {self.load_format!r}")
        if self.dtype not in ("float32", "bfloat16"):
            raise ConfigError(f"--dtype must be float32 or bfloat16, not {self.dtype!r}")
        if self.prefill_mode not in ("stepped", "whole"):
            raise ConfigError(f"--prefill-mode must be stepped or whole, not {self.prefill_mode!r}")
        if self.parallel < 1:
            raise ConfigError("--parallel must be at least 1")
        if self.max_model_len < 2:
            raise ConfigError("--max-model-len must be at least 2")
        if self.prefill_rows < 1:
            raise ConfigError("--prefill-rows must be at least 1")
        if self.trace_len < 1:
            raise ConfigError("--trace-len must be at least 1")
