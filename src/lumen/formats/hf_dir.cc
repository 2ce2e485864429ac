#include "lumen/formats/hf_dir.h"

#include <algorithm>
#include <filesystem>
#include <set>
#include <system_error>

namespace lumen::formats {
namespace {

namespace fs = std::filesystem;

bool IsFile(const fs::path& p) {
  std::error_code ec;
  return fs::is_regular_file(p, ec);
}

bool EndsWith(std::string_view s, std::string_view suffix) {
  return s.size() >= suffix.size() && s.substr(s.size() - suffix.size()) == suffix;
}

// A shard named by an index must be a plain file in the model directory.
bool IsPlainFileName(const std::string& name) {
  return !name.empty() && name != "." && name != ".." && name.find('/') == std::string::npos &&
         name.find('\\') == std::string::npos && name.find('\0') == std::string::npos;
}

}  // namespace

Result<nlohmann::json> ReadJsonFile(const std::string& path) {
  LUMEN_ASSIGN_OR_RETURN(std::string text, ReadFile(path));
  try {
    return nlohmann::json::parse(text);
  } catch (const nlohmann::json::exception& e) {
    return Errorf("{}: not valid JSON: {}", path, e.what());
  }
}

Status HfModelDir::AddShard(const std::string& file_name) {
  const std::string path = (fs::path(dir_) / file_name).string();
  LUMEN_ASSIGN_OR_RETURN(SafetensorsFile f, SafetensorsFile::Open(path, residency_));
  const size_t shard = shards_.size();
  for (const SafetensorsTensor& t : f.tensors()) {
    if (const auto it = index_.find(t.name); it != index_.end()) {
      return Errorf("{}: tensor '{}' is also in {}", path, t.name,
                    shard_paths_[tensors_[it->second].shard]);
    }
    index_.emplace(t.name, tensors_.size());
    tensors_.push_back(HfTensor{t.name, t.dtype, t.shape, t.view, shard});
  }
  shard_paths_.push_back(path);
  shards_.push_back(std::make_unique<SafetensorsFile>(std::move(f)));
  return Status::Ok();
}

Result<HfModelDir> HfModelDir::Open(const std::string& dir, Residency residency) {
  HfModelDir d;
  d.dir_ = dir;
  d.residency_ = residency;
  const fs::path root(dir);
  std::error_code ec;
  if (!fs::is_directory(root, ec)) return Errorf("{}: not a directory", dir);

  LUMEN_ASSIGN_OR_RETURN(d.config_, ReadJsonFile((root / "config.json").string()));
  if (!d.config_.is_object())
    return Errorf("{}: not a JSON object", (root / "config.json").string());
  if (const fs::path p = root / "generation_config.json"; IsFile(p)) {
    LUMEN_ASSIGN_OR_RETURN(nlohmann::json g, ReadJsonFile(p.string()));
    if (!g.is_object()) return Errorf("{}: not a JSON object", p.string());
    d.generation_config_ = std::move(g);
  }
  if (const fs::path p = root / "tokenizer.json"; IsFile(p)) d.tokenizer_json_ = p.string();
  if (const fs::path p = root / "tokenizer_config.json"; IsFile(p))
    d.tokenizer_config_ = p.string();
  if (const fs::path p = root / "tokenizer.model"; IsFile(p)) d.tokenizer_model_ = p.string();

  // Where the weights are.
  std::vector<std::string> safetensors, indexes;
  for (const auto& entry : fs::directory_iterator(root, ec)) {
    const std::string name = entry.path().filename().string();
    if (!IsFile(entry.path())) continue;
    if (EndsWith(name, ".safetensors")) safetensors.push_back(name);
    if (EndsWith(name, ".safetensors.index.json")) indexes.push_back(name);
  }
  if (ec) return Errorf("{}: cannot list: {}", dir, ec.message());
  std::sort(safetensors.begin(), safetensors.end());
  std::sort(indexes.begin(), indexes.end());

  std::string index_name;
  if (std::find(indexes.begin(), indexes.end(), "model.safetensors.index.json") != indexes.end()) {
    index_name = "model.safetensors.index.json";
  } else if (indexes.size() == 1) {
    index_name = indexes[0];
  } else if (indexes.size() > 1) {
    return Errorf("{}: several *.safetensors.index.json files and no model.safetensors.index.json",
                  dir);
  }

  if (!index_name.empty()) {
    const std::string index_path = (root / index_name).string();
    LUMEN_ASSIGN_OR_RETURN(nlohmann::json index, ReadJsonFile(index_path));
    if (!index.is_object()) return Errorf("{}: not a JSON object", index_path);
    const auto wm = index.find("weight_map");
    if (wm == index.end() || !wm->is_object())
      return Errorf("{}: missing \"weight_map\" object", index_path);
    std::vector<std::string> shard_order;
    std::set<std::string> seen;
    for (const auto& [tensor, shard] : wm->items()) {
      if (!shard.is_string())
        return Errorf("{}: weight_map entry for tensor '{}' is not a file name", index_path,
                      tensor);
      const std::string& s = shard.get_ref<const std::string&>();
      if (!IsPlainFileName(s))
        return Errorf("{}: tensor '{}': shard '{}' is not a file name in the model directory",
                      index_path, tensor, s);
      if (seen.insert(s).second) shard_order.push_back(s);
    }
    if (shard_order.empty()) return Errorf("{}: weight_map is empty", index_path);
    for (const std::string& s : shard_order) {
      Status st = d.AddShard(s);
      if (!st.ok()) return st.WithContext(fmt::format("{} (listed in {})", dir, index_name));
    }
    for (const auto& [tensor, shard] : wm->items()) {
      const std::string shard_path = (root / shard.get_ref<const std::string&>()).string();
      const HfTensor* t = d.Find(tensor);
      if (t == nullptr)
        return Errorf("{}: tensor '{}' listed in {} is missing from the shard", shard_path, tensor,
                      index_name);
      if (d.shard_paths_[t->shard] != shard_path)
        return Errorf("{}: tensor '{}' listed in {} is in {} instead", shard_path, tensor,
                      index_name, d.shard_paths_[t->shard]);
    }
  } else if (std::find(safetensors.begin(), safetensors.end(), "model.safetensors") !=
             safetensors.end()) {
    LUMEN_RETURN_IF_ERROR(d.AddShard("model.safetensors"));
  } else if (!safetensors.empty()) {
    for (const std::string& s : safetensors) LUMEN_RETURN_IF_ERROR(d.AddShard(s));
  } else {
    return Errorf("{}: no model.safetensors, model.safetensors.index.json or other *.safetensors",
                  dir);
  }
  return d;
}

const HfTensor* HfModelDir::Find(std::string_view name) const {
  const auto it = index_.find(name);
  return it == index_.end() ? nullptr : &tensors_[it->second];
}

}  // namespace lumen::formats
