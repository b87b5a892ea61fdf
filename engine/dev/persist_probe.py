"""Issue 14, run 23 (engine/dev/PERF.md): can a persistent decode kernel pay? A device probe, not
engine code. qwen3-8b's decode products at 8 padded rows (random bf16 weights, 36 layers of q/k/v,
o, gated gate/up, down; each product's output feeds the next, o reading q/k/v's first 4,096
columns; no norms or attention), each variant one CUDA graph:
  (a) today's chain: kernels_skinny.skinny / gate_up_silu at the shipped configs, 144 launches;
  (b) one persistent kernel: grid = the SMs, each program walking its tiles of each product in
      turn (the same BLOCK_N / BLOCK_K / stages as (a), so the same bits), a grid-wide barrier
      (atomic counter + spin) after every product: 144;
  (c) (b) without the barriers: the same loads and dots, dependencies ignored (streaming ceiling);
  (d) (b) where each program asks L2 for its first tile of the next product before it spins;
  (e) run 24, persist_hold: (b) with the first 1 / 2 / 4 K steps of the next tile's weights loaded
      into registers between arrival and spin; (f) the same selected into one pipelined loop.
Reports ms, % of the products' weights roofline at the copy rate measured here, the barrier
cost ((b) - (c)) / 144, bits of (b) and (d) against (a), the full decode round (round4_call1's replay).

    PYTHONPATH=. python3 -m engine.dev.persist_probe --out $OUT [--reps 5] [--no-round]
    PYTHONPATH=. python3 -m engine.dev.persist_probe --out /tmp/pp --compile-check   # CPU: sm_90 PTX, shared memory
    TRITON_INTERPRET=1 PYTHONPATH=. python3 -m engine.dev.persist_probe --out /tmp/pp --dry-run   # CPU, tiny
"""
from __future__ import annotations

import json
import os
import statistics
import sys
import time

import torch
import triton
import triton.language as tl

import engine.dev.round2 as R2
import engine.dev.persist_hold as PH
import engine.kernels_skinny as S
from engine.kernels import INTERPRET

RES, say, save, guard = R2.RES, R2.say, R2.save, R2._guard  # results go to $OUT/round2.json
_PF_ASM = tl.constexpr("prefetch.global.L2 [$1]; mov.u32 $0, 0;")


