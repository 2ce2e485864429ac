#include "lumen/formats/mlx.h"

#include <vector>

#include "lumen/core/half.h"
#include "lumen/core/quant.h"

namespace lumen::formats {
namespace {

using nlohmann::json;

Result<int> GetIntField(const json& obj, const char* key, std::string_view where) {
  const auto it = obj.find(key);
  if (it == obj.end()) return Errorf("{}: missing \"{}\"", where, key);
  if (!it->is_number_integer()) return Errorf("{}: \"{}\" must be an integer", where, key);
  const int64_t v = it->get<int64_t>();
  if (v < 0 || v > 1'000'000) return Errorf("{}: \"{}\" = {} is out of range", where, key, v);
  return int(v);
}

Result<MlxQuantParams> ParseParams(const json& obj, std::string_view where) {
  MlxQuantParams p;
  LUMEN_ASSIGN_OR_RETURN(p.group_size, GetIntField(obj, "group_size", where));
  LUMEN_ASSIGN_OR_RETURN(p.bits, GetIntField(obj, "bits", where));
  if (const auto m = obj.find("mode"); m != obj.end()) {
    if (!m->is_string() || m->get_ref<const std::string&>() != "affine")
      return Errorf("{}: quantization mode {} is not supported (only \"affine\")", where,
                    m->dump());
  }
  LUMEN_RETURN_IF_ERROR(CheckMlxQuantParams(p, where));
  return p;
}

bool IsScaleDType(DType t) { return t == DType::kF16 || t == DType::kBF16 || t == DType::kF32; }

void RowToFloat(const TensorView& v, int64_t row, float* out) {
  const int64_t n = v.cols();
  const void* p = v.row<void>(row);
  switch (v.dtype) {
    case DType::kF32:
      for (int64_t i = 0; i < n; ++i) out[i] = static_cast<const float*>(p)[i];
      break;
    case DType::kF16:
      for (int64_t i = 0; i < n; ++i) out[i] = F16ToF32(static_cast<const uint16_t*>(p)[i]);
      break;
    case DType::kBF16:
      for (int64_t i = 0; i < n; ++i) out[i] = BF16ToF32(static_cast<const uint16_t*>(p)[i]);
      break;
    default:
      LUMEN_CHECK(false && "MlxLinear: scales/biases dtype was validated");
  }
}

}  // namespace

Status CheckMlxQuantParams(const MlxQuantParams& p, std::string_view where) {
  if (p.group_size != 32 && p.group_size != 64 && p.group_size != 128)
    return Errorf("{}: group_size {} is not supported (32, 64 or 128)", where, p.group_size);
  if (p.bits != 4 && p.bits != 8)
    return Errorf("{}: bits {} is not supported (4 or 8)", where, p.bits);
  return Status::Ok();
}

std::optional<MlxQuantParams> MlxQuantization::For(std::string_view module) const {
  const auto it = overrides.find(module);
  if (it != overrides.end()) return it->second;
  return defaults;
}

Result<std::optional<MlxQuantization>> ParseMlxQuantization(const json& config,
                                                            std::string_view where) {
  if (!config.is_object()) return std::optional<MlxQuantization>();
  const char* key = "quantization";
  auto it = config.find(key);
  if (it == config.end()) {
    key = "quantization_config";
    it = config.find(key);
  }
  if (it == config.end()) return std::optional<MlxQuantization>();
  const std::string here = fmt::format("{}: \"{}\"", where, key);
  if (!it->is_object()) return Errorf("{} must be an object", here);
  if (const auto m = it->find("quant_method"); m != it->end())
    return Errorf("{}: quant_method {} is not supported (only MLX affine quantization)", here,
                  m->dump());
  MlxQuantization q;
  LUMEN_ASSIGN_OR_RETURN(q.defaults, ParseParams(*it, here));
  for (const auto& [k, v] : it->items()) {
    if (v.is_object()) {
      LUMEN_ASSIGN_OR_RETURN(MlxQuantParams p,
                             ParseParams(v, fmt::format("{}: module '{}'", here, k)));
      q.overrides.emplace(k, p);
    } else if (v.is_boolean()) {
      // mlx-lm records `false` for a module kept in floating point; `true`
      // means the defaults.
      q.overrides.emplace(k,
                          v.get<bool>() ? std::optional<MlxQuantParams>(q.defaults) : std::nullopt);
    }
  }
  return std::optional<MlxQuantization>(std::move(q));
}

Result<MlxLinear> MlxLinear::FromViews(std::string module, const TensorView& weight,
                                       const TensorView& scales, const TensorView& biases,
                                       const MlxQuantParams& params) {
  LUMEN_RETURN_IF_ERROR(CheckMlxQuantParams(params, module));
  const std::string wname = module + ".weight";
  const std::string sname = module + ".scales";
  const std::string bname = module + ".biases";
  if (weight.dtype != DType::kU32 || weight.ndim != 2)
    return Errorf("tensor '{}': a quantized weight must be 2-D u32, got {} {}", wname,
                  Name(weight.dtype), weight.ShapeString());
  if (!weight.is_contiguous()) return Errorf("tensor '{}': not contiguous", wname);
  MlxLinear m;
  m.name = std::move(module);
  m.bits = params.bits;
  m.group_size = params.group_size;
  m.weight = weight;
  m.scales = scales;
  m.biases = biases;
  m.out_features = weight.dim(0);
  m.in_features = weight.dim(1) * (32 / params.bits);
  if (m.in_features % params.group_size != 0)
    return Errorf(
        "tensor '{}': {} packed {}-bit values per row are not a whole number of groups "
        "of {}",
        wname, m.in_features, params.bits, params.group_size);
  const int64_t groups = m.in_features / params.group_size;
  for (const auto& [name, v] : {std::pair{sname, scales}, std::pair{bname, biases}}) {
    if (!IsScaleDType(v.dtype))
      return Errorf("tensor '{}': dtype {} is not f16, bf16 or f32", name, Name(v.dtype));
    if (v.ndim != 2 || v.dim(0) != m.out_features || v.dim(1) != groups)
      return Errorf(
          "tensor '{}': shape {} does not match weight '{}' {} with {} bits and group_size {} "
          "(expected [{}, {}])",
          name, v.ShapeString(), wname, weight.ShapeString(), params.bits, params.group_size,
          m.out_features, groups);
    if (!v.is_contiguous()) return Errorf("tensor '{}': not contiguous", name);
  }
  return m;
}

Result<MlxLinear> MlxLinear::Bind(const HfModelDir& dir, const std::string& module,
                                  const MlxQuantParams& params) {
  const HfTensor* t[3];
  const char* suffix[3] = {".weight", ".scales", ".biases"};
  for (int i = 0; i < 3; ++i) {
    t[i] = dir.Find(module + suffix[i]);
    if (t[i] == nullptr)
      return Errorf("{}: tensor '{}{}' is missing (MLX quantized module '{}')", dir.dir(), module,
                    suffix[i], module);
  }
  return FromViews(module, t[0]->view, t[1]->view, t[2]->view, params).WithContext(dir.dir());
}

void MlxLinear::DequantizeRow(int64_t row, float* out) const {
  LUMEN_CHECK(row >= 0 && row < out_features);
  const int64_t groups = in_features / group_size;
  std::vector<float> sb(size_t(2 * groups));
  RowToFloat(scales, row, sb.data());
  RowToFloat(biases, row, sb.data() + groups);
  DequantizeMlxRow(weight.row<const uint32_t>(row), sb.data(), sb.data() + groups, bits, group_size,
                   out, in_features);
}

}  // namespace lumen::formats
