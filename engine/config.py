"""Configuration passed explicitly to every constructor: the model's shape and the engine's knobs."""
from __future__ import annotations

import math
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Mapping

SHORT_ROWS = 512  # a prompt with at most this many rows to fill goes in whole, before the next round


class ConfigError(ValueError):
    """Bad configuration: reported as one line, never a traceback."""


@dataclass(frozen=True)
class GenerationDefaults:
    """Sampling defaults a checkpoint's `generation_config.json` sets (None: not set). A server
    applies them to requests that leave the field out, as vLLM's `--generation-config auto`."""

    FIELDS = ("temperature", "top_p", "top_k", "min_p", "repetition_penalty", "do_sample", "max_new_tokens")
    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    min_p: float | None = None
    repetition_penalty: float | None = None
    do_sample: bool | None = None
    max_new_tokens: int | None = None

    def __post_init__(self):
        for name in self.FIELDS:
            v = getattr(self, name)
            want = bool if name == "do_sample" else int if name in ("top_k", "max_new_tokens") else (int, float)
            if v is not None and (not isinstance(v, want) or (want is not bool and isinstance(v, bool))):
                raise ValueError(f"{name} must be {getattr(want, '__name__', 'a number')}, not {v!r}")

    def sampling_defaults(self) -> dict:
        """The fields that are set, under OpenAI request names (max_new_tokens -> max_tokens)."""
        out = {k: getattr(self, k) for k in ("temperature", "top_p", "top_k", "min_p", "repetition_penalty")
               if getattr(self, k) is not None}
        if self.max_new_tokens is not None:
            out["max_tokens"] = self.max_new_tokens
        return out


@dataclass(frozen=True)
class ModelConfig:
    """The subset of a Hugging Face Qwen3 `config.json` that the model uses (engine/models/hf_config.py
    from_hf_dict / read_model_dir read one). `eos_token_ids`: every id that ends a reply; `eos_token_id` is the first of them."""

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
    eos_token_ids: tuple[int, ...] = ()
    # Not the shape: what the checkpoint was saved in, and its generation_config.json defaults.
    dtype: str | None = field(default=None, compare=False)
    generation: GenerationDefaults = field(default_factory=GenerationDefaults, compare=False)

    def __post_init__(self):
        # eos_token_ids always starts with eos_token_id (so dataclasses.replace of either stays coherent)
        rest = tuple(i for i in self.eos_token_ids if i != self.eos_token_id)
        object.__setattr__(self, "eos_token_ids", (self.eos_token_id, *rest))

    def to_hf_dict(self) -> dict:
        """config.json as transformers writes it; RoPE both ways, so 4.x and 5.x read the same base."""
        d = {f.name: getattr(self, f.name) for f in fields(self)
             if f.name not in ("eos_token_ids", "dtype", "generation")}
        d["eos_token_id"] = list(self.eos_token_ids) if len(self.eos_token_ids) > 1 else self.eos_token_id
        d["rope_parameters"] = {"rope_theta": self.rope_theta, "rope_type": "default"}
        d.update(architectures=["Qwen3ForCausalLM"], model_type="qwen3", hidden_act="silu",
                 attention_bias=False, torch_dtype=self.dtype or "float32")
        return d

    def num_parameters(self) -> int:
        h, i, l = self.hidden_size, self.intermediate_size, self.num_hidden_layers
        q = self.num_attention_heads * self.head_dim
        kv = self.num_key_value_heads * self.head_dim
        layer = h * q + 2 * h * kv + q * h + 3 * h * i + 2 * h + 2 * self.head_dim
        emb = self.vocab_size * h * (1 if self.tie_word_embeddings else 2)
        return l * layer + emb + h


@dataclass(frozen=True)
class Toolchain:
    """How the CPU kernels' C and C++ sources are built (engine/cpu/decode_attention.py, round.py):
    the compilers, the build cache, and whether the C kernels are tried at all. `tfengine serve`
    reads CC, CXX, TFENGINE_CACHE and TFENGINE_NO_CC once at start (`from_env`); a runner made in
    a test or a tool takes these defaults unless told otherwise."""

    cc: str = "cc"
    cxx: str = "c++"
    cache: str = ""  # the build cache both CPU libraries share; "": ~/.cache/tfengine
    c_kernels: bool = True  # False: the batched-matmul decode attention, no C library (TFENGINE_NO_CC=1)

    @classmethod
    def from_env(cls, env: Mapping[str, str]) -> "Toolchain":
        return cls(cc=env.get("CC") or "cc", cxx=env.get("CXX") or "c++", cache=env.get("TFENGINE_CACHE") or "",
                   c_kernels=env.get("TFENGINE_NO_CC", "") in ("", "0"))

    def cache_dir(self) -> Path:
        return Path(self.cache) if self.cache else Path.home() / ".cache" / "tfengine"


