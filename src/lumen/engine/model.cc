#include "lumen/engine/model.h"

#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>
#include <string_view>

#include "lumen/core/log.h"
#include "lumen/core/repack.h"
#include "lumen/engine/adapter.h"
#include "lumen/engine/embed.h"
#include "lumen/formats/gguf.h"
#include "lumen/formats/hf_dir.h"
#include "lumen/formats/llama2c.h"
#include "lumen/formats/mlx.h"
#include "lumen/formats/safetensors.h"
#include "lumen/kernels/matmul_q8.h"

namespace lumen::engine {
namespace {

// Names the model file once: the format readers already start their messages
// with the path, other errors (binding, config checks) get it added here.
Status InFile(Status s, const std::string& path) {
  if (s.ok() || s.message().starts_with(path)) return s;
  return s.WithContext(path);
}

bool StartsWithGgufMagic(const std::string& path) {
  char magic[4] = {};
  std::ifstream f(path, std::ios::binary);
  return f.read(magic, 4) && std::memcmp(magic, "GGUF", 4) == 0;
}

// The error for a *.safetensors path whose bytes are not safetensors: the
// reason without the reader's own path prefix, and the header length read as
// the format would read it when that is what fails.
Status NotSafetensors(const std::string& path, const Status& why) {
  std::error_code ec;
  const uint64_t size = std::filesystem::file_size(path, ec);
  std::ifstream f(path, std::ios::binary);
  uint64_t n = 0;
  if (!ec && size >= 8 && f.read(reinterpret_cast<char*>(&n), 8) && n > size - 8) {
    return Errorf(
        "{}: not a safetensors file: header length {} exceeds the file size ({} bytes), and "
        "not GGUF either (no 'GGUF' magic)",
        path, n, size);
  }
  std::string reason = why.message();
  if (reason.starts_with(path + ": ")) reason.erase(0, path.size() + 2);
  return Errorf("{}: not a safetensors file: {}", path, reason);
}

// Q4_0, Q4_1, Q5_0, Q5_1, Q4_K, Q5_K, Q8_0, Q6_K, Q2_K and Q3_K matrices
// (Q5_K's 5th bits in planes where the AVX2 kernels are the int8 ones)
// rewritten in place as column groups
// (core/repack.h) for the int8 decode kernels, which then pay their
// per-lane work once per 512 weights with no shuffles (the AVX2 kernels once per 256:
// kernels::Int8ColumnGroupsOf). Only in a copied file (no second copy: the
// memory is the file's), with an int8 route on a CPU that runs it, and not
// under LUMEN_REPACK=0. Every other reader decodes the new type to the same
// values (the exact route to the same bits). Rows are rewritten on the
// pool's threads. Returns the matrices rewritten.
// Whether the load-time layouts are wanted: an int8 route, not LUMEN_REPACK=0.
bool RepackWanted(kernels::ActRoute route) {
  const char* env = std::getenv("LUMEN_REPACK");
  return kernels::RouteHasInt8(route) && (env == nullptr || std::string_view(env) != "0");
}

int RepackColumnGroupsForInt8(formats::GgufFile& gg, std::vector<StoredTensor>& tensors,
                              kernels::ActRoute route, ThreadPool& pool) {
  if (!RepackWanted(route)) return 0;
  int count = 0;
  for (StoredTensor& t : tensors) {
    kernels::Matrix& m = t.matrix;
    const DType plain = m.w.dtype, cols = kernels::Int8ColumnGroupsOf(plain);
    if (m.mlx_bits != 0 || cols == plain || m.k < kColsElems || m.n == 0) continue;
    const size_t rb = *RowBytes(plain, m.k);
    const auto stride = static_cast<size_t>(m.w.row<const uint8_t>(1) - m.w.row<const uint8_t>(0));
    const size_t len = (static_cast<size_t>(m.n) - 1) * stride + rb;
    const bool done = gg.RewriteInPlace(m.w.data, len, [&](uint8_t* p) {
      pool.ParallelFor(m.n, [&](int64_t n0, int64_t n1, int) {
        for (int64_t n = n0; n < n1; ++n) RepackColumnGroups(cols, p + n * stride, m.k);
      });
    });
    if (!done) return count;  // the file is mapped, not copied: none can be
    m.w.dtype = cols;
    ++count;
  }
  return count;
}

// MLX matrices' codes rewritten in place in the order this CPU's int8
// kernels read (kernels::Int8MlxOrder, core/repack.h): runs for the AVX2
// ones, which then load a run's blocks transposed (a 4 x 4 dword transpose
// per run saved: MLX 8-bit's row 140 -> 128 ns on Zen 2); groups for the
// AVX-512 VNNI ones, which then load each column of a group (per 64 bytes,
// 4-bit: two vpermt2d and a blend saved; 8-bit: a vpermt2d;
// docs/reference/performance.md, session 42). Under the same conditions as
// the column groups (an int8 route, a copied file, not LUMEN_REPACK=0).
// Every other reader takes the file's order back (kernels::MlxFileCodes).
// Returns the matrices rewritten.
int RepackMlxForInt8(formats::HfModelDir& hf, std::vector<StoredTensor>& tensors,
                     kernels::ActRoute route, ThreadPool& pool) {
  if (!RepackWanted(route)) return 0;
  int count = 0;
  for (StoredTensor& t : tensors) {
    kernels::Matrix& m = t.matrix;
    const kernels::MlxOrder order = kernels::Int8MlxOrder(m);
    if (order == kernels::MlxOrder::kFile || m.n == 0) continue;
    const auto rb = static_cast<size_t>(m.k * m.mlx_bits / 8);
    const auto stride = static_cast<size_t>(m.w.stride[0]);
    const size_t len = (static_cast<size_t>(m.n) - 1) * stride + rb;
    const bool done = hf.RewriteInPlace(m.w.data, len, [&](uint8_t* p) {
      pool.ParallelFor(m.n, [&](int64_t n0, int64_t n1, int) {
        for (int64_t n = n0; n < n1; ++n) {
          if (order == kernels::MlxOrder::kRuns)
            TransposeMlxRuns(p + n * stride, static_cast<int64_t>(rb));
          else
            TransposeMlxGroups(p + n * stride, static_cast<int64_t>(rb), m.mlx_bits);
        }
      });
    });
    if (!done) return count;  // the file is mapped, not copied: none can be
    m.mlx_order = order;
    ++count;
  }
  return count;
}

}  // namespace

struct Model::Sources {
  std::optional<formats::GgufFile> gguf;
  std::optional<formats::HfModelDir> hf;
  std::optional<formats::Llama2cModel> l2c;
  std::map<std::string, size_t> index;  // canonical name -> tensors_ index
};

Model::Model() : sources_(std::make_unique<Sources>()) {}
Model::~Model() = default;

int64_t Model::parameter_count() const {
  int64_t n = 0;
  for (const auto& t : tensors_) {
    int64_t e = 1;
    for (int64_t d : t.shape) e *= d;
    n += e;
  }
  return n;
}

void Model::SetActRoute(kernels::ActRoute route) {
  model::ForEachMatrix(weights_, [&](kernels::Matrix& m) { m.route = route; });
  act_route_ = route;
}

size_t Model::weight_bytes() const {
  size_t n = 0;
  for (const auto& t : tensors_) n += t.matrix.bytes();
  return n;
}

size_t Model::copied_bytes() const {
  const Sources& s = *sources_;
  return (s.gguf ? s.gguf->copied_bytes() : 0) + (s.hf ? s.hf->copied_bytes() : 0) +
         (s.l2c ? s.l2c->copied_bytes() : 0);
}

Status Model::Finish(const LoadOptions& opts) {
  auto lookup = [this](const std::string& name) -> Result<kernels::Matrix> {
    auto it = sources_->index.find(name);
    if (it == sources_->index.end()) return kernels::Matrix{};
    return tensors_[it->second].matrix;
  };
  pool_ =
      std::make_unique<ThreadPool>(opts.threads > 0 ? opts.threads : ThreadPool::DefaultThreads());
  if (sources_->gguf) {
    const int n = RepackColumnGroupsForInt8(*sources_->gguf, tensors_, opts.act_route, *pool_);
    if (n > 0) LUMEN_LOG_DEBUG("repacked {} matrices into column groups", n);
  }
  if (sources_->hf) {
    const int n = RepackMlxForInt8(*sources_->hf, tensors_, opts.act_route, *pool_);
    if (n > 0) LUMEN_LOG_DEBUG("rearranged the codes of {} MLX matrices for the int8 kernels", n);
  }
  LUMEN_ASSIGN_OR_RETURN(weights_, model::BindWeights(config_, lookup));
  SetActRoute(opts.act_route);
  if (!opts.adapter_dir.empty()) {
    LUMEN_ASSIGN_OR_RETURN(Adapter a, LoadAdapter(opts.adapter_dir, config_));
    adapter_ = std::make_unique<Adapter>(std::move(a));
    AttachAdapter(*adapter_, weights_);
  }
  if (chat_template_.empty()) chat_template_ = tokenizer_->chat_template();
  return Status::Ok();
}

void Model::AddTensor(StoredTensor st) {
  sources_->index[st.name] = tensors_.size();
  tensors_.push_back(std::move(st));
}

void Model::AddTensor(const std::string& name, const std::string& source_name,
                      const TensorView& view) {
  StoredTensor st;
  st.name = name;
  st.source_name = source_name;
  st.shape.assign(view.shape.begin(), view.shape.begin() + view.ndim);
  // Kernels see every tensor as rows: 1-D as [1, n], higher ranks flattened.
  st.matrix = kernels::Matrix::Plain(view.Reshape({view.rows(), view.cols()}));
  AddTensor(std::move(st));
}

Status Model::InitGguf(const LoadOptions& opts) {
  format_ = "gguf";
  const formats::GgufFile& gg = *sources_->gguf;
  LUMEN_ASSIGN_OR_RETURN(config_, model::ConfigFromGguf(gg));
  for (const auto& t : gg.tensors()) {
    AddTensor(t.name, t.name, t.view);
  }
  LUMEN_ASSIGN_OR_RETURN(tokenize::Tokenizer tok, tokenize::Tokenizer::FromGguf(gg));
  tokenizer_.emplace(std::move(tok));
  LUMEN_RETURN_IF_ERROR(Finish(opts));
  // Config and tokenizer are built: the metadata (vocabulary arrays) is not read again.
  sources_->gguf->DropMetadata();
  return Status::Ok();
}

Status Model::InitHf(const LoadOptions& opts) {
  const formats::HfModelDir& hf = *sources_->hf;
  LUMEN_ASSIGN_OR_RETURN(config_, model::ConfigFromHf(hf.config()));
  LUMEN_ASSIGN_OR_RETURN(config_.pooling, ReadSentenceTransformersPooling(hf.dir()));
  LUMEN_ASSIGN_OR_RETURN(auto mlx, formats::ParseMlxQuantization(hf.config(), "config.json"));
  format_ = mlx ? "mlx" : "hf";
  std::set<std::string> claimed;  // two canonical names can map to one HF name
  for (const std::string& canonical : model::CanonicalTensorNames(config_)) {
    const std::string name = model::HfName(config_.family, canonical);
    const formats::HfTensor* t = hf.Find(name);
    if (!t || !claimed.insert(name).second) continue;
    const std::string module = name.substr(0, name.rfind('.'));
    if (!(mlx && hf.Find(module + ".scales") && name.ends_with(".weight"))) {
      AddTensor(canonical, name, t->view);
      continue;
    }
    auto params = mlx->For(module);
    if (!params) return Errorf("tensor '{}': has scales but quantization says none", name);
    LUMEN_ASSIGN_OR_RETURN(formats::MlxLinear lin, formats::MlxLinear::Bind(hf, module, *params));
    StoredTensor st;
    st.name = canonical;
    st.source_name = name;
    st.shape = {lin.out_features, lin.in_features};
    st.matrix.w = lin.weight;
    st.matrix.scales = lin.scales;
    st.matrix.biases = lin.biases;
    st.matrix.mlx_bits = lin.bits;
    st.matrix.mlx_group = lin.group_size;
    st.matrix.n = lin.out_features;
    st.matrix.k = lin.in_features;
    AddTensor(std::move(st));
  }
  if (hf.generation_config()) generation_config_ = *hf.generation_config();
  if (!hf.tokenizer_json_path()) return Error("no tokenizer.json in the model directory");
  LUMEN_ASSIGN_OR_RETURN(tokenize::Tokenizer tok, tokenize::Tokenizer::FromHf(hf.dir()));
  // A config may pad the vocabulary past the tokenizer (Qwen's 151936 rows
  // for 151665 tokens); a tokenizer past the embedding rows is another
  // model's, and would fail mid-generation on the first such id.
  if (tok.vocab_size() > config_.vocab_size)
    return Errorf(
        "tokenizer.json has {} tokens but config.json's vocab_size is {}: ids from {} on have "
        "no embedding row (a tokenizer from another model?)",
        tok.vocab_size(), config_.vocab_size, config_.vocab_size);
  tokenizer_.emplace(std::move(tok));
  return Finish(opts);
}

Status Model::InitLlama2c(const LoadOptions& opts) {
  format_ = "llama2c";
  const formats::Llama2cModel& l = *sources_->l2c;
  const formats::Llama2cConfig& lc = l.config();
  // run.c's fixed hyperparameters: RMSNorm eps 1e-5, RoPE theta 1e4 on adjacent
  // pairs, SiLU gated FFN (fixture README).
  config_.family = model::Family::kLlama;
  config_.n_layers = int(lc.n_layers);
  config_.dim = int(lc.dim);
  config_.n_heads = int(lc.n_heads);
  config_.n_kv_heads = int(lc.n_kv_heads);
  config_.ffn_dim = int(lc.hidden_dim);
  config_.vocab_size = int(lc.vocab_size);
  config_.max_ctx = lc.seq_len;
  config_.norm_eps = 1e-5f;
  config_.rope_theta = 10000.0;
  config_.rope_style = kernels::RopeStyle::kInterleaved;
  config_.tied_embeddings = lc.shared_classifier;
  LUMEN_RETURN_IF_ERROR(config_.Finalize());
  for (const auto& t : l.tensors()) {
    AddTensor(t.name, t.name, t.view);
  }
  if (opts.tokenizer_path.empty())
    return Error("llama2.c models need their tokenizer: pass --tokenizer tokenizer.bin");
  LUMEN_ASSIGN_OR_RETURN(tokenize::Tokenizer tok,
                         tokenize::Tokenizer::FromLlama2c(opts.tokenizer_path, config_.vocab_size));
  tokenizer_.emplace(std::move(tok));
  return Finish(opts);
}

Result<std::unique_ptr<Model>> Model::LoadGgufBytes(const uint8_t* data, size_t size,
                                                    const std::string& name,
                                                    const LoadOptions& opts) {
  std::unique_ptr<Model> m(new Model());
  m->name_ = name;
  LUMEN_ASSIGN_OR_RETURN(formats::GgufFile g, formats::GgufFile::FromBytes(data, size, name));
  m->sources_->gguf.emplace(std::move(g));
  LUMEN_RETURN_IF_ERROR(InFile(m->InitGguf(opts), name));
  return m;
}

Result<std::unique_ptr<Model>> Model::Load(const std::string& path, const LoadOptions& opts) {
  namespace fs = std::filesystem;
  std::error_code ec;
  if (!fs::exists(path, ec)) return Errorf("{}: no such file or directory", path);
  std::unique_ptr<Model> m(new Model());
  m->name_ = fs::path(path).filename().string();
  if (fs::is_directory(path, ec)) {
    LUMEN_ASSIGN_OR_RETURN(formats::HfModelDir hf, formats::HfModelDir::Open(path, opts.residency));
    m->sources_->hf.emplace(std::move(hf));
    LUMEN_RETURN_IF_ERROR(InFile(m->InitHf(opts), path));
    return m;
  }
  if (path.ends_with(".bin")) {
    LUMEN_ASSIGN_OR_RETURN(formats::Llama2cModel l, formats::Llama2cModel::Open(path));
    m->sources_->l2c.emplace(std::move(l));
    LUMEN_RETURN_IF_ERROR(InFile(m->InitLlama2c(opts), path));
    return m;
  }
  if (path.ends_with(".safetensors") && !StartsWithGgufMagic(path)) {
    // A lone safetensors file holds weights only: load the model directory it
    // sits in, or say what the bytes are.
    auto st = formats::SafetensorsFile::Open(path);
    if (!st.ok()) return NotSafetensors(path, st.status());
    const fs::path dir = fs::path(path).parent_path();
    if (fs::exists(dir / "config.json", ec)) return Load(dir.empty() ? "." : dir.string(), opts);
    return Errorf(
        "{}: a safetensors file holds only weights; pass the Hugging Face model directory "
        "(config.json, tokenizer.json and the *.safetensors files)",
        path);
  }
  LUMEN_ASSIGN_OR_RETURN(formats::GgufFile g, formats::GgufFile::Open(path, opts.residency));
  m->sources_->gguf.emplace(std::move(g));
  LUMEN_RETURN_IF_ERROR(InFile(m->InitGguf(opts), path));
  return m;
}

}  // namespace lumen::engine