@triton.jit
def _tile(X, sx, W, Y, sy, t, M, N: tl.constexpr, K: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr,
          BK: tl.constexpr, ST: tl.constexpr, KIND: tl.constexpr):
    """One output tile [BM, BN] of a product, the K loop of kernels_skinny's kernels in the same
    BLOCK_K order. KIND 0: x @ W^T; 1: gated (W = [Wg; Wu], N = I, silu(g) * u rounded as
    _gated_kernel does); 2: K in two fixed ranges (split_k 2), each its own float32 sum, added in
    range order 0 + 1 as _skinny_kernel's last program does."""
    rm = tl.arange(0, BM)
    rn = t * BN + tl.arange(0, BN)
    rk = tl.arange(0, BK)
    xm = rm[:, None] < M
    KR: tl.constexpr = K // 2 if KIND == 2 else K
    WOFF: tl.constexpr = N * K if KIND == 1 else KR  # the second operand's rows (up) or range
    xp = X + rm[:, None] * sx + rk[None, :]
    wp = W + rn[:, None].to(tl.int64) * K + rk[None, :]
    a0 = tl.zeros((BM, BN), dtype=tl.float32)
    a1 = tl.zeros((BM, BN), dtype=tl.float32)
    for i in tl.range(0, KR // BK, num_stages=ST):
        x = tl.load(xp + i * BK, mask=xm, other=0.0, cache_modifier=".cg")  # past L1: written by other SMs
        a0 = tl.dot(x, tl.trans(tl.load(wp + i * BK)), a0)
        if KIND == 1:
            a1 = tl.dot(x, tl.trans(tl.load(wp + WOFF + i * BK)), a1)
        if KIND == 2:
            x1 = tl.load(xp + KR + i * BK, mask=xm, other=0.0, cache_modifier=".cg")
            a1 = tl.dot(x1, tl.trans(tl.load(wp + WOFF + i * BK)), a1)
    PH._epilogue(Y, sy, rm, rn, xm, a0, a1, KIND)


@triton.jit
def _prefetch(W, t, T, N: tl.constexpr, K: tl.constexpr, BN: tl.constexpr, KIND: tl.constexpr,
              LINES: tl.constexpr, LINE: tl.constexpr = 64):
    """Ask L2 for the first LINES 128-byte lines of each weight row of tile t (both halves / ranges)."""
    if LINES > 0:
        if t < T:
            rows = W + (t * BN + tl.arange(0, BN))[:, None].to(tl.int64) * K
            p = rows + tl.arange(0, LINES)[None, :] * LINE  # LINE bf16 elements: 128 bytes
            tl.inline_asm_elementwise(_PF_ASM, "=r,l", [p], dtype=tl.int32, is_pure=False, pack=1)
            if KIND != 0:
                q = p + (N * K if KIND == 1 else K // 2)
                tl.inline_asm_elementwise(_PF_ASM, "=r,l", [q], dtype=tl.int32, is_pure=False, pack=1)


@triton.jit
def _sync(Bar, Err, b, G, pid, ON: tl.constexpr):
    """Grid-wide barrier b (persist_hold's arrival and spin, nothing between them)."""
    if ON:
        PH._wait(Bar, Err, b, PH._arrive(Bar, b), G, pid)


@triton.jit
def _persist_kernel(D, Q, O, H, WQ, WO, WG, WD, Bar, Err, M, G, L: tl.constexpr, HID: tl.constexpr,
                    NQ: tl.constexpr, I: tl.constexpr, BM: tl.constexpr,
                    BNQ: tl.constexpr, BKQ: tl.constexpr, STQ: tl.constexpr,
                    BNO: tl.constexpr, BKO: tl.constexpr, STO: tl.constexpr,
                    BNG: tl.constexpr, BKG: tl.constexpr, STG: tl.constexpr,
                    BND: tl.constexpr, BKD: tl.constexpr, STD: tl.constexpr,
                    BARRIER: tl.constexpr, PF: tl.constexpr):
    """Layer l: Q[l] = D[l] WQ[l]^T; O[l] = Q[l][:, :HID] WO[l]^T; H[l] = gated(O[l], WG[l]);
    D[l + 1] = H[l] WD[l]^T (K in two ranges); a barrier after each product."""
    pid = tl.program_id(0)
    TQ: tl.constexpr = NQ // BNQ
    TO: tl.constexpr = HID // BNO
    TG: tl.constexpr = I // BNG
    TD: tl.constexpr = HID // BND
    for l in range(L):
        l64 = tl.cast(l, tl.int64)
        for t in range(pid, TQ, G):
            _tile(D + l * M * HID, HID, WQ + l64 * NQ * HID, Q + l * M * NQ, NQ, t, M, NQ, HID,
                  BM, BNQ, BKQ, STQ, 0)
        _prefetch(WO + l64 * HID * HID, pid, TO, HID, HID, BNO, 0, PF)
        _sync(Bar, Err, 4 * l, G, pid, BARRIER)
        for t in range(pid, TO, G):
            _tile(Q + l * M * NQ, NQ, WO + l64 * HID * HID, O + l * M * HID, HID, t, M, HID, HID,
                  BM, BNO, BKO, STO, 0)
        _prefetch(WG + l64 * 2 * I * HID, pid, TG, I, HID, BNG, 1, PF)
        _sync(Bar, Err, 4 * l + 1, G, pid, BARRIER)
        for t in range(pid, TG, G):
            _tile(O + l * M * HID, HID, WG + l64 * 2 * I * HID, H + l * M * I, I, t, M, I, HID,
                  BM, BNG, BKG, STG, 1)
        _prefetch(WD + l64 * HID * I, pid, TD, HID, I, BND, 2, PF)
        _sync(Bar, Err, 4 * l + 2, G, pid, BARRIER)
        for t in range(pid, TD, G):
            _tile(H + l * M * I, I, WD + l64 * HID * I, D + (l + 1) * M * HID, HID, t, M, HID, I,
                  BM, BND, BKD, STD, 2)
        if l + 1 < L:
            _prefetch(WQ + (l64 + 1) * NQ * HID, pid, TQ, NQ, HID, BNQ, 0, PF)
        _sync(Bar, Err, 4 * l + 3, G, pid, BARRIER)
    if BARRIER:
        PH._exit(Bar, 4 * L, G)


class Chain:
    """The layers' weights [L, N, K] (std 1/sqrt(K), down scaled up so magnitudes hold over the
    layers) and the activations: D [L + 1, M, HID] (D[0] the input), Q, O, H per layer."""

    def __init__(self, dev, dt, L, HID, NQ, I, M, cfg: dict):
        g = torch.Generator(device=dev).manual_seed(23)
        w = lambda n, k, s=1.0: torch.empty(L, n, k, dtype=dt, device=dev).normal_(0, s * k ** -0.5, generator=g)  # noqa: E731
        self.WQ, self.WO, self.WG, self.WD = w(NQ, HID), w(HID, HID), w(2 * I, HID), w(HID, I, 1.7)
        self.D = torch.empty(L + 1, M, HID, dtype=dt, device=dev)
        self.D[0] = torch.randn(M, HID, generator=g, device=dev).to(dt)
        self.Q, self.O, self.H = (torch.empty(L, M, n, dtype=dt, device=dev) for n in (NQ, HID, I))
        self.bar = torch.zeros(4 * L + 1, dtype=torch.int32, device=dev)
        self.err = torch.zeros(1, dtype=torch.int32, device=dev)
        self.L, self.HID, self.NQ, self.I, self.M, self.cfg = L, HID, NQ, I, M, cfg
        self.bytes = sum(t.numel() * t.element_size() for t in (self.WQ, self.WO, self.WG, self.WD))
        self.calibrate()

    def run_a(self) -> list:
        """(a): the products as the round runs them today, one launch each."""
        c, x, outs = self.cfg, self.D[0], []
        for l in range(self.L):
            q = S.skinny(x, self.WQ[l], config=c["q"])
            o = S.skinny(q[:, :self.HID], self.WO[l], config=c["o"])
            h = S.gate_up_silu(o, self.WG[l], config=c["g"])
            x = S.skinny(h, self.WD[l], config=c["d"])
            outs += [q, o, h, x]
        return outs

    def consts(self, barrier: bool, pf: int) -> dict:
        c, out = self.cfg, {}
        for p in "qogd":
            out.update({f"BN{p.upper()}": c[p].block_n, f"BK{p.upper()}": c[p].block_k, f"ST{p.upper()}": c[p].num_stages})
        return dict(L=self.L, HID=self.HID, NQ=self.NQ, I=self.I, BM=S.block_m(self.M), BARRIER=barrier, PF=pf, **out)

    def run_p(self, grid: int, barrier: bool, pf: int = 0, hold: int = 0):
        """(b) / (c) / (d): the persistent kernel, `grid` programs; (e): persist_hold's."""
        if hold:
            return PH.run_hold(self, grid, abs(hold), hold < 0)
        return _persist_kernel[(grid,)](self.D, self.Q, self.O, self.H, self.WQ, self.WO, self.WG, self.WD,
                                        self.bar, self.err, self.M, grid, **self.consts(barrier, pf),
                                        num_warps=4, num_stages=4)

    def poison(self):
        for t in (self.Q, self.O, self.H, self.D[1:]):
            t.fill_(float("nan"))

    def calibrate(self):
        """Rescale each layer's down matrix so its output's RMS is 1: the gated product squares
        magnitudes, so an unscaled chain overflows to inf / NaN within the 36 layers (run 23's first call)."""
        x = self.D[0]
        for l in range(self.L):
            o = S.skinny(S.skinny(x, self.WQ[l], config=self.cfg["q"])[:, :self.HID], self.WO[l], config=self.cfg["o"])
            h = S.gate_up_silu(o, self.WG[l], config=self.cfg["g"])
            self.WD[l] /= S.skinny(h, self.WD[l], config=self.cfg["d"]).float().pow(2).mean().sqrt().to(self.WD.dtype)
            x = S.skinny(h, self.WD[l], config=self.cfg["d"])

    def bits(self, outs: list) -> dict:
        """This chain's buffers against (a)'s outputs: elements differing (NaN != NaN: poison left
        unwritten counts), the first layer with any, and whether (a)'s outputs are all finite."""
        mine = [t[l] for l in range(self.L) for t in (self.Q, self.O, self.H, self.D[1:])]
        diff, first = {n: 0 for n in ("q/k/v", "o", "gated", "down")}, None
        for i, (a, b) in enumerate(zip(outs, mine)):
            n = int((a != b).sum())
            diff[list(diff)[i % 4]] += n
            first = i // 4 if first is None and n else first
        return {"differing": diff, "of": sum(t.numel() for t in mine), "equal": not any(diff.values()),
                "first layer differing": first, "(a) all finite": all(bool(t.isfinite().all()) for t in outs),
                "(a) last rms": float(outs[-1].float().pow(2).mean().sqrt()), "barrier timeouts": int(self.err.item())}


def configs(HID, NQ, I, M) -> dict:
    """The shipped configs of the four products at M rows (kernels_skinny CONFIGS / GATED)."""
    cfg = {"q": S.config_for(NQ, HID, M), "o": S.config_for(HID, HID, M),
           "g": S.GATED[(2 * I, HID, S.block_m(M))], "d": S.config_for(HID, I, M)}
    assert [c.split_k for c in cfg.values()] == [1, 1, 1, 2] and {c.num_warps for c in cfg.values()} == {4}, cfg
    return cfg


def capture(fn):
    """A CUDA graph of fn() (round4_call1.chain_graph: run once on a side stream, then captured) and
    the captured call's result."""
    import engine.dev.round4_call1 as C1
    box = {}
    return C1.chain_graph(lambda _: box.update(out=fn()), 1), box["out"]


VARIANTS = {  # name -> (barriers, lines of the next tile's weight rows asked of L2 before the spin,
    # K steps of the next tile's weights held in registers across the spin: persist_hold's kernel)
    "(b) persistent, barriers": (True, 0, 0),
    "(c) persistent, no barriers": (False, 0, 0),
    "(d) barriers + next tile 1 KiB a row to L2": (True, 8, 0),
    "(e) barriers + next tile's first K step held": (True, 0, 1),
    "(e) barriers + next tile's first 2 K steps held": (True, 0, 2),
    "(e) barriers + next tile's first 4 K steps held": (True, 0, 4),
    "(f) (e) 1 step, selected in the pipelined loop": (True, 0, -1),  # hold < 0: persist_hold SEL
    "(f) (e) 2 steps, selected in the pipelined loop": (True, 0, -2),
}


def _meta(k) -> dict:
    try:
        return {"regs": k.n_regs, "spills": k.n_spills, "shared": k.metadata.shared}
    except Exception as e:  # the interpreter returns no compiled kernel
        return {"meta": repr(e)[:80]}


def _zero(bar) -> bool:  # noqa: E704
    return int(bar.abs().sum().item()) == 0


def sec_probe(ch: Chain, grid: int, dry: bool, reps: int = 5):
    """Bits of each persistent form against (a) (eager, then after two graph replays), then the
    graphs timed interleaved."""
    out = RES.setdefault("probe", {})
    sync = (lambda: None) if dry else torch.cuda.synchronize
    if dry:
        outs, graphs = ch.run_a(), {}
    else:
        ga, outs = capture(ch.run_a)
        ga.replay()
        graphs = {"(a) today's chain, 144 launches": ga}
    for name, (bar, pf, hold) in VARIANTS.items():
        if dry and pf:
            continue  # the interpreter has no inline asm
        g = 1 if dry and bar else grid  # the interpreter runs programs one after another
        ch.poison()
        try:
            k = ch.run_p(g, bar, pf, hold)
            sync()
        except Exception as e:  # a variant that does not compile here loses only itself
            out[name] = {"error": repr(e)[-1500:]}
            say(name, out[name]["error"])
            continue
        res = {"grid": g, "kernel": _meta(k), "eager": ch.bits(outs), "counters zero after eager": _zero(ch.bar)}
        if not dry and not res["eager"]["barrier timeouts"]:
            graphs[name] = capture(lambda: ch.run_p(g, bar, pf, hold))[0]
            ch.poison()
            graphs[name].replay(), graphs[name].replay()
            sync()
            res["2 replays"] = ch.bits(outs)
            res["counters zero after"] = _zero(ch.bar)
        ch.err.zero_(), ch.bar.zero_()
        out[name] = res
        say(name, json.dumps(res))
        save()
    if dry:
        return
    import engine.dev.round4_call1 as C1
    ts = {n: [] for n in graphs}
    for _ in range(reps):  # interleaved, so drift hits every variant alike
        for n, g in graphs.items():
            ts[n].append(C1.graph_us(g, reps=20) / 1e3)
    roof = ch.bytes / RES["ceilings"]["copy_bandwidth_Bps"] * 1e3
    RES["products roof ms"] = roof
    for n, t in ts.items():
        ms = statistics.median(t)
        out.setdefault(n, {}).update({"ms": ms, "of roofline": roof / ms, "all": t})
        say(f"{n:48s} {ms:.3f} ms  {roof / ms:6.1%} of {roof:.3f} ms (spread {min(t):.3f}-{max(t):.3f})")
    c = out[list(VARIANTS)[1]].get("ms")
    for n in (n for n in ts if c and n != list(VARIANTS)[1]):  # (x - c) / 144: a boundary's cost
        out[n]["boundary us (x - c) / 144"] = (out[n]["ms"] - c) / (4 * ch.L) * 1e3
        say(f"{n:48s} boundary {out[n]['boundary us (x - c) / 144']:.2f} us")


def sec_round(dev, dt, model):
    """The full decode round today (replay timer of round4_call1, ctx 128) for reference."""
    import engine.dev.round4_call1 as C1
    from engine.config import EngineConfig
    from engine.dev.bench import weight_bytes
    from engine.runner import ModelRunner
    r = ModelRunner(EngineConfig(model=model, device=dev, dtype=dt, parallel=8, max_model_len=1024, prefill_rows=1024))
    bw, out = RES["ceilings"]["copy_bandwidth_Bps"], RES.setdefault("round", {})
    out["weights roof ms"] = weight_bytes(r) / bw * 1e3
    for k in (1, 8):
        ts, roof = C1.replay_ms(r, k, chunks=6), (weight_bytes(r) + k * 129 * r.kv.row_bytes()) / bw * 1e3
        ms = statistics.median(ts)
        out[f"{k} streams"] = {"replay_ms": ms, "roof_ms": roof, "ratio": roof / ms, "all": ts}
        say(f"full round {k} streams: replay {ms:.3f} ms, {roof / ms:6.1%} of {roof:.3f} ms")


def compile_check():
    """The CPU, no interpreter: each variant compiled for sm_90 at the device shapes; its shared
    memory (over half the SM's 228 KiB: one program a SM) and the PTX's barrier atomics, L2
    prefetches, async copies (the K loops pipelined) and MMA instructions (m16n8k16, as the skinny kernels')."""
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource
    ch = Chain.__new__(Chain)
    ch.L, ch.HID, ch.NQ, ch.I, ch.M = 36, 4096, 6144, 12288, 8
    ch.cfg, aligned = configs(ch.HID, ch.NQ, ch.I, ch.M), {(i,): [["tt.divisibility", 16]] for i in range(10)}
    sig = {**{n: "*bf16" for n in ("D", "Q", "O", "H", "WQ", "WO", "WG", "WD")}, "Bar": "*i32", "Err": "*i32",
           "M": "i32", "G": "i32"}
    keys = ("atom.global.gpu.release", "ld.global.gpu.acquire", "prefetch.global.L2", "mma.sync", "wgmma", "cp.async.cg")
    for name, (bar, pf, hold) in VARIANTS.items():
        fn, cs = (PH._hold_kernel, {**ch.consts(bar, pf), "HOLD": abs(hold), "SEL": hold < 0}) if hold else (_persist_kernel, ch.consts(bar, pf))
        if hold:
            cs.pop("BARRIER"), cs.pop("PF")
        k = triton.compile(ASTSource(fn=fn, signature=sig, constexprs=cs, attrs=aligned),
                           target=GPUTarget("cuda", 90, 32), options={"num_warps": 4, "num_stages": 4})
        RES[name] = {"shared": k.metadata.shared, **{key: k.asm["ptx"].count(key) for key in keys}, **PH.asm_report(k)}
        say(name, json.dumps(RES[name]))
    save()


def main(argv):
    R2.OUT = argv[argv.index("--out") + 1] if "--out" in argv else "/tmp/persist"
    os.makedirs(R2.OUT, exist_ok=True)
    if "--compile-check" in argv:
        return compile_check()
    dry = "--dry-run" in argv  # the CPU, the interpreter, tiny shapes, untimed
    t0 = time.perf_counter()
    RES["triton"], RES["torch"] = triton.__version__, torch.__version__
    if dry:
        assert INTERPRET, "--dry-run runs under TRITON_INTERPRET=1"
        import engine.dev.round5_call1 as R51
        torch.cuda.Event = R51._CpuEvent  # the round's replay timer on the host clock
        dev, dt, shape, grid = "cpu", torch.float32, (3, 64, 96, 128, 8), 3  # 4 K steps each: (e) holds up to 4
        cfg = {"q": S.SkinnyConfig(32, 16, 4, 2), "o": S.SkinnyConfig(16, 16, 4, 2), "g": S.SkinnyConfig(16, 16, 4, 2),
               "d": S.SkinnyConfig(16, 16, 4, 2, 2)}
        RES["ceilings"] = {"copy_bandwidth_Bps": 1e11}
    else:
        from engine.dev.bench import copy_bandwidth
        dev, dt, shape = "cuda", torch.bfloat16, (36, 4096, 6144, 12288, 8)
        grid = torch.cuda.get_device_properties(0).multi_processor_count
        cfg = configs(*shape[1:])
        RES["device"], RES["SMs"] = torch.cuda.get_device_name(0), grid
        RES["ceilings"] = {"copy_bandwidth_Bps": copy_bandwidth("cuda")}
    RES["configs"] = {k: str(v) for k, v in cfg.items()}
    say(json.dumps(RES))
    ch = Chain(dev, dt, *shape, cfg)
    reps = int(argv[argv.index("--reps") + 1]) if "--reps" in argv else 5
    guard("probe", lambda: sec_probe(ch, grid, dry, reps))
    ch = None
    if not dry:
        torch.cuda.empty_cache()
        RES["copy_bandwidth_Bps after"] = copy_bandwidth("cuda")
    if "--no-round" not in argv:  # the full round for reference (run 23's first call has it)
        guard("round", lambda: sec_round(dev, "float32" if dry else "bfloat16", "tiny" if dry else "qwen3-8b"))
    RES["total_s"] = time.perf_counter() - t0
    save()
    say("done", RES["total_s"])


if __name__ == "__main__":
    main(sys.argv[1:])
