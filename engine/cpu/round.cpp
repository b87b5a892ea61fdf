// The CPU decode round (engine/cpu/round.py builds and loads this): the same ATen calls, on the
// same shapes and layouts and in the same order, as the Python round (Qwen3ForCausalLM.decode_cpu
// with engine.cpu.packed.decode_attention_buckets), so the same kernels run and every bit of the
// logits is the same; only the ~700 Python-side calls a round go, and the GIL is released for the
// whole round, so the HTTP thread runs beside it. Mirror any change to those two functions here
// (tests/engine/test_cpu_round.py compares the two paths bit for bit).
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <torch/library.h>

#include <algorithm>
#include <cstring>
#include <limits>
#include <map>

namespace {

constexpr int64_t ROW_TILE = 8;  // engine.cpu.packed.ROW_TILE
enum Kind : int64_t { ONEDNN = 0, MKL = 1, PLAIN = 2, WIDE = 3 };
// engine/cpu/wide.c's tfe_wide_linear: float32 rows times bf16 weights, only the listed rows
using WideFn = int (*)(const float*, int64_t, const int64_t*, int64_t, const uint16_t*, int64_t, int64_t, float*,
                       int64_t, int64_t, int64_t);
struct Wide {
  WideFn fn;  // null unless the kind is WIDE
  const int64_t* rows;  // the round's live rows (not the spare lane's)
  int64_t n;
};
// engine/cpu/decode_attention.c's tfe_decode_attention
using AttnFn = int (*)(const void*, const void*, int64_t, int64_t, const void*, int64_t, int64_t, void*, const int64_t*,
                       const int64_t*, int64_t, int64_t, int64_t, int64_t, int64_t, float, int32_t);
// engine/cpu/elem.c's tfe_norm_rows and tfe_heads: the norms (with the residual add before one) and
// the q/k heads' norm and rotation, with ATen's bits
using NormFn = int (*)(const void*, const void*, void*, const float*, const void*, void*, int64_t, int64_t, float,
                       int32_t, int32_t);
using HeadsFn = int (*)(const void*, int64_t, const float*, const void*, const void*, const void*, void*, int64_t,
                        int64_t, int64_t, float, int32_t, int32_t);
// and tfe_greedy: each row's argmax, ATen's index
using GreedyFn = int (*)(const void*, int64_t, int64_t, const int64_t*, int64_t, int32_t, int64_t*);
struct Elem {
  NormFn norm;  // null: the ATen ops below
  HeadsFn heads;
  int32_t vw;  // the mean of squares in C at this width (AttentionKernel.sum_width), 0: ATen's means
  GreedyFn greedy;
};


at::Tensor boxed(const c10::OperatorHandle& op, std::vector<c10::IValue> stack) {
  op.callBoxed(&stack);
  return stack[0].toTensor();
}

// PackedLinears.mm for a tile of ROW_TILE rows
at::Tensor mm(const at::Tensor& x, const at::Tensor& packed, const at::Tensor& plain, int64_t kind) {
  static const auto onednn = c10::Dispatcher::singleton().findSchemaOrThrow("mkldnn::_linear_pointwise", "");
  static const auto mkl = c10::Dispatcher::singleton().findSchemaOrThrow("mkl::_mkl_linear", "");
  if (kind == ONEDNN)
    return boxed(onednn, {x, packed, c10::IValue(), std::string("none"),
                          c10::impl::GenericList(c10::OptionalType::create(c10::NumberType::get())), std::string("")});
  if (kind == MKL) return boxed(mkl, {x, packed, plain, c10::IValue(), ROW_TILE});
  return at::linear(x, plain);
}

// PackedLinears.mm_tiled through WideKernel: the live rows, the others zero; columns split over the
// compute threads (a column's bits do not depend on which thread or block takes it)
at::Tensor mm_wide(at::Tensor x, const at::Tensor& w, const Wide& wd) {
  if (x.stride(1) != 1) x = x.contiguous();
  int64_t n = w.size(0), k = w.size(1);
  auto y = at::zeros({x.size(0), n}, x.options());
  const float* xp = x.data_ptr<float>();
  float* yp = y.data_ptr<float>();
  const auto* wp = reinterpret_cast<const uint16_t*>(w.data_ptr());
  int64_t ldx = x.stride(0);
  at::parallel_for(0, n, 256, [&](int64_t b, int64_t e) {
    TORCH_CHECK(wd.fn(xp, ldx, wd.rows, wd.n, wp, n, k, yp, n, b, e) == 0, "the wide product refused a shape");
  });
  return y;
}

// PackedLinears.mm_tiled
at::Tensor mm_tiled(const at::Tensor& x, const at::Tensor& packed, const at::Tensor& plain, int64_t kind,
                    const Wide& wd) {
  if (kind == WIDE) return mm_wide(x, packed, wd);
  int64_t rows = x.size(0);
  if (rows == ROW_TILE) return mm(x, packed, plain, kind);
  std::vector<at::Tensor> parts;
  for (int64_t r = 0; r < rows; r += ROW_TILE) parts.push_back(mm(x.slice(0, r, r + ROW_TILE), packed, plain, kind));
  return at::cat(parts);
}

bool elem_ok(const Elem& e, const at::Tensor& x, const at::Tensor& w) {
  auto t = x.scalar_type();
  return e.norm && (t == at::kBFloat16 || t == at::kFloat) && w.scalar_type() == t && x.is_contiguous() &&
         w.is_contiguous();
}

// engine.models.qwen3.RMSNorm.forward (float32 inside, as HF's): with `e`, one pass of tfe_norm_rows
// (its mean too where e.vw is set: 9 ATen calls less, else 5), the same bits
at::Tensor rms_norm(const at::Tensor& x, const at::Tensor& w, double eps, const Elem& e) {
  int64_t n = x.size(-1);
  bool bf16 = x.scalar_type() == at::kBFloat16, ok = elem_ok(e, x, w);
  auto out = ok ? at::empty(x.sizes(), x.options()) : at::Tensor();
  if (ok && e.vw &&
      e.norm(x.data_ptr(), nullptr, nullptr, nullptr, w.data_ptr(), out.data_ptr(), x.numel() / n, n, eps, bf16, e.vw) == 0)
    return out;
  auto f = x.to(at::kFloat);
  auto ms = f.pow(2).mean({-1}, true);
  if (ok && e.norm(x.data_ptr(), nullptr, nullptr, ms.data_ptr<float>(), w.data_ptr(), out.data_ptr(), x.numel() / n, n,
                   eps, bf16, 0) == 0)
    return out;
  return w.mul(f.mul(at::rsqrt(ms.add(eps))).to(x.scalar_type()));
}

// x + y (the residual add), then its RMSNorm: (sum, normed); one pass where e.vw is set
std::pair<at::Tensor, at::Tensor> add_norm(const at::Tensor& x, const at::Tensor& y, const at::Tensor& w, double eps,
                                           const Elem& e) {
  if (e.vw && elem_ok(e, x, w) && y.scalar_type() == x.scalar_type() && y.is_contiguous() && y.sizes() == x.sizes()) {
    auto sum = at::empty(x.sizes(), x.options()), out = at::empty(x.sizes(), x.options());
    int64_t n = x.size(-1);
    if (e.norm(x.data_ptr(), y.data_ptr(), sum.data_ptr(), nullptr, w.data_ptr(), out.data_ptr(), x.numel() / n, n, eps,
               x.scalar_type() == at::kBFloat16, e.vw) == 0)
      return {sum, out};
  }
  auto sum = x.add(y);
  return {sum, rms_norm(sum, w, eps, e)};
}

// engine.models.qwen3.rotate
at::Tensor rotate(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin) {
  int64_t half = x.size(-1) / 2;
  auto rot = at::cat({x.slice(-1, half).neg(), x.slice(-1, 0, half)}, -1);
  return x.mul(cos.unsqueeze(1)).add(rot.mul(sin.unsqueeze(1)));
}

struct Shape {
  int64_t h, kvh, d;
  double eps;
};

// The round's rows for the C attention (fn null: the batched matmuls below)
struct Rows {
  AttnFn fn;
  const int64_t *lanes, *positions;
  int64_t spare;
};

// engine.cpu.decode_attention.AttentionKernel.__call__ on one layer's caches
at::Tensor attention_c(const at::Tensor& kc, const at::Tensor& vc, at::Tensor q, const Rows& r, const Shape& s) {
  if (q.stride(2) != 1) q = q.contiguous();
  auto out = at::empty({q.size(0), s.h * s.d}, q.options());
  int rc = r.fn(kc.data_ptr(), vc.data_ptr(), kc.stride(0), kc.stride(1), q.data_ptr(), q.stride(0), q.stride(1),
                out.data_ptr(), r.lanes, r.positions, q.size(0), r.spare, s.h, s.kvh, s.d,
                static_cast<float>(std::pow(static_cast<double>(s.d), -0.5)), q.scalar_type() == at::kBFloat16);
  TORCH_CHECK(rc == 0, "the C decode attention refused this round");
  return out;
}

// PackedLinears.heads: q [rows, H, d], k and v [rows, KVH, d]. (With `e`: the heads' norm and
// rotation in one pass of tfe_heads, ~14 ATen calls less a layer, 18 with e.vw.)
std::tuple<at::Tensor, at::Tensor, at::Tensor> heads(const at::Tensor& qkv, const at::Tensor& qk_norm,
                                                      const at::Tensor& cos, const at::Tensor& sin, const Shape& s,
                                                      const Elem& e) {
  int64_t rows = qkv.size(0), nh = s.h + s.kvh, qk_cols = nh * s.d;
  auto t = qkv.scalar_type();
  auto qk = qkv.slice(1, 0, qk_cols).reshape({rows, nh, s.d});
  bool c_ok = e.heads && (t == at::kBFloat16 || t == at::kFloat) && qk_norm.scalar_type() == t &&
              cos.scalar_type() == t && sin.scalar_type() == t && qkv.stride(1) == 1;
  at::Tensor f, ms, out;
  auto run = [&](const float* m) {
    auto w = qk_norm.contiguous(), c = cos.contiguous(), sn = sin.contiguous();
    out = at::empty({rows, nh, s.d}, qkv.options());
    return e.heads(qkv.data_ptr(), qkv.stride(0), m, w.data_ptr(), c.data_ptr(), sn.data_ptr(), out.data_ptr(), rows, nh,
                   s.d, static_cast<float>(s.eps), t == at::kBFloat16, m ? 0 : e.vw) == 0;
  };
  bool fast = c_ok && e.vw && run(nullptr);
  if (!fast) {
    f = qk.to(at::kFloat);
    ms = f.pow(2).mean({-1}, true).contiguous();
    fast = c_ok && run(ms.data_ptr<float>());
  }
  qk = fast ? out : rotate(qk_norm.mul(f.mul(at::rsqrt(ms.add(s.eps))).to(t)), cos, sin);
  return {qk.slice(1, 0, s.h), qk.slice(1, s.h), qkv.slice(1, qk_cols).reshape({rows, s.kvh, s.d})};
}

// cache[lanes[r], positions[r]] = x[r] for every row r, in row order (index_put_'s copies; the
// padding rows all write the spare lane's row 0, which no row reads), one memcpy a row
void write_rows(at::Tensor& cache, const at::Tensor& x, const at::Tensor& lanes, const at::Tensor& positions) {
  int64_t rows = x.size(0), n = x.size(1) * x.size(2), es = x.element_size();
  if (!(cache.is_contiguous() && x.scalar_type() == cache.scalar_type() && x.stride(2) == 1 &&
        x.stride(1) == x.size(2) && cache.size(2) * cache.size(3) == n)) {
    cache.index_put_({lanes, positions}, x);
    return;
  }
  auto* dst = static_cast<char*>(cache.data_ptr());
  const auto* src = static_cast<const char*>(x.data_ptr());
  const int64_t *ln = lanes.data_ptr<int64_t>(), *ps = positions.data_ptr<int64_t>();
  for (int64_t r = 0; r < rows; ++r)
    std::memcpy(dst + (ln[r] * cache.stride(0) + ps[r] * cache.stride(1)) * es, src + r * x.stride(0) * es, n * es);
}

// engine.cpu.packed.decode_attention_buckets; plan: 4 tensors a group (q_rows, mask, at,
// rows_out), groups: 3 ints a group (lo, hi, span)
at::Tensor attention(const at::Tensor& kc, const at::Tensor& vc, const at::Tensor& q, const at::Tensor& eye,
                     at::TensorList plan, at::IntArrayRef groups, const Shape& s) {
  int64_t p = q.size(0), rep = s.h / s.kvh;
  auto out = at::zeros({p, s.h * s.d}, q.options());
  for (size_t g = 0; g * 3 < groups.size(); ++g) {
    int64_t lo = groups[3 * g], hi = groups[3 * g + 1], span = groups[3 * g + 2], n = hi - lo;
    const auto &q_rows = plan[4 * g], &mask = plan[4 * g + 1], &at_ = plan[4 * g + 2], &rows_out = plan[4 * g + 3];
    auto k = kc.slice(0, lo, hi).slice(1, 0, span).view({n, span, s.kvh * s.d});
    auto v = vc.slice(0, lo, hi).slice(1, 0, span).view({n, span, s.kvh * s.d});
    auto qg = q.index_select(0, q_rows).view({n, s.kvh, rep, s.d}).transpose(2, 3);
    auto qbd = qg.unsqueeze(3).mul(eye).reshape({n, s.kvh * s.d, s.h});
    auto sc = at::bmm(k, qbd).to(at::kFloat).mul_(std::pow(static_cast<double>(s.d), -0.5)).add_(mask)
                  .softmax(1).to(q.scalar_type());
    auto o = at::bmm(sc.transpose(1, 2), v).view({n, s.kvh, rep, s.kvh, s.d});
    o = at::diagonal(o, 0, 1, 3).permute({0, 3, 1, 2}).reshape({n, s.h * s.d});
    out.index_copy_(0, rows_out, o.index_select(0, at_));
  }
  return out;
}

// engine.cpu.packed.BucketPlan, from the round's rows (lane, position; row r is entry r):
// rows grouped by (span, nth entry of a lane), groups in that order, each split into runs of
// consecutive lanes.
struct Plan {
  std::vector<at::Tensor> tensors;  // q_rows, mask, at, rows_out a run
  std::vector<int64_t> ints;        // first lane, last lane + 1, span a run
};

Plan bucket_plan(at::IntArrayRef lanes, at::IntArrayRef positions, int64_t spare, int64_t max_len, int64_t span_unit) {
  // (span, nth) -> (lane, row, position) of its members
  std::map<std::pair<int64_t, int64_t>, std::vector<std::tuple<int64_t, int64_t, int64_t>>> groups;
  for (size_t r = 0; r < lanes.size(); ++r) {
    int64_t lane = lanes[r], pos = positions[r];
    if (lane == spare) continue;
    int64_t span = std::min(max_len, (pos / span_unit + 1) * span_unit), nth = 0;
    auto has = [&](int64_t n) {
      auto it = groups.find({span, n});
      if (it == groups.end()) return false;
      for (auto& m : it->second)
        if (std::get<0>(m) == lane) return true;
      return false;
    };
    while (has(nth)) ++nth;
    groups[{span, nth}].emplace_back(lane, static_cast<int64_t>(r), pos);
  }
  Plan plan;
  auto i64 = at::TensorOptions().dtype(at::kLong);
  for (auto& [key, members] : groups) {
    int64_t span = key.first;
    std::sort(members.begin(), members.end());
    for (size_t a = 0, b; a < members.size(); a = b) {
      for (b = a + 1; b < members.size() && std::get<0>(members[b]) == std::get<0>(members[b - 1]) + 1; ++b) {}
      int64_t n = b - a;
      std::vector<int64_t> rows, at_;
      auto mask = at::zeros({n, span, 1}, at::kFloat);
      auto* mp = mask.data_ptr<float>();
      for (int64_t l = 0; l < n; ++l) {
        auto [lane, row, pos] = members[a + l];
        rows.push_back(row), at_.push_back(l);
        for (int64_t j = pos + 1; j < span; ++j) mp[l * span + j] = -std::numeric_limits<float>::infinity();
      }
      plan.tensors.insert(plan.tensors.end(), {at::tensor(rows, i64), mask, at::tensor(at_, i64), at::tensor(rows, i64)});
      plan.ints.insert(plan.ints.end(), {std::get<0>(members[a]), std::get<0>(members[b - 1]) + 1, span});
    }
  }
  return plan;
}

// Qwen3ForCausalLM.decode_cpu: the round's logits [rows, vocab]. mats and plain: 4 a layer (qkv,
// o, gate_up, down), then the lm_head; norms: 3 a layer (input, post-attention, q/k block), then
// the final norm.
at::Tensor decode_round(const at::Tensor& tokens, const at::Tensor& positions, const at::Tensor& lanes,
                        const at::Tensor& embed, const at::Tensor& cos_t, const at::Tensor& sin_t,
                        const at::Tensor& kcache, const at::Tensor& vcache, at::TensorList mats,
                        at::TensorList plain, at::TensorList norms, at::TensorList plan, at::IntArrayRef groups,
                        int64_t kind, int64_t n_heads, int64_t kv_heads, int64_t head_dim, double eps,
                        const Rows& c_rows, const Elem& e, const Wide& wd) {
  at::NoGradGuard no_grad;
  Shape s{n_heads, kv_heads, head_dim, eps};
  int64_t layers = kcache.size(0);
  auto cos = cos_t.index_select(0, positions), sin = sin_t.index_select(0, positions);
  auto x = at::embedding(embed, tokens);
  auto h = rms_norm(x, norms[0], eps, e);  // each layer's input norm comes with the residual add before it
  auto eye = at::eye(kv_heads, embed.options()).view({1, kv_heads, 1, kv_heads, 1});
  for (int64_t i = 0; i < layers; ++i) {
    auto w = [&](int j) { return mats[4 * i + j]; };
    auto pw = [&](int j) { return plain[4 * i + j]; };
    auto [q, k, v] = heads(mm_tiled(h, w(0), pw(0), kind, wd), norms[3 * i + 2], cos, sin, s, e);
    auto kl = kcache.select(0, i), vl = vcache.select(0, i);
    write_rows(kl, k, lanes, positions);
    write_rows(vl, v, lanes, positions);
    auto att = c_rows.fn ? attention_c(kl, vl, q, c_rows, s) : attention(kl, vl, q, eye, plan, groups, s);
    std::tie(x, h) = add_norm(x, mm_tiled(att, w(1), pw(1), kind, wd), norms[3 * i + 1], eps, e);
    auto gu = mm_tiled(h, w(2), pw(2), kind, wd).chunk(2, -1);
    std::tie(x, h) = add_norm(x, mm_tiled(at::silu(gu[0]).mul(gu[1]), w(3), pw(3), kind, wd),
                              norms[i + 1 < layers ? 3 * (i + 1) : 3 * layers], eps, e);
  }
  return mm_tiled(h, mats[4 * layers], plain[4 * layers], kind, wd);
}

// ModelRunner.decode's CPU round from plain ints (the padded rows): the plan built here, the
// logits and each row's greedy id (argmax over the logits widened to float32: the same index,
// without bf16's slow argmax), so a round takes one call with the GIL released.
std::tuple<at::Tensor, at::Tensor> decode_rows(at::IntArrayRef tokens, at::IntArrayRef positions, at::IntArrayRef lanes,
                                               int64_t spare, int64_t span_unit, const at::Tensor& embed,
                                               const at::Tensor& cos, const at::Tensor& sin, const at::Tensor& kcache,
                                               const at::Tensor& vcache, at::TensorList mats, at::TensorList plain,
                                               at::TensorList norms, int64_t kind, int64_t n_heads, int64_t kv_heads,
                                               int64_t head_dim, double eps, int64_t attn, int64_t norm,
                                               int64_t heads_fn, int64_t sum_width, int64_t greedy, int64_t wide) {
  auto i64 = at::TensorOptions().dtype(at::kLong);
  Rows c_rows{reinterpret_cast<AttnFn>(attn), lanes.data(), positions.data(), spare};
  auto plan = attn ? Plan{} : bucket_plan(lanes, positions, spare, kcache.size(2), span_unit);
  Elem e{reinterpret_cast<NormFn>(norm), reinterpret_cast<HeadsFn>(heads_fn), static_cast<int32_t>(sum_width),
         reinterpret_cast<GreedyFn>(greedy)};
  std::vector<int64_t> live;
  for (size_t r = 0; r < lanes.size(); ++r)
    if (lanes[r] != spare) live.push_back(static_cast<int64_t>(r));
  Wide wd{reinterpret_cast<WideFn>(wide), live.data(), static_cast<int64_t>(live.size())};
  TORCH_CHECK(kind != WIDE || wd.fn, "the wide kind needs tfe_wide_linear's address");
  auto logits = decode_round(at::tensor(tokens, i64), at::tensor(positions, i64), at::tensor(lanes, i64), embed, cos,
                             sin, kcache, vcache, mats, plain, norms, plan.tensors, plan.ints, kind, n_heads, kv_heads,
                             head_dim, eps, c_rows, e, wd);
  auto t = logits.scalar_type();
  if (e.greedy && (t == at::kBFloat16 || t == at::kFloat) && logits.is_contiguous()) {
    auto ids = at::empty({logits.size(0)}, i64);
    e.greedy(logits.data_ptr(), logits.size(0), logits.size(1), lanes.data(), spare, t == at::kBFloat16,
             ids.data_ptr<int64_t>());
    return {logits, ids};
  }
  return {logits, logits.to(at::kFloat).argmax(-1)};
}

}  // namespace

TORCH_LIBRARY(tfengine_cpu, m) {
  m.def("decode_rows(int[] tokens, int[] positions, int[] lanes, int spare, int span_unit, Tensor embed, Tensor cos, "
        "Tensor sin, Tensor kcache, Tensor vcache, Tensor[] mats, Tensor[] plain, Tensor[] norms, int kind, "
        "int n_heads, int kv_heads, int head_dim, float eps, int attn, int norm, int heads, int sum_width, int greedy, "
        "int wide) -> (Tensor, Tensor)",
        decode_rows);
}