@dataclass(frozen=True)
class KernelConfig:
    """Which kernels the model runner uses. The server runs the defaults; benches and GPU checks
    turn one off to measure or check the path beside it."""

    def pdl_for(self, tensor_parallel: int, capability: tuple[int, int]) -> int:
        """The decode graph's PDL mode: the knob, or by default 3 at one rank on Hopper or later."""
        if self.pdl is not None:
            return self.pdl
        return 3 if tensor_parallel == 1 and capability >= (9, 0) else 0

    # The decode round as one CUDA graph. None: on for CUDA, off on the CPU (asking for it on the
    # CPU falls back to eager rounds and records why).
    cuda_graph: bool | None = None
    fused: bool = True  # CUDA: Triton kernels around the matmuls (off: plain torch ops)
    # CUDA, with fused: decode rounds' matmuls in Triton (engine/cuda/skinny.py) on the shapes
    # where they measured faster than cuBLAS: qwen3-8b's round 4.91 -> 4.59 ms on the H200.
    skinny: bool = True
    # CPU: matmuls on weights prepacked once (oneDNN bf16 / MKL fp32) and the decode round's
    # attention batched by span (engine/cpu/packed.py); off: plain torch ops, one SDPA a row.
    cpu_fast: bool = True
    # CPU, with cpu_fast: the decode round in C++ (engine/cpu/round.py), the same bits. None: built
    # in the background, taken once loaded; True: built (or loaded) before the first round; False: never.
    cpu_cpp: bool | None = None
    # CPU, float32 compute without bf16 arithmetic (AVX2): the matrices' weights rounded to bf16
    # once and the decode round's products over them widened in C (engine/cpu/wide.c): half the
    # bytes a round. None: where engine.cpu.wide.wide_fits says so; False: float32 weights, MKL.
    cpu_wide: bool | None = None
    # CUDA, with fused: prompt cuts of <= SHORT_ROWS rows through row-invariant matmuls, alone or
    # several in one forward (ModelRunner.prefill_many), so the lane host fills short prompts that
    # wait together in one forward with each prompt's bits equal to its bits alone. Eight
    # 200-token prompts at qwen3-8b on the H200: median first token 75 -> 35 ms.
    batch_cuts: bool = True
    # with batch_cuts: cuBLAS at the row counts a start-up check found bitwise row-invariant
    # (engine/cuda/batch.py adopt_buckets); the Triton tiles (1.5-2x cuBLAS's time) where it found none
    batch_cublas: bool = True
    # CUDA decode graph (Hopper): programmatic dependent launch for the round's kernels (0 off, 1 wait
    # only, 2 wait then launch the next kernel at once, 3 the small kernels launch the next first;
    # engine/cuda/launch.py LaunchMode). None: 3 at one rank on Hopper, else 0. With the ring, 3 took qwen3-8b's
    # round from 4.58 to 4.34 ms; alone, qwen3-32b's from 16.78 to 16.65 (H200).
    pdl: int | None = None
    # CUDA decode graph on Hopper with triton 3.6's Gluon, rounds of <= 8 rows: the products of the
    # shapes in engine/cuda/ring.py SHAPES go through a warp-specialized TMA ring, the same bits as
    # engine/cuda/skinny.py's; with pdl, each product's weights stream before it waits.
    ring: bool = True
    # Decode rounds launched one ahead (engine/runner/ahead.py): where the lane host expects the next
    # round to feed this one's greedy ids, it runs while the host reads them. None: on with the
    # CUDA decode graph at one rank; True on the CPU runs the same logic eagerly (tests).
    overlap: bool | None = None
    # Decode rounds of a few streams at fewer rows (engine/runner/decode_graph.py buckets): graphs at 1, 2, 4, ...
    # rows beside the padded shape, where every product takes the same kernel and tiles as at the padded
    # shape (so a row's bits are the same), as vLLM captures several batch sizes. None: on with the CUDA
    # decode graph at one rank; False: every round at the padded shape; True on the CPU: eager rounds
    # at those row counts (tests).
    row_buckets: bool | None = None
    # CUDA decode graph with PDL: rounds of at most this many rows ask their small kernels' inputs into
    # L2 before the wait (engine/cuda/prefetch.py); 0: never. One row gains, eight lose (H200).
    prefetch_rows: int = 1
    # CUDA decode graph at one rank: the split attention's combine done by each (row, KV head)'s
    # last split program instead of a kernel of its own (engine/cuda/decode_attention.py), the same bits:
    # qwen3-8b's round 4.719 -> 4.646 ms, qwen3-32b's 16.89 -> 16.77 ms (H200).
    fold_combine: bool = True
    # CUDA decode graph at one rank: the q/k per-head RMSNorm + RoPE + K/V cache write done by the split
    # attention (engine/cuda/qkfold.py; head_dim 128) instead of a kernel of its own, the same
    # bits: qwen3-8b's round -0.025 ms more (H200).
    fold_qk_norm: bool = True
    # Tensor parallel on CUDA at two ranks: "fused": each decode sum and the add + RMSNorm after it
    # in one kernel (engine/parallel/fused.py; qwen3-32b round 10.54 ms against 11.21 on two H200s),
    # symm for the rest; "symm": a one-shot all-reduce in symmetric memory
    # (engine/parallel/symm.py); "nccl": NCCL's all_reduce. The same bits every way.
    tp_allreduce: str = "fused"  # fused | symm | nccl
    # CUDA, with fused, bf16: every prompt cut's attention through engine/cuda/cut_flash.py (tiles at
    # absolute positions: a row's bits do not depend on where cuts fall, which mixed forwards need)
    # instead of prefill.py's cuDNN halves. Off: it changes every CUDA prompt's bits, and ran a 32k
    # prompt's attention at 0.80x the halves' rate in 1,024-row cuts (faster in cuts of <= 512 rows).
    cut_tiles: bool = False
    # CUDA mixed forwards: at cut capacities up to 256 rows, also check 64-row query tiles for the cut
    # attention (engine/runner/mixed_graph.py TILES: twice the programs where a 128-row tile a head
    # fills the SMs in uneven waves) and run them where they keep every bit and time faster at start-up.
    mixed_low_tiles: bool = False
    toolchain: Toolchain = field(default_factory=Toolchain)  # how the CPU's C and C++ kernels are built


