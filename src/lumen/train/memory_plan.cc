#include "lumen/train/memory_plan.h"

#include <algorithm>
#include <cctype>
#include <filesystem>
#include <fstream>

#include <fmt/format.h>

#include "lumen/kernels/matmul_bf16_t.h"
#include "lumen/train/frozen.h"

namespace lumen::train {

namespace {
constexpr size_t kF = sizeof(float);
double Mb(size_t b) { return double(b) / (1024.0 * 1024.0); }

size_t StatusField(const char* key) {
  std::ifstream f("/proc/self/status");
  std::string line;
  const std::string k = std::string(key) + ":";
  while (std::getline(f, line))
    if (line.rfind(k, 0) == 0) return size_t(std::stoull(line.substr(k.size()))) * 1024;
  return 0;
}
}  // namespace

double PeakRssMb() { return double(StatusField("VmHWM")) / (1024.0 * 1024.0); }

size_t CodeRss() {
  std::error_code ec;
  const std::string exe = std::filesystem::read_symlink("/proc/self/exe", ec).string();
  std::ifstream f("/proc/self/smaps");
  std::string line;
  bool code = false;
  size_t kb = 0;
  while (std::getline(f, line)) {
    // A mapping's header starts with its address range ("7f12-7f34 r-xp ...").
    const size_t dash = line.find('-');
    if (dash > 0 && dash <= 16 && std::isxdigit(static_cast<unsigned char>(line[0]))) {
      const size_t slash = line.find('/');
      const std::string path = slash == std::string::npos ? "" : line.substr(slash);
      code = !path.empty() && (path == exe || path.find(".so") != std::string::npos);
    } else if (code && line.rfind("Rss:", 0) == 0) {
      kb += size_t(std::stoull(line.substr(4)));
    }
  }
  return kb * 1024;
}

size_t AnonymousRss() {
  const size_t rss = StatusField("VmRSS"), file = StatusField("RssFile");
  return rss > file ? rss - file : rss;
}

MemoryPlan PlanMemory(const model::ModelConfig& c, const LoraLayout& layout, const PlanInputs& in) {
  MemoryPlan p;
  p.segment = in.segment;
  p.mlp_chunk = in.mlp_chunk;
  const size_t M = size_t(in.tokens), R = size_t(in.scored);
  // --mlp-chunk: the FFN's [., F] buffers hold at most two chunks of rows.
  const size_t MF = in.mlp_chunk > 0 ? std::min<size_t>(M, 2 * size_t(in.mlp_chunk)) : M;
  const size_t D = c.dim, F = c.ffn_dim, Q = c.q_dim(), KV = c.kv_dim(), H = c.n_heads,
               V = c.vocab_size;
  p.lora = size_t(layout.size) * kF * 4;
  // graph.cc LayerSaved, per token.
  // xn1 and xn2 are recomputed in the backward, not kept.
  size_t per_tok = D /*x_in*/ + Q + 2 * KV /*q, k, v*/ + Q /*att*/ + H /*lse*/ + D /*x_mid*/ +
                   (in.mlp_chunk > 0 ? 0 : 3 * F) /*g, u, h*/;
  if (c.qk_norm) per_tok += Q + KV;
  if (c.post_norms) per_tok += 2 * D;
  size_t lora_u = 0;
  for (const auto& s : layout.slots)
    if (s.layer == c.n_layers - 1) lora_u += size_t(layout.cfg.rank);
  p.per_layer = (per_tok + lora_u) * M * kF;
  const size_t boundary = M * D * kF;
  // Segmented: every boundary but the first (the embedding, recomputed) is
  // kept; the top segment's boundary is spent by its recompute.
  size_t kept_bounds = 0, bwd_bounds = 0;
  if (in.segment > 0) {
    const size_t segs = (size_t(c.n_layers) + in.segment - 1) / in.segment;
    kept_bounds = segs - 1;
    bwd_bounds = kept_bounds > 0 ? kept_bounds - 1 : 0;
    p.layers = kept_bounds * boundary + size_t(std::min(in.segment, c.n_layers)) * p.per_layer;
  } else {
    p.layers = size_t(c.n_layers) * p.per_layer;
  }
  // Heads: plain keeps logits [R, V], xn and h [R, D] until the next step, and
  // its backward adds dz [R, V] and dxn. Fused keeps lse and works on one
  // [row_block, chunk] tile; its forward also holds d logp / d xn [R, D]
  // until its backward (the one-pass head, fused_head.h; freed before the
  // layers' backward).
  size_t head_kept, head_bwd;
  // With bf16 the dh product adds into dxn (no [rows, D] f32 result) and
  // holds the coefficients in bf16 and one panel per thread instead
  // (kernels/matmul_bf16_t.h); the logit product holds xn in bf16 (smaller).
  if (in.fused_ce) {
    const size_t rb = std::min<size_t>(in.row_block, std::max<size_t>(R, 1));
    const size_t ch = std::min<size_t>(in.vocab_chunk, V);
    head_kept = R * kF;
    head_bwd = R * D * kF + rb * ch * kF + 2 * rb * D * kF +
               (in.bf16 ? kernels::MatMulTBf16TransientBytes(rb, ch, in.threads)
                        : rb * std::max(D, ch) * kF);
  } else {
    head_kept = R * V * kF + 2 * R * D * kF;
    head_bwd = R * V * kF + 2 * R * D * kF;
    if (in.bf16) head_bwd += kernels::MatMulTBf16TransientBytes(R, V, in.threads);
  }
  p.head = head_kept + head_bwd;
  // Backward temporaries of the layer under backward, at the larger of its
  // two moments. The FFN's backward: dd, and per MLP chunk (MF rows) xn2 and
  // dxn, the recomputed g, u, h (chunked), dh = du, dg and FrozenProductT's
  // scratch. The attention's backward: dd, datt, dq, dk, dv, xn1, dxn and the
  // scratch, once the FFN's saved part (x_mid; g, u, h unchunked) is freed.
  // f32: FrozenProductT's scratch, at most kTransposedRowChunk rows of [., D]
  // (attention) or [., F] (down's dX). bf16 adds into dX directly; its largest
  // transient is gate/up's backward: dY [M, F] in bf16 plus the panels. The
  // peak is the larger of the head's backward (kept layers + head + hidden
  // and dhidden) and a layer's backward (kept layers + the head's kept buffers
  // + temporaries + dx: the graph's backward frees hidden and takes dhidden's
  // storage as dx).
  const size_t chunk = size_t(kTransposedRowChunk);
  const size_t matmul_t = in.bf16 ? kernels::MatMulTBf16TransientBytes(MF, F, in.threads)
                                  : std::min(MF, chunk) * kF * F;
  // dd is dx itself without post norms and residual scale (BlockOutputBackward).
  const size_t dd = c.post_norms || c.residual_scale != 1.0f ? D : 0;
  const bool chunked = in.mlp_chunk > 0;
  const size_t ffn_tmp =
      M * kF * dd +
      MF * kF * (2 * D /*xn2, dxn*/ + 2 * F /*dh = du, dg*/ + (chunked ? 3 * F : 0) /*g, u, h*/) +
      matmul_t;
  const size_t attn_tmp = M * kF * (dd + 2 * Q + 2 * KV + 2 * D /*xn1, dxn*/) +
                          (in.bf16 ? M : std::min(M, chunk)) * kF * D;
  const size_t ffn_freed = M * kF * (D /*x_mid*/ + (chunked ? 0 : 3 * F));
  const size_t layer_tmp = std::max(ffn_tmp, attn_tmp > ffn_freed ? attn_tmp - ffn_freed : 0);
  p.transient = layer_tmp + boundary;
  const size_t head_phase = p.head + 2 * boundary;
  p.peak = in.baseline + in.weight_bytes + p.lora + p.layers +
           std::max(head_phase, head_kept + p.transient - (kept_bounds - bwd_bounds) * boundary);
  return p;
}

std::string MemoryPlan::Describe(const model::ModelConfig& c, const PlanInputs& in) const {
  return fmt::format(
      "memory plan ({} tokens per micro-batch, {} scored; {} layers, D {} F {} V {}):\n"
      "  weights (mapped)        {:9.1f} MB\n"
      "  process baseline        {:9.1f} MB\n"
      "  LoRA + grads + Adam     {:9.1f} MB\n"
      "  activations per layer   {:9.1f} MB\n"
      "  kept activations        {:9.1f} MB ({}{})\n"
      "  head ({})         {:9.1f} MB\n"
      "  backward temporaries    {:9.1f} MB\n"
      "  predicted peak          {:9.1f} MB\n",
      in.tokens, in.scored, c.n_layers, c.dim, c.ffn_dim, c.vocab_size, Mb(in.weight_bytes),
      Mb(in.baseline), Mb(lora), Mb(per_layer), Mb(layers),
      segment > 0 ? fmt::format("segments of {} layers", segment) : std::string("every layer"),
      mlp_chunk > 0 ? fmt::format(", MLP in chunks of {} tokens", mlp_chunk) : std::string(),
      in.fused_ce ? "fused" : "plain", Mb(head), Mb(transient), Mb(peak));
}

Result<PlanChoice> ChooseSegment(const model::ModelConfig& c, const LoraLayout& layout,
                                 PlanInputs in, size_t budget) {
  size_t best = SIZE_MAX;
  for (int64_t chunk : {int64_t(0), int64_t(256)}) {
    in.mlp_chunk = chunk;
    for (int seg = 0; seg <= c.n_layers; ++seg) {
      in.segment = seg == 0 ? 0 : c.n_layers + 1 - seg;  // 0, then L, L-1, ..., 1
      const size_t peak = PlanMemory(c, layout, in).peak;
      if (peak <= budget) return PlanChoice{in.segment, chunk};
      best = std::min(best, peak);
    }
  }
  return Errorf(
      "--memory-budget {:.0f} MB: the smallest plan needs {:.0f} MB (segments of one "
      "layer, MLP in chunks of 256{}); raise the budget or shorten --max-seq-len / "
      "--batch-size",
      Mb(budget), Mb(best), in.fused_ce ? "" : ", and --fused-ce would help");
}

}  // namespace lumen::train
