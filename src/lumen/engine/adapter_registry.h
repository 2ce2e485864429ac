// AdapterRegistry: the LoRA adapters a server has mounted, by id, and the
// adapter sets requests pick from them.
//
// Mount loads a PEFT directory (adapter.h), checks it against the base model
// (every tensor's shape and target, F32/F16/BF16 values that are all finite,
// and the base model it names, if any) and only then makes it visible: a bad
// adapter is an error that names the file and the reason, and the registry is
// left as it was. Adapters are held by shared_ptr: a resolved AdapterSet keeps
// its adapters alive, so a job keeps the weights it started with after its
// adapter is unmounted or replaced, and the memory goes with the last job.
//
// A set spec is "" (none), "id", "a+b" (updates added in that order) or with
// weights "a*0.5+b*2" (weight w scales that adapter's update on top of its own
// alpha / r). Every mount gets a new generation number; AdapterSet::key names
// the generations and weights, so KV made under one set (the prompt cache) is
// never taken for another, nor for a re-mounted id with new weights.
//
// Thread-safe: every method may be called from any thread.
#pragma once

#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "lumen/core/status.h"
#include "lumen/engine/adapter.h"
#include "lumen/engine/model.h"
#include "lumen/model/lora.h"

namespace lumen::engine {

// One mounted adapter; immutable.
struct MountedAdapter {
  std::string id;
  std::string path;
  uint64_t generation = 0;  // unique per Mount within its registry
  Adapter adapter;
  std::vector<std::string> targets;  // PEFT module names it adapts ("q_proj", ...)
  model::LoraWeights weights;        // points into `adapter`
};

// The adapters one request runs with; immutable, shared by its jobs.
struct AdapterSet {
  std::vector<std::shared_ptr<const MountedAdapter>> adapters;  // keeps them alive
  std::vector<float> weights;                                   // per adapter
  model::LoraSet lora;  // one term per adapter, pointing into `adapters`
  std::string spec;     // canonical: "a", "a*0.5+b"
  std::string key;      // prompt cache namespace: generations and weights
};

// An adapter id: 1-64 of [A-Za-z0-9_.-] (no '+' or '*': they build set specs).
bool ValidAdapterId(const std::string& id);
inline constexpr int kMaxAdaptersPerSet = 8;

class AdapterRegistry {
 public:
  explicit AdapterRegistry(const Model& model) : model_(model) {}

  // Loads `dir` and mounts it as `id`; returns what was mounted. An id
  // already mounted is an error with *conflict set unless `replace` (then it
  // is swapped in atomically).
  Result<std::shared_ptr<const MountedAdapter>> Mount(const std::string& id, const std::string& dir,
                                                      bool replace, bool* conflict = nullptr);
  // False when no adapter has that id.
  bool Unmount(const std::string& id);
  // Mounted adapters in id order.
  std::vector<std::shared_ptr<const MountedAdapter>> List() const;
  // Resolves a set spec; "" gives null (no adapter). Errors name the spec's
  // part at fault and, for an unknown id, the mounted ones.
  Result<std::shared_ptr<const AdapterSet>> Resolve(const std::string& spec) const;

 private:
  const Model& model_;
  mutable std::mutex mu_;
  std::vector<std::shared_ptr<const MountedAdapter>> mounted_;  // sorted by id
  uint64_t next_generation_ = 1;
};

// The base-model check Mount applies: OK when the adapter names no base model,
// or when the last path components of the adapter's base_model_name_or_path
// and of the served model's name, lower-cased and without a file extension,
// contain one another ("meta-llama/Llama-3.2-1B" fits "Llama-3.2-1B-Q4_K_M.gguf").
Status CheckBaseModel(const std::string& adapter_base, const std::string& model_name);

}  // namespace lumen::engine