@dataclass
class EngineConfig:
    """Everything `tfengine serve` is told, minus where to listen."""

    model: str = "tiny"  # preset name or a local Hugging Face layout directory
    load_format: str = "dummy"  # dummy | safetensors
    device: str = "cpu"
    dtype: str = "float32"  # float32 | bfloat16
    parallel: int = 4
    tensor_parallel: int = 1  # ranks the model is split over (engine/parallel/group.py), one process each
    max_model_len: int = 4096
    prefill_rows: int = 256
    prefill_mode: str = "stepped"  # stepped | whole | mixed | split
    prefill_share: float = 1.0
    # mixed: the time a forward carrying a long prompt's cut and the decode rows should take
    # (engine/scheduler/forward_cost.py sizes the cut to it)
    mixed_budget_ms: float = 50.0
    # split (CUDA): the SMs the decode rounds keep while a long prompt's cut runs on the others
    # (engine/cuda/partitions.py); a multiple of 8
    decode_sms: int = 32
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
        if self.prefill_mode not in ("stepped", "whole", "mixed", "split"):
            raise ConfigError(f"--prefill-mode must be stepped, whole, mixed or split, not {self.prefill_mode!r}")
        if self.decode_sms < 8 or self.decode_sms % 8:
            raise ConfigError(f"--decode-sms must be a positive multiple of 8, not {self.decode_sms!r}")
        if not (math.isfinite(self.mixed_budget_ms) and self.mixed_budget_ms > 0):
            raise ConfigError(f"--mixed-budget must be a positive number of milliseconds, not {self.mixed_budget_ms!r}")
        if self.parallel < 1:
            raise ConfigError("--parallel must be at least 1")
        if self.tensor_parallel < 1:
            raise ConfigError(f"--tensor-parallel must be at least 1, not {self.tensor_parallel}")
        if self.max_model_len < 2:
            raise ConfigError("--max-model-len must be at least 2")
        if self.prefill_rows < 1:
            raise ConfigError("--prefill-rows must be at least 1")
        if self.trace_len < 1:
            raise ConfigError("--trace-len must be at least 1")
