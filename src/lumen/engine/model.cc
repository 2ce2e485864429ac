#include "lumen/engine/model.h"

#include <filesystem>
#include <map>

#include "lumen/formats/gguf.h"

namespace lumen::engine {

struct Model::Sources {
  std::optional<formats::GgufFile> gguf;
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

size_t Model::weight_bytes() const {
  size_t n = 0;
  for (const auto& t : tensors_) n += t.matrix.bytes();
  return n;
}

Status Model::Finish(const LoadOptions& opts) {
  auto lookup = [this](const std::string& name) -> Result<kernels::Matrix> {
    auto it = sources_->index.find(name);
    if (it == sources_->index.end()) return kernels::Matrix{};
    return tensors_[it->second].matrix;
  };
  LUMEN_ASSIGN_OR_RETURN(weights_, model::BindWeights(config_, lookup));
  pool_ = std::make_unique<ThreadPool>(opts.threads > 0 ? opts.threads
                                                        : ThreadPool::DefaultThreads());
  if (chat_template_.empty()) chat_template_ = tokenizer_->chat_template();
  return Status::Ok();
}

Status Model::InitGguf(const LoadOptions& opts) {
  format_ = "gguf";
  const formats::GgufFile& gg = *sources_->gguf;
  LUMEN_ASSIGN_OR_RETURN(config_, model::ConfigFromGguf(gg));
  for (const auto& t : gg.tensors()) {
    StoredTensor st;
    st.name = st.source_name = t.name;
    st.shape.assign(t.view.shape.begin(), t.view.shape.begin() + t.view.ndim);
    const TensorView v2 =
        t.view.ndim == 2 ? t.view : t.view.Reshape({t.view.numel() / t.view.cols(), t.view.cols()});
    st.matrix = kernels::Matrix::Plain(v2);
    sources_->index[st.name] = tensors_.size();
    tensors_.push_back(std::move(st));
  }
  LUMEN_ASSIGN_OR_RETURN(tokenize::Tokenizer tok, tokenize::Tokenizer::FromGguf(gg));
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
  LUMEN_RETURN_IF_ERROR(m->InitGguf(opts).WithContext(name));
  return m;
}

Result<std::unique_ptr<Model>> Model::Load(const std::string& path, const LoadOptions& opts) {
  namespace fs = std::filesystem;
  std::error_code ec;
  if (!fs::exists(path, ec)) return Errorf("{}: no such file or directory", path);
  std::unique_ptr<Model> m(new Model());
  m->name_ = fs::path(path).filename().string();
  if (fs::is_directory(path, ec)) {
    return Errorf("{}: Hugging Face directories are not supported yet", path);
  }
  LUMEN_ASSIGN_OR_RETURN(formats::GgufFile g, formats::GgufFile::Open(path));
  m->sources_->gguf.emplace(std::move(g));
  LUMEN_RETURN_IF_ERROR(m->InitGguf(opts).WithContext(path));
  return m;
}

}  // namespace lumen::engine
