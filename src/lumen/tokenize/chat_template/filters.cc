// Jinja2 filters and tests for the chat-template interpreter (the subset that
// parser.cc accepts), with Hugging Face's tojson override.
#include <algorithm>
#include <cmath>

#include "lumen/tokenize/chat_template/interpreter.h"
#include "lumen/tokenize/chat_template/parser.h"
#include "lumen/tokenize/chat_template/pystr.h"

namespace lumen::tokenize {
namespace {

bool IsIntLike(const Value& v) { return v.is_int() || v.is_bool(); }
int64_t IntOf(const Value& v) { return v.is_bool() ? (v.as_bool() ? 1 : 0) : v.as_int(); }

Status UndefinedError(const Value& v) {
  if (!v.undefined_hint().empty()) return Error(v.undefined_hint());
  return Error("value is undefined");
}

struct Param {
  const char* name;
  std::optional<Value> def;
};
// Binds filter arguments after the subject, Python-style.
Result<std::vector<Value>> Bind(std::string_view fname, const CallArgs& args,
                                std::initializer_list<Param> params) {
  std::vector<Param> ps(params);
  if (args.pos.size() > ps.size())
    return Errorf("filter '{}' takes at most {} argument(s) ({} given)", fname, ps.size(),
                  args.pos.size());
  std::vector<std::optional<Value>> out(ps.size());
  for (size_t i = 0; i < args.pos.size(); ++i) out[i] = args.pos[i];
  for (const auto& [k, v] : args.kw) {
    size_t i = 0;
    while (i < ps.size() && k != ps[i].name) ++i;
    if (i == ps.size())
      return Errorf("filter '{}' got an unexpected keyword argument '{}'", fname, k);
    if (out[i]) return Errorf("filter '{}' got multiple values for argument '{}'", fname, k);
    out[i] = v;
  }
  std::vector<Value> r;
  for (size_t i = 0; i < ps.size(); ++i) {
    if (!out[i] && !ps[i].def)
      return Errorf("filter '{}' missing argument '{}'", fname, ps[i].name);
    r.push_back(out[i] ? *out[i] : *ps[i].def);
  }
  return r;
}

// Jinja's soft_str: str(value); undefined is "".
Result<std::string> SoftStr(const Value& v) { return ToStr(v); }

Result<Value> Iterator(std::vector<Value> items) {
  return Value::List(std::move(items), ListKind::kIterator);
}

// Sort key for case-insensitive comparisons (Jinja's ignore_case).
Value IgnoreCase(const Value& v, bool case_sensitive) {
  if (!case_sensitive && v.is_string()) return Value::Str(pystr::Lower(v.as_string()));
  return v;
}

}  // namespace

Result<Value> Interpreter::ApplyFilter(const std::string& name, const Value& v, CallArgs args,
                                       const Expr* at) {
  LUMEN_RETURN_IF_ERROR(Charge(1));
  // make_attrgetter: "a.b.0" walks items with the sandbox's getitem.
  auto attr_get = [this](const Value& item, const Value& attribute) -> Result<Value> {
    std::vector<Value> parts;
    if (attribute.is_string()) {
      for (const auto& p : pystr::Split(attribute.as_string(), std::string("."), -1)) {
        bool digits = !p.empty() &&
                      std::all_of(p.begin(), p.end(), [](char c) { return c >= '0' && c <= '9'; });
        parts.push_back(digits ? Value::Int(std::stoll(p)) : Value::Str(p));
      }
    } else {
      parts.push_back(attribute);
    }
    Value cur = item;
    for (const auto& p : parts) {
      LUMEN_ASSIGN_OR_RETURN(cur, GetItem(cur, p));
    }
    return cur;
  };

  if (name == "tojson") {
    LUMEN_ASSIGN_OR_RETURN(auto a, Bind(name, args,
                                        {{"ensure_ascii", Value::Bool(false)},
                                         {"indent", Value::None()},
                                         {"separators", Value::None()},
                                         {"sort_keys", Value::Bool(false)}}));
    JsonOptions o;
    o.ensure_ascii = Truthy(a[0]);
    if (IsIntLike(a[1])) {
      int64_t n = IntOf(a[1]);
      if (n > 64) return Error("tojson indent too large");
      o.indent = std::string(static_cast<size_t>(std::max<int64_t>(0, n)), ' ');
    } else if (a[1].is_string()) {
      o.indent = a[1].as_string();
    } else if (!a[1].is_none()) {
      return Error("tojson indent must be an int, str or None");
    }
    if (!a[2].is_none()) {
      if (!a[2].is_list() || a[2].list()->items.size() != 2 || !a[2].list()->items[0].is_string() ||
          !a[2].list()->items[1].is_string())
        return Error("tojson separators must be a pair of strings");
      o.separators = {a[2].list()->items[0].as_string(), a[2].list()->items[1].as_string()};
    }
    o.sort_keys = Truthy(a[3]);
    std::string out;
    LUMEN_RETURN_IF_ERROR(ToJson(v, o, out));
    LUMEN_RETURN_IF_ERROR(CheckString(out.size()));
    return Value::Str(std::move(out));
  }
  if (name == "trim") {
    LUMEN_ASSIGN_OR_RETURN(auto a, Bind(name, args, {{"chars", Value::None()}}));
    LUMEN_ASSIGN_OR_RETURN(std::string s, SoftStr(v));
    std::optional<std::string> chars;
    if (a[0].is_string()) chars = a[0].as_string();
    return Value::Str(pystr::Strip(s, chars, true, true));
  }
  if (name == "upper" || name == "lower" || name == "capitalize" || name == "title" ||
      name == "string" || name == "safe" || name == "escape" || name == "e" ||
      name == "forceescape") {
    LUMEN_RETURN_IF_ERROR(Bind(name, args, {}).status());
    LUMEN_ASSIGN_OR_RETURN(std::string s, SoftStr(v));
    if (name == "upper") return Value::Str(pystr::Upper(s));
    if (name == "lower") return Value::Str(pystr::Lower(s));
    if (name == "capitalize") return Value::Str(pystr::Capitalize(s));
    if (name == "title") return Value::Str(pystr::JinjaTitle(s));
    if (name == "escape" || name == "e" || name == "forceescape") {
      std::string out;
      for (char c : s) {
        switch (c) {
          case '&':
            out += "&amp;";
            break;
          case '<':
            out += "&lt;";
            break;
          case '>':
            out += "&gt;";
            break;
          case '"':
            out += "&#34;";
            break;
          case '\'':
            out += "&#39;";
            break;
          default:
            out.push_back(c);
        }
      }
      return Value::Str(std::move(out));
    }
    if (v.is_string()) return v;
    return Value::Str(std::move(s));
  }
  if (name == "length" || name == "count") {
    switch (v.type()) {
      case Value::Type::kUndefined:
        return Value::Int(0);
      case Value::Type::kString:
        return Value::Int(static_cast<int64_t>(pystr::Length(v.as_string())));
      case Value::Type::kList:
        if (v.list()->kind == ListKind::kIterator)
          return Error("object of type 'generator' has no len()");
        return Value::Int(static_cast<int64_t>(v.list()->items.size()));
      case Value::Type::kDict:
        return Value::Int(static_cast<int64_t>(v.dict()->entries.size()));
      case Value::Type::kLoop:
        return Value::Int(static_cast<int64_t>(v.loop()->items->items.size()));
      default:
        return Errorf("object of type '{}' has no len()", TypeName(v));
    }
  }
  if (name == "default" || name == "d") {
    LUMEN_ASSIGN_OR_RETURN(
        auto a,
        Bind(name, args, {{"default_value", Value::Str("")}, {"boolean", Value::Bool(false)}}));
    if (v.is_undefined() || (Truthy(a[1]) && !Truthy(v))) return a[0];
    return v;
  }
  if (name == "items") {
    LUMEN_RETURN_IF_ERROR(Bind(name, args, {}).status());
    if (v.is_undefined()) return Iterator({});
    if (!v.is_dict()) return Error("Can only get item pairs from a mapping.");
    std::vector<Value> out;
    for (const auto& [k, val] : v.dict()->entries) {
      LUMEN_ASSIGN_OR_RETURN(Value t, Value::List({k, val}, ListKind::kTuple));
      out.push_back(std::move(t));
    }
    return Iterator(std::move(out));
  }
  if (name == "list") {
    LUMEN_RETURN_IF_ERROR(Bind(name, args, {}).status());
    LUMEN_ASSIGN_OR_RETURN(auto items, Iterate(v));
    return Value::List(std::move(items));
  }
  if (name == "first") {
    LUMEN_RETURN_IF_ERROR(Bind(name, args, {}).status());
    if (v.is_list() && v.list()->kind == ListKind::kIterator) {
      ListData& l = *v.list();
      if (l.pos >= l.items.size()) return Value::Undef("No first item, sequence was empty.");
      return l.items[l.pos++];
    }
    LUMEN_ASSIGN_OR_RETURN(auto items, Iterate(v));
    if (items.empty()) return Value::Undef("No first item, sequence was empty.");
    return items.front();
  }
  if (name == "last") {
    LUMEN_RETURN_IF_ERROR(Bind(name, args, {}).status());
    if (v.is_list() && v.list()->kind == ListKind::kIterator)
      return Error("'generator' object is not reversible");
    LUMEN_ASSIGN_OR_RETURN(auto items, Iterate(v));
    if (items.empty()) return Value::Undef("No last item, sequence was empty.");
    return items.back();
  }
  if (name == "join") {
    LUMEN_ASSIGN_OR_RETURN(auto a,
                           Bind(name, args, {{"d", Value::Str("")}, {"attribute", Value::None()}}));
    LUMEN_ASSIGN_OR_RETURN(auto items, Iterate(v));
    LUMEN_ASSIGN_OR_RETURN(std::string sep, SoftStr(a[0]));
    std::string out;
    for (size_t i = 0; i < items.size(); ++i) {
      Value item = items[i];
      if (!a[1].is_none()) {
        LUMEN_ASSIGN_OR_RETURN(item, attr_get(item, a[1]));
      }
      LUMEN_ASSIGN_OR_RETURN(std::string s, SoftStr(item));
      if (i) out += sep;
      out += s;
      LUMEN_RETURN_IF_ERROR(CheckString(out.size()));
    }
    return Value::Str(std::move(out));
  }
  if (name == "replace") {
    LUMEN_ASSIGN_OR_RETURN(
        auto a,
        Bind(name, args, {{"old", std::nullopt}, {"new", std::nullopt}, {"count", Value::None()}}));
    LUMEN_ASSIGN_OR_RETURN(std::string s, SoftStr(v));
    LUMEN_ASSIGN_OR_RETURN(std::string o, SoftStr(a[0]));
    LUMEN_ASSIGN_OR_RETURN(std::string n, SoftStr(a[1]));
    int64_t count = -1;
    if (!a[2].is_none()) {
      if (!IsIntLike(a[2])) return Error("replace count must be an integer");
      count = IntOf(a[2]);
    }
    std::string r = pystr::Replace(s, o, n, count);
    LUMEN_RETURN_IF_ERROR(CheckString(r.size()));
    return Value::Str(std::move(r));
  }
  if (name == "indent") {
    LUMEN_ASSIGN_OR_RETURN(auto a, Bind(name, args,
                                        {{"width", Value::Int(4)},
                                         {"first", Value::Bool(false)},
                                         {"blank", Value::Bool(false)}}));
    if (v.is_undefined()) return UndefinedError(v);
    if (!v.is_string()) return Errorf("indent expects a string, got '{}'", TypeName(v));
    std::string ind;
    if (a[0].is_string()) {
      ind = a[0].as_string();
    } else if (IsIntLike(a[0])) {
      int64_t w = IntOf(a[0]);
      if (w > 1024) return Error("indent width too large");
      ind = std::string(static_cast<size_t>(std::max<int64_t>(0, w)), ' ');
    } else {
      return Error("indent width must be an int or str");
    }
    auto lines = pystr::SplitLines(v.as_string() + "\n", false);
    std::string rv;
    if (Truthy(a[2])) {
      for (size_t i = 0; i < lines.size(); ++i) {
        if (i) rv += "\n" + ind;
        rv += lines[i];
      }
    } else {
      rv = lines.empty() ? "" : lines[0];
      for (size_t i = 1; i < lines.size(); ++i) {
        rv += "\n";
        if (!lines[i].empty()) rv += ind;
        rv += lines[i];
      }
    }
    if (Truthy(a[1])) rv = ind + rv;
    LUMEN_RETURN_IF_ERROR(CheckString(rv.size()));
    return Value::Str(std::move(rv));
  }
  if (name == "int") {
    LUMEN_ASSIGN_OR_RETURN(
        auto a, Bind(name, args, {{"default", Value::Int(0)}, {"base", Value::Int(10)}}));
    if (v.is_undefined()) return UndefinedError(v);
    if (IsIntLike(v)) return Value::Int(IntOf(v));
    if (v.is_float()) {
      double d = v.as_double();
      if (!std::isfinite(d) || std::fabs(d) >= 9.2e18) return a[0];
      return Value::Int(static_cast<int64_t>(std::trunc(d)));
    }
    if (v.is_string()) {
      int base = IsIntLike(a[1]) ? static_cast<int>(IntOf(a[1])) : 10;
      if (base < 2 || base > 36) return Error("int() base must be >= 2 and <= 36");
      if (auto i = pystr::ParseInt(v.as_string(), base)) return Value::Int(*i);
      if (auto d = pystr::ParseFloat(v.as_string())) {
        if (std::isfinite(*d) && std::fabs(*d) < 9.2e18)
          return Value::Int(static_cast<int64_t>(std::trunc(*d)));
      }
    }
    return a[0];
  }
  if (name == "float") {
    LUMEN_ASSIGN_OR_RETURN(auto a, Bind(name, args, {{"default", Value::Float(0.0)}}));
    if (v.is_undefined()) return UndefinedError(v);
    if (v.is_number()) return Value::Float(v.as_double());
    if (v.is_string()) {
      if (auto d = pystr::ParseFloat(v.as_string())) return Value::Float(*d);
    }
    return a[0];
  }
  if (name == "abs") {
    LUMEN_RETURN_IF_ERROR(Bind(name, args, {}).status());
    if (IsIntLike(v)) {
      int64_t i = IntOf(v);
      if (i == INT64_MIN) return Error("integer overflow");
      return Value::Int(i < 0 ? -i : i);
    }
    if (v.is_float()) return Value::Float(std::fabs(v.as_double()));
    if (v.is_undefined()) return UndefinedError(v);
    return Errorf("bad operand type for abs(): '{}'", TypeName(v));
  }
  if (name == "round") {
    LUMEN_ASSIGN_OR_RETURN(
        auto a, Bind(name, args, {{"precision", Value::Int(0)}, {"method", Value::Str("common")}}));
    if (!IsIntLike(a[0])) return Error("round precision must be an integer");
    int64_t p = IntOf(a[0]);
    if (!a[1].is_string() ||
        (a[1].as_string() != "common" && a[1].as_string() != "ceil" && a[1].as_string() != "floor"))
      return Error("method must be common, ceil or floor");
    if (v.is_undefined()) return UndefinedError(v);
    if (!v.is_number()) return Errorf("type {} doesn't define __round__ method", TypeName(v));
    const std::string& m = a[1].as_string();
    if (m == "common") {
      if (IsIntLike(v)) {
        if (p >= 0) return Value::Int(IntOf(v));
        return Error("round() of an int with negative precision is not supported");
      }
      return Value::Float(pystr::RoundFloat(v.as_double(), p));
    }
    double scale = std::pow(10.0, static_cast<double>(p));
    double x = v.as_double() * scale;
    return Value::Float((m == "ceil" ? std::ceil(x) : std::floor(x)) / scale);
  }
  if (name == "center") {
    LUMEN_ASSIGN_OR_RETURN(auto a, Bind(name, args, {{"width", Value::Int(80)}}));
    LUMEN_ASSIGN_OR_RETURN(std::string s, SoftStr(v));
    auto c = std::make_shared<Callable>();
    c->type = Callable::Type::kMethod;
    c->name = "center";
    c->receiver = Value::Str(std::move(s));
    CallArgs ca;
    ca.pos.push_back(a[0]);
    return CallMethod(*c, ca);
  }
  if (name == "reverse") {
    LUMEN_RETURN_IF_ERROR(Bind(name, args, {}).status());
    if (v.is_string()) {
      std::u32string u = pystr::Decode(v.as_string());
      std::reverse(u.begin(), u.end());
      return Value::Str(pystr::Encode(u));
    }
    bool is_gen = v.is_list() && v.list()->kind == ListKind::kIterator;
    LUMEN_ASSIGN_OR_RETURN(auto items, Iterate(v));
    std::reverse(items.begin(), items.end());
    if (is_gen) return Value::List(std::move(items));
    return Iterator(std::move(items));
  }
  if (name == "map" || name == "select" || name == "reject" || name == "selectattr" ||
      name == "rejectattr") {
    std::vector<Value> out;
    if (!Truthy(v)) return Iterator({});
    LUMEN_ASSIGN_OR_RETURN(auto items, Iterate(v));
    if (name == "map") {
      if (args.pos.empty()) {
        Value attribute, def = Value::None();
        bool has_attr = false;
        for (const auto& [k, val] : args.kw) {
          if (k == "attribute") {
            attribute = val;
            has_attr = true;
          } else if (k == "default") {
            def = val;
          } else {
            return Errorf("Unexpected keyword argument '{}'", k);
          }
        }
        if (!has_attr) return Error("map requires a filter argument");
        for (const auto& item : items) {
          LUMEN_ASSIGN_OR_RETURN(Value r, attr_get(item, attribute));
          out.push_back(r.is_undefined() && !def.is_none() ? def : r);
        }
        return Iterator(std::move(out));
      }
      if (!args.pos[0].is_string()) return Error("map filter name must be a string");
      std::string fname = args.pos[0].as_string();
      if (!IsSupportedFilter(fname)) return Errorf("no filter named '{}'", fname);
      CallArgs rest;
      rest.pos.assign(args.pos.begin() + 1, args.pos.end());
      rest.kw = args.kw;
      for (const auto& item : items) {
        LUMEN_ASSIGN_OR_RETURN(Value r, ApplyFilter(fname, item, rest, at));
        out.push_back(std::move(r));
      }
      return Iterator(std::move(out));
    }
    bool attr_mode = name == "selectattr" || name == "rejectattr";
    bool select = name == "select" || name == "selectattr";
    size_t off = 0;
    Value attribute;
    if (attr_mode) {
      if (args.pos.empty()) return Error("Missing parameter for attribute name");
      attribute = args.pos[0];
      off = 1;
    }
    std::optional<std::string> test;
    CallArgs rest;
    if (args.pos.size() > off) {
      if (!args.pos[off].is_string()) return Error("test name must be a string");
      test = args.pos[off].as_string();
      if (!IsSupportedTest(*test)) return Errorf("no test named '{}'", *test);
      rest.pos.assign(args.pos.begin() + off + 1, args.pos.end());
      rest.kw = args.kw;
    }
    for (const auto& item : items) {
      Value x = item;
      if (attr_mode) {
        LUMEN_ASSIGN_OR_RETURN(x, attr_get(item, attribute));
      }
      bool r;
      if (test) {
        LUMEN_ASSIGN_OR_RETURN(r, ApplyTest(*test, x, rest));
      } else {
        r = Truthy(x);
      }
      if (r == select) out.push_back(item);
    }
    return Iterator(std::move(out));
  }
  if (name == "unique") {
    LUMEN_ASSIGN_OR_RETURN(
        auto a,
        Bind(name, args, {{"case_sensitive", Value::Bool(false)}, {"attribute", Value::None()}}));
    LUMEN_ASSIGN_OR_RETURN(auto items, Iterate(v));
    std::vector<Value> seen, out;
    for (const auto& item : items) {
      Value key = item;
      if (!a[1].is_none()) {
        LUMEN_ASSIGN_OR_RETURN(key, attr_get(item, a[1]));
      }
      key = IgnoreCase(key, Truthy(a[0]));
      if (key.is_list() || key.is_dict()) return Errorf("unhashable type: '{}'", TypeName(key));
      bool dup =
          std::any_of(seen.begin(), seen.end(), [&](const Value& s) { return Equals(s, key); });
      if (dup) continue;
      seen.push_back(key);
      out.push_back(item);
    }
    return Iterator(std::move(out));
  }
  if (name == "sort" || name == "dictsort" || name == "min" || name == "max") {
    std::vector<Value> items;
    bool reverse = false, case_sensitive = false;
    Value attribute = Value::None();
    int by_value = 0;
    if (name == "dictsort") {
      LUMEN_ASSIGN_OR_RETURN(auto a, Bind(name, args,
                                          {{"case_sensitive", Value::Bool(false)},
                                           {"by", Value::Str("key")},
                                           {"reverse", Value::Bool(false)}}));
      case_sensitive = Truthy(a[0]);
      reverse = Truthy(a[2]);
      if (!a[1].is_string() || (a[1].as_string() != "key" && a[1].as_string() != "value"))
        return Error("You can only sort by either 'key' or 'value'");
      by_value = a[1].as_string() == "value" ? 1 : 0;
      if (!v.is_dict()) return Error("dictsort expects a mapping");
      for (const auto& [k, val] : v.dict()->entries) {
        LUMEN_ASSIGN_OR_RETURN(Value t, Value::List({k, val}, ListKind::kTuple));
        items.push_back(std::move(t));
      }
    } else if (name == "sort") {
      LUMEN_ASSIGN_OR_RETURN(auto a, Bind(name, args,
                                          {{"reverse", Value::Bool(false)},
                                           {"case_sensitive", Value::Bool(false)},
                                           {"attribute", Value::None()}}));
      reverse = Truthy(a[0]);
      case_sensitive = Truthy(a[1]);
      attribute = a[2];
      LUMEN_ASSIGN_OR_RETURN(items, Iterate(v));
    } else {
      LUMEN_ASSIGN_OR_RETURN(
          auto a,
          Bind(name, args, {{"case_sensitive", Value::Bool(false)}, {"attribute", Value::None()}}));
      case_sensitive = Truthy(a[0]);
      attribute = a[1];
      LUMEN_ASSIGN_OR_RETURN(items, Iterate(v));
    }
    std::vector<Value> keys;
    for (const auto& item : items) {
      Value k = item;
      if (name == "dictsort") k = item.list()->items[by_value];
      if (!attribute.is_none()) {
        LUMEN_ASSIGN_OR_RETURN(k, attr_get(item, attribute));
      }
      keys.push_back(IgnoreCase(k, case_sensitive));
    }
    LUMEN_RETURN_IF_ERROR(Charge(static_cast<int64_t>(items.size()) * 8));
    std::vector<size_t> order(items.size());
    for (size_t i = 0; i < order.size(); ++i) order[i] = i;
    Status err;
    std::stable_sort(order.begin(), order.end(), [&](size_t x, size_t y) {
      if (!err.ok()) return false;
      auto c = reverse ? Compare(keys[y], keys[x]) : Compare(keys[x], keys[y]);
      if (!c.ok()) {
        err = c.status();
        return false;
      }
      return *c < 0;
    });
    LUMEN_RETURN_IF_ERROR(err);
    if (name == "min" || name == "max") {
      if (order.empty())
        return Value::Undef(fmt::format("No aggregated item, sequence was empty."));
      // Python's min/max return the first of equal extremes.
      size_t pick = order.front();
      if (name == "max") {
        pick = order.back();
        for (size_t i : order)
          if (Equals(keys[i], keys[pick])) {
            pick = i;
            break;
          }
      }
      return items[pick];
    }
    std::vector<Value> out;
    for (size_t i : order) out.push_back(items[i]);
    return Value::List(std::move(out));
  }
  if (name == "sum") {
    LUMEN_ASSIGN_OR_RETURN(
        auto a, Bind(name, args, {{"attribute", Value::None()}, {"start", Value::Int(0)}}));
    LUMEN_ASSIGN_OR_RETURN(auto items, Iterate(v));
    Value total = a[1];
    Expr plus;
    plus.kind = Expr::Kind::kBinary;
    plus.name = "+";
    for (const auto& item : items) {
      Value x = item;
      if (!a[0].is_none()) {
        LUMEN_ASSIGN_OR_RETURN(x, attr_get(item, a[0]));
      }
      LUMEN_ASSIGN_OR_RETURN(total, EvalBinary(plus, total, x));
    }
    return total;
  }
  if (name == "attr") {
    LUMEN_ASSIGN_OR_RETURN(auto a, Bind(name, args, {{"name", std::nullopt}}));
    if (!a[0].is_string()) return Error("attribute name must be a string");
    if (v.is_dict()) {
      // attr() never falls back to item lookup; only dict methods are attributes.
      LUMEN_ASSIGN_OR_RETURN(Value r, GetAttr(v, a[0].as_string()));
      if (r.is_callable()) return r;
      return Value::Undef(fmt::format("'dict object' has no attribute '{}'", a[0].as_string()));
    }
    return GetAttr(v, a[0].as_string());
  }
  return Errorf("unsupported construct: filter '{}'", name);
}

Result<bool> Interpreter::ApplyTest(const std::string& name, const Value& v, CallArgs args) {
  LUMEN_RETURN_IF_ERROR(Charge(1));
  auto arg = [&](size_t i) -> Result<Value> {
    if (i < args.pos.size()) return args.pos[i];
    if (!args.kw.empty()) return args.kw[0].second;
    return Errorf("test '{}' needs an argument", name);
  };
  if (name == "defined") return !v.is_undefined();
  if (name == "undefined") return v.is_undefined();
  if (name == "none") return v.is_none();
  if (name == "boolean") return v.is_bool();
  if (name == "true") return v.is_bool() && v.as_bool();
  if (name == "false") return v.is_bool() && !v.as_bool();
  if (name == "integer") return v.is_int();
  if (name == "float") return v.is_float();
  if (name == "number") return v.is_number();
  if (name == "string") return v.is_string();
  if (name == "mapping") return v.is_dict();
  // Undefined defines __call__ (to raise), so Python's callable() says true.
  if (name == "callable") return v.is_callable() || v.is_undefined();
  if (name == "escaped") return false;
  if (name == "iterable")
    return v.is_undefined() || v.is_string() || v.is_list() || v.is_dict() || v.is_loop();
  if (name == "sequence")
    return v.is_undefined() || v.is_string() || v.is_dict() ||
           (v.is_list() && v.list()->kind != ListKind::kIterator &&
            v.list()->kind != ListKind::kView) ||
           v.is_loop();
  if (name == "lower" || name == "upper") {
    LUMEN_ASSIGN_OR_RETURN(std::string s, ToStr(v));
    return name == "lower" ? pystr::IsLowerCase(s) : pystr::IsUpperCase(s);
  }
  if (name == "odd" || name == "even" || name == "divisibleby") {
    Value d = Value::Int(2);
    if (name == "divisibleby") {
      LUMEN_ASSIGN_OR_RETURN(d, arg(0));
    }
    if (v.is_undefined()) return UndefinedError(v);
    if (!v.is_number() || !d.is_number())
      return Errorf("unsupported operand type(s) for %: '{}' and '{}'", TypeName(v), TypeName(d));
    Expr mod;
    mod.kind = Expr::Kind::kBinary;
    mod.name = "%";
    LUMEN_ASSIGN_OR_RETURN(Value r, EvalBinary(mod, v, d));
    if (name == "odd") return Equals(r, Value::Int(1));
    return Equals(r, Value::Int(0));
  }
  if (name == "sameas") {
    LUMEN_ASSIGN_OR_RETURN(Value o, arg(0));
    if (v.type() != o.type()) return false;
    if (v.is_none() || v.is_undefined()) return true;
    if (v.is_bool()) return v.as_bool() == o.as_bool();
    if (v.is_list()) return v.list() == o.list();
    if (v.is_dict()) return v.dict() == o.dict();
    return Equals(v, o);
  }
  if (name == "in") {
    LUMEN_ASSIGN_OR_RETURN(Value o, arg(0));
    LUMEN_ASSIGN_OR_RETURN(Value r, Contains(o, v));
    return r.as_bool();
  }
  if (name == "filter" || name == "test") {
    LUMEN_ASSIGN_OR_RETURN(Value o, arg(0));
    if (!o.is_string()) return false;
    return name == "filter" ? IsSupportedFilter(o.as_string()) : IsSupportedTest(o.as_string());
  }
  LUMEN_ASSIGN_OR_RETURN(Value o, arg(0));
  if (name == "==" || name == "eq" || name == "equalto") return Equals(v, o);
  if (name == "!=" || name == "ne") return !Equals(v, o);
  LUMEN_ASSIGN_OR_RETURN(int c, Compare(v, o));
  if (name == ">" || name == "gt" || name == "greaterthan") return c > 0;
  if (name == ">=" || name == "ge") return c >= 0;
  if (name == "<" || name == "lt" || name == "lessthan") return c < 0;
  if (name == "<=" || name == "le") return c <= 0;
  return Errorf("unsupported construct: test '{}'", name);
}

}  // namespace lumen::tokenize
