#include "lumen/tokenize/chat_template/value.h"

#include <algorithm>
#include <cmath>
#include <cstdio>

#include "lumen/tokenize/chat_template/pystr.h"

namespace lumen::tokenize {
namespace {

bool IsStrKey(const Value& v, std::string_view key) {
  return v.is_string() && v.as_string() == key;
}

}  // namespace

const Value* DictData::Find(const Value& key) const {
  for (const auto& [k, v] : entries)
    if (Equals(k, key)) return &v;
  return nullptr;
}

const Value* DictData::Find(std::string_view key) const {
  for (const auto& [k, v] : entries)
    if (IsStrKey(k, key)) return &v;
  return nullptr;
}

Value* NamespaceData::Find(std::string_view name) {
  for (auto& [k, v] : attrs)
    if (k == name) return &v;
  return nullptr;
}

double Value::as_double() const {
  switch (type()) {
    case Type::kInt:
      return static_cast<double>(as_int());
    case Type::kBool:
      return as_bool() ? 1.0 : 0.0;
    default:
      return std::get<double>(v_);
  }
}

int Value::depth() const {
  if (is_list()) return list()->depth;
  if (is_dict()) return dict()->depth;
  return 0;
}

Result<Value> Value::List(std::vector<Value> items, ListKind kind, std::string view_name) {
  auto data = std::make_shared<ListData>();
  int d = 0;
  for (const Value& v : items) d = std::max(d, v.depth());
  if (d + 1 > kMaxValueDepth) return Errorf("value nesting exceeds {} levels", kMaxValueDepth);
  data->depth = d + 1;
  data->items = std::move(items);
  data->kind = kind;
  data->view_name = std::move(view_name);
  return Value(std::move(data));
}

Result<Value> Value::Dict(std::vector<std::pair<Value, Value>> entries) {
  auto data = std::make_shared<DictData>();
  int d = 0;
  for (const auto& [k, v] : entries) d = std::max(d, v.depth());
  if (d + 1 > kMaxValueDepth) return Errorf("value nesting exceeds {} levels", kMaxValueDepth);
  data->depth = d + 1;
  // Python dicts keep one entry per key (the first position, the last value).
  for (auto& [k, v] : entries) {
    bool found = false;
    for (auto& e : data->entries) {
      if (Equals(e.first, k)) {
        e.second = std::move(v);
        found = true;
        break;
      }
    }
    if (!found) data->entries.emplace_back(std::move(k), std::move(v));
  }
  return Value(std::move(data));
}

std::string TypeName(const Value& v) {
  switch (v.type()) {
    case Value::Type::kUndefined:
      return "Undefined";
    case Value::Type::kNone:
      return "NoneType";
    case Value::Type::kBool:
      return "bool";
    case Value::Type::kInt:
      return "int";
    case Value::Type::kFloat:
      return "float";
    case Value::Type::kString:
      return "str";
    case Value::Type::kList:
      switch (v.list()->kind) {
        case ListKind::kList:
          return "list";
        case ListKind::kTuple:
          return "tuple";
        case ListKind::kView:
          return v.list()->view_name;
        case ListKind::kIterator:
          return "generator";
      }
      return "list";
    case Value::Type::kDict:
      return "dict";
    case Value::Type::kNamespace:
      return "Namespace";
    case Value::Type::kCallable:
      return "function";
    case Value::Type::kLoop:
      return "LoopContext";
  }
  return "object";
}

bool Truthy(const Value& v) {
  switch (v.type()) {
    case Value::Type::kUndefined:
    case Value::Type::kNone:
      return false;
    case Value::Type::kBool:
      return v.as_bool();
    case Value::Type::kInt:
      return v.as_int() != 0;
    case Value::Type::kFloat:
      return v.as_double() != 0.0;
    case Value::Type::kString:
      return !v.as_string().empty();
    case Value::Type::kList:
      // Python generators are always true, whatever they would yield.
      if (v.list()->kind == ListKind::kIterator) return true;
      return !v.list()->items.empty();
    case Value::Type::kDict:
      return !v.dict()->entries.empty();
    default:
      return true;
  }
}

bool Equals(const Value& a, const Value& b) {
  if (a.is_number() && b.is_number()) {
    if (a.is_float() || b.is_float()) return a.as_double() == b.as_double();
    int64_t x = a.is_bool() ? a.as_bool() : a.as_int();
    int64_t y = b.is_bool() ? b.as_bool() : b.as_int();
    return x == y;
  }
  if (a.type() != b.type()) return false;
  switch (a.type()) {
    case Value::Type::kUndefined:
    case Value::Type::kNone:
      return true;
    case Value::Type::kString:
      return a.as_string() == b.as_string();
    case Value::Type::kList: {
      const ListData& x = *a.list();
      const ListData& y = *b.list();
      if (&x == &y) return true;
      if (x.kind == ListKind::kIterator || y.kind == ListKind::kIterator) return false;
      bool x_tuple = x.kind == ListKind::kTuple, y_tuple = y.kind == ListKind::kTuple;
      if (x_tuple != y_tuple || x.items.size() != y.items.size()) return false;
      for (size_t i = 0; i < x.items.size(); ++i)
        if (!Equals(x.items[i], y.items[i])) return false;
      return true;
    }
    case Value::Type::kDict: {
      const DictData& x = *a.dict();
      const DictData& y = *b.dict();
      if (x.entries.size() != y.entries.size()) return false;
      for (const auto& [k, v] : x.entries) {
        const Value* o = y.Find(k);
        if (!o || !Equals(v, *o)) return false;
      }
      return true;
    }
    case Value::Type::kNamespace:
      return a.ns() == b.ns();
    case Value::Type::kCallable:
      return a.fn() == b.fn();
    case Value::Type::kLoop:
      return a.loop() == b.loop();
    default:
      return false;
  }
}

Result<int> Compare(const Value& a, const Value& b) {
  if (a.is_number() && b.is_number()) {
    if (a.is_float() || b.is_float()) {
      double x = a.as_double(), y = b.as_double();
      return x < y ? -1 : (x > y ? 1 : 0);
    }
    int64_t x = a.is_bool() ? a.as_bool() : a.as_int();
    int64_t y = b.is_bool() ? b.as_bool() : b.as_int();
    return x < y ? -1 : (x > y ? 1 : 0);
  }
  if (a.is_string() && b.is_string()) {
    int c = a.as_string().compare(b.as_string());  // UTF-8 bytes order = code points
    return c < 0 ? -1 : (c > 0 ? 1 : 0);
  }
  if (a.is_list() && b.is_list() &&
      (a.list()->kind == ListKind::kTuple) == (b.list()->kind == ListKind::kTuple) &&
      a.list()->kind != ListKind::kIterator && b.list()->kind != ListKind::kIterator) {
    const auto& x = a.list()->items;
    const auto& y = b.list()->items;
    for (size_t i = 0; i < x.size() && i < y.size(); ++i) {
      if (Equals(x[i], y[i])) continue;
      return Compare(x[i], y[i]);
    }
    return x.size() < y.size() ? -1 : (x.size() > y.size() ? 1 : 0);
  }
  if (a.is_undefined() || b.is_undefined())
    return Error(a.is_undefined() && !a.undefined_hint().empty() ? a.undefined_hint()
                 : b.is_undefined() && !b.undefined_hint().empty()
                     ? b.undefined_hint()
                     : "cannot compare an undefined value");
  return Errorf("'<' not supported between instances of '{}' and '{}'", TypeName(a), TypeName(b));
}

namespace {

Status AppendRepr(const Value& v, std::string& out, bool top_level_str) {
  switch (v.type()) {
    case Value::Type::kUndefined:
      if (!top_level_str) out += "Undefined";
      return Status::Ok();
    case Value::Type::kNone:
      out += "None";
      return Status::Ok();
    case Value::Type::kBool:
      out += v.as_bool() ? "True" : "False";
      return Status::Ok();
    case Value::Type::kInt:
      out += std::to_string(v.as_int());
      return Status::Ok();
    case Value::Type::kFloat:
      out += pystr::FormatFloat(v.as_double());
      return Status::Ok();
    case Value::Type::kString:
      if (top_level_str)
        out += v.as_string();
      else
        out += pystr::Repr(v.as_string());
      return Status::Ok();
    case Value::Type::kList: {
      const ListData& l = *v.list();
      if (l.kind == ListKind::kIterator)
        return Error("cannot print a generator (Python prints its memory address); add |list");
      const char* open = "[";
      const char* close = "]";
      if (l.kind == ListKind::kTuple) {
        open = "(";
        close = ")";
      } else if (l.kind == ListKind::kView) {
        out += l.view_name;
        open = "([";
        close = "])";
      }
      out += open;
      for (size_t i = 0; i < l.items.size(); ++i) {
        if (i) out += ", ";
        LUMEN_RETURN_IF_ERROR(AppendRepr(l.items[i], out, false));
      }
      if (l.kind == ListKind::kTuple && l.items.size() == 1) out += ",";
      out += close;
      return Status::Ok();
    }
    case Value::Type::kDict: {
      out += "{";
      bool first = true;
      for (const auto& [k, val] : v.dict()->entries) {
        if (!first) out += ", ";
        first = false;
        LUMEN_RETURN_IF_ERROR(AppendRepr(k, out, false));
        out += ": ";
        LUMEN_RETURN_IF_ERROR(AppendRepr(val, out, false));
      }
      out += "}";
      return Status::Ok();
    }
    case Value::Type::kNamespace: {
      out += "<Namespace {";
      bool first = true;
      for (const auto& [k, val] : v.ns()->attrs) {
        if (!first) out += ", ";
        first = false;
        out += pystr::Repr(k);
        out += ": ";
        LUMEN_RETURN_IF_ERROR(AppendRepr(val, out, false));
      }
      out += "}>";
      return Status::Ok();
    }
    case Value::Type::kCallable:
      return Error("cannot print a function or method (Python prints its memory address)");
    case Value::Type::kLoop:
      return Error("cannot print the loop object");
  }
  return Status::Ok();
}

void AppendJsonString(std::string_view s, bool ensure_ascii, std::string& out) {
  out.push_back('"');
  char buf[16];
  if (!ensure_ascii) {
    for (char ch : s) {
      unsigned char c = static_cast<unsigned char>(ch);
      switch (c) {
        case '"':
          out += "\\\"";
          break;
        case '\\':
          out += "\\\\";
          break;
        case '\n':
          out += "\\n";
          break;
        case '\r':
          out += "\\r";
          break;
        case '\t':
          out += "\\t";
          break;
        case '\b':
          out += "\\b";
          break;
        case '\f':
          out += "\\f";
          break;
        default:
          if (c < 0x20) {
            std::snprintf(buf, sizeof(buf), "\\u%04x", c);
            out += buf;
          } else {
            out.push_back(ch);
          }
      }
    }
  } else {
    for (char32_t c : pystr::Decode(s)) {
      if (c == '"') {
        out += "\\\"";
      } else if (c == '\\') {
        out += "\\\\";
      } else if (c == '\n') {
        out += "\\n";
      } else if (c == '\r') {
        out += "\\r";
      } else if (c == '\t') {
        out += "\\t";
      } else if (c == '\b') {
        out += "\\b";
      } else if (c == '\f') {
        out += "\\f";
      } else if (c < 0x20 || c > 0x7E) {
        if (c >= 0x10000) {
          char32_t v = c - 0x10000;
          std::snprintf(buf, sizeof(buf), "\\u%04x\\u%04x", 0xD800 + (unsigned)(v >> 10),
                        0xDC00 + (unsigned)(v & 0x3FF));
        } else {
          std::snprintf(buf, sizeof(buf), "\\u%04x", static_cast<unsigned>(c));
        }
        out += buf;
      } else {
        out.push_back(static_cast<char>(c));
      }
    }
  }
  out.push_back('"');
}

std::string JsonFloat(double d) {
  if (std::isnan(d)) return "NaN";
  if (std::isinf(d)) return d > 0 ? "Infinity" : "-Infinity";
  return pystr::FormatFloat(d);
}

Status AppendJson(const Value& v, const JsonOptions& o, int level, std::string& out) {
  const std::string item_sep =
      o.separators ? o.separators->first : (o.indent ? std::string(",") : std::string(", "));
  const std::string key_sep = o.separators ? o.separators->second : std::string(": ");
  auto newline = [&](int lvl) {
    if (!o.indent) return;
    out.push_back('\n');
    for (int i = 0; i < lvl; ++i) out += *o.indent;
  };
  switch (v.type()) {
    case Value::Type::kNone:
      out += "null";
      return Status::Ok();
    case Value::Type::kBool:
      out += v.as_bool() ? "true" : "false";
      return Status::Ok();
    case Value::Type::kInt:
      out += std::to_string(v.as_int());
      return Status::Ok();
    case Value::Type::kFloat:
      out += JsonFloat(v.as_double());
      return Status::Ok();
    case Value::Type::kString:
      AppendJsonString(v.as_string(), o.ensure_ascii, out);
      return Status::Ok();
    case Value::Type::kList: {
      const ListData& l = *v.list();
      if (l.kind == ListKind::kIterator || l.kind == ListKind::kView)
        return Errorf("Object of type {} is not JSON serializable", TypeName(v));
      if (l.items.empty()) {
        out += "[]";
        return Status::Ok();
      }
      out += "[";
      for (size_t i = 0; i < l.items.size(); ++i) {
        if (i) out += item_sep;
        newline(level + 1);
        LUMEN_RETURN_IF_ERROR(AppendJson(l.items[i], o, level + 1, out));
      }
      newline(level);
      out += "]";
      return Status::Ok();
    }
    case Value::Type::kDict: {
      const auto& entries = v.dict()->entries;
      if (entries.empty()) {
        out += "{}";
        return Status::Ok();
      }
      std::vector<const std::pair<Value, Value>*> order;
      for (const auto& e : entries) order.push_back(&e);
      if (o.sort_keys) {
        for (const auto* e : order)
          if (!e->first.is_string())
            return Error("json.dumps(sort_keys=True) is only supported for string keys");
        std::stable_sort(order.begin(), order.end(), [](const auto* a, const auto* b) {
          return a->first.as_string() < b->first.as_string();
        });
      }
      out += "{";
      bool first = true;
      for (const auto* e : order) {
        if (!first) out += item_sep;
        first = false;
        newline(level + 1);
        const Value& k = e->first;
        if (k.is_string()) {
          AppendJsonString(k.as_string(), o.ensure_ascii, out);
        } else if (k.is_bool()) {
          out += k.as_bool() ? "\"true\"" : "\"false\"";
        } else if (k.is_int()) {
          out += "\"" + std::to_string(k.as_int()) + "\"";
        } else if (k.is_float()) {
          out += "\"" + JsonFloat(k.as_double()) + "\"";
        } else if (k.is_none()) {
          out += "\"null\"";
        } else {
          return Errorf("keys must be str, int, float, bool or None, not {}", TypeName(k));
        }
        out += key_sep;
        LUMEN_RETURN_IF_ERROR(AppendJson(e->second, o, level + 1, out));
      }
      newline(level);
      out += "}";
      return Status::Ok();
    }
    default:
      return Errorf("Object of type {} is not JSON serializable", TypeName(v));
  }
}

Result<Value> FromJsonAt(const nlohmann::ordered_json& j, int depth) {
  if (depth > kMaxValueDepth) return Errorf("JSON nesting exceeds {} levels", kMaxValueDepth);
  switch (j.type()) {
    case nlohmann::ordered_json::value_t::null:
      return Value::None();
    case nlohmann::ordered_json::value_t::boolean:
      return Value::Bool(j.get<bool>());
    case nlohmann::ordered_json::value_t::number_integer:
      return Value::Int(j.get<int64_t>());
    case nlohmann::ordered_json::value_t::number_unsigned: {
      uint64_t u = j.get<uint64_t>();
      if (u > static_cast<uint64_t>(INT64_MAX)) return Errorf("integer {} is too large", u);
      return Value::Int(static_cast<int64_t>(u));
    }
    case nlohmann::ordered_json::value_t::number_float:
      return Value::Float(j.get<double>());
    case nlohmann::ordered_json::value_t::string:
      return Value::Str(j.get<std::string>());
    case nlohmann::ordered_json::value_t::array: {
      std::vector<Value> items;
      items.reserve(j.size());
      for (const auto& e : j) {
        LUMEN_ASSIGN_OR_RETURN(Value v, FromJsonAt(e, depth + 1));
        items.push_back(std::move(v));
      }
      return Value::List(std::move(items));
    }
    case nlohmann::ordered_json::value_t::object: {
      std::vector<std::pair<Value, Value>> entries;
      entries.reserve(j.size());
      for (auto it = j.begin(); it != j.end(); ++it) {
        LUMEN_ASSIGN_OR_RETURN(Value v, FromJsonAt(it.value(), depth + 1));
        entries.emplace_back(Value::Str(it.key()), std::move(v));
      }
      // Keys of a JSON object are already unique; skip the dedup scan.
      auto data = std::make_shared<DictData>();
      int d = 0;
      for (const auto& e : entries) d = std::max(d, e.second.depth());
      data->depth = d + 1;
      data->entries = std::move(entries);
      if (data->depth > kMaxValueDepth)
        return Errorf("JSON nesting exceeds {} levels", kMaxValueDepth);
      LUMEN_ASSIGN_OR_RETURN(Value out, Value::Dict({}));
      *out.dict() = std::move(*data);
      return out;
    }
    case nlohmann::ordered_json::value_t::binary:
      return Error("binary JSON values are not supported");
    case nlohmann::ordered_json::value_t::discarded:
      return Error("discarded JSON value");
  }
  return Error("unknown JSON value");
}

}  // namespace

Result<std::string> ToStr(const Value& v) {
  std::string out;
  LUMEN_RETURN_IF_ERROR(AppendRepr(v, out, true));
  return out;
}

Result<std::string> Repr(const Value& v) {
  std::string out;
  LUMEN_RETURN_IF_ERROR(AppendRepr(v, out, false));
  return out;
}

Status ToJson(const Value& v, const JsonOptions& options, std::string& out) {
  return AppendJson(v, options, 0, out);
}

Result<Value> FromJson(const nlohmann::ordered_json& j) { return FromJsonAt(j, 0); }

}  // namespace lumen::tokenize
