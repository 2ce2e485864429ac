// Attribute/item access, methods, globals, filters and tests of the
// chat-template interpreter, each following Jinja2 3.1 / Python semantics.
#include <algorithm>
#include <array>
#include <cmath>
#include <ctime>

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

constexpr std::array<std::string_view, 47> kStrMethods = {
    "capitalize",   "casefold",    "center",    "count",      "encode",       "endswith",
    "expandtabs",   "find",        "format",    "format_map", "index",        "isalnum",
    "isalpha",      "isascii",     "isdecimal", "isdigit",    "isidentifier", "islower",
    "isnumeric",    "isprintable", "isspace",   "istitle",    "isupper",      "join",
    "ljust",        "lower",       "lstrip",    "maketrans",  "partition",    "removeprefix",
    "removesuffix", "replace",     "rfind",     "rindex",     "rjust",        "rpartition",
    "rsplit",       "rstrip",      "split",     "splitlines", "startswith",   "strip",
    "swapcase",     "title",       "translate", "upper",      "zfill"};
constexpr std::array<std::string_view, 11> kDictMethods = {
    "clear", "copy",    "fromkeys",   "get",    "items", "keys",
    "pop",   "popitem", "setdefault", "update", "values"};
constexpr std::array<std::string_view, 11> kListMethods = {"append", "clear",   "copy",   "count",
                                                           "extend", "index",   "insert", "pop",
                                                           "remove", "reverse", "sort"};
constexpr std::array<std::string_view, 8> kUnsafeMethods = {
    "clear", "pop", "popitem", "setdefault", "update", "append", "extend", "insert"};

template <size_t N>
bool In(const std::array<std::string_view, N>& a, std::string_view s) {
  return std::find(a.begin(), a.end(), s) != a.end();
}

Value Method(const Value& receiver, std::string_view name) {
  auto c = std::make_shared<Callable>();
  c->type = Callable::Type::kMethod;
  c->name = name;
  c->receiver = receiver;
  return Value::Fn(std::move(c));
}

Value Unsafe(const Value& obj, std::string_view name) {
  return Value::Undef(
      fmt::format("access to attribute '{}' of '{}' object is unsafe.", name, TypeName(obj)));
}

Value NoAttr(const Value& obj, std::string_view name) {
  return Value::Undef(fmt::format("'{}' has no attribute '{}'",
                                  obj.is_none() ? "None" : TypeName(obj) + " object", name));
}

// Positional/keyword binding with Python rules for builtin signatures.
struct Param {
  const char* name;
  std::optional<Value> def;  // nullopt: required
};
Result<std::vector<Value>> Bind(std::string_view fname, const CallArgs& args,
                                std::initializer_list<Param> params) {
  std::vector<Param> ps(params);
  if (args.pos.size() > ps.size())
    return Errorf("{}() takes at most {} argument(s) ({} given)", fname, ps.size(),
                  args.pos.size());
  std::vector<std::optional<Value>> out(ps.size());
  for (size_t i = 0; i < args.pos.size(); ++i) out[i] = args.pos[i];
  for (const auto& [k, v] : args.kw) {
    size_t i = 0;
    while (i < ps.size() && k != ps[i].name) ++i;
    if (i == ps.size()) return Errorf("{}() got an unexpected keyword argument '{}'", fname, k);
    if (out[i]) return Errorf("{}() got multiple values for argument '{}'", fname, k);
    out[i] = v;
  }
  std::vector<Value> r;
  for (size_t i = 0; i < ps.size(); ++i) {
    if (!out[i] && !ps[i].def)
      return Errorf("{}() missing required argument '{}'", fname, ps[i].name);
    r.push_back(out[i] ? *out[i] : *ps[i].def);
  }
  return r;
}

Result<std::optional<std::string>> OptStr(const Value& v, std::string_view what) {
  if (v.is_none()) return std::optional<std::string>();
  if (!v.is_string()) return Errorf("{} arg must be None or str", what);
  return std::optional<std::string>(v.as_string());
}

Result<int64_t> IntArg(const Value& v, std::string_view what) {
  if (!IsIntLike(v))
    return Errorf("'{}' object cannot be interpreted as an integer ({})", TypeName(v), what);
  return IntOf(v);
}

Result<Value> StrList(const std::vector<std::string>& parts) {
  std::vector<Value> items;
  items.reserve(parts.size());
  for (const auto& p : parts) items.push_back(Value::Str(p));
  return Value::List(std::move(items));
}

std::string Pad(std::string_view s, int64_t width, const std::string& fill, int mode) {
  int64_t len = static_cast<int64_t>(pystr::Length(s));
  if (width <= len) return std::string(s);
  int64_t total = width - len;
  int64_t left = mode == 0 ? total / 2 + (total & width & 1) : (mode == 1 ? 0 : total);
  int64_t right = total - left;
  std::string out;
  for (int64_t i = 0; i < left; ++i) out += fill;
  out += s;
  for (int64_t i = 0; i < right; ++i) out += fill;
  return out;
}

}  // namespace

Result<std::vector<Value>> Interpreter::Iterate(const Value& v) {
  switch (v.type()) {
    case Value::Type::kUndefined:
      return std::vector<Value>{};
    case Value::Type::kString: {
      std::vector<Value> out;
      for (char32_t c : pystr::Decode(v.as_string())) {
        std::string s;
        pystr::AppendUtf8(s, c);
        out.push_back(Value::Str(std::move(s)));
      }
      LUMEN_RETURN_IF_ERROR(Charge(static_cast<int64_t>(out.size())));
      return out;
    }
    case Value::Type::kList: {
      ListData& l = *v.list();
      LUMEN_RETURN_IF_ERROR(Charge(static_cast<int64_t>(l.items.size())));
      if (l.kind == ListKind::kIterator) {
        std::vector<Value> out(l.items.begin() + static_cast<ptrdiff_t>(l.pos), l.items.end());
        l.pos = l.items.size();  // a generator is exhausted once iterated
        return out;
      }
      return l.items;
    }
    case Value::Type::kDict: {
      std::vector<Value> out;
      for (const auto& [k, val] : v.dict()->entries) out.push_back(k);
      LUMEN_RETURN_IF_ERROR(Charge(static_cast<int64_t>(out.size())));
      return out;
    }
    case Value::Type::kLoop:
      return v.loop()->items->items;
    default:
      return Errorf("'{}' object is not iterable", TypeName(v));
  }
}

Result<Value> Interpreter::GetAttr(const Value& obj, const std::string& name) {
  switch (obj.type()) {
    case Value::Type::kUndefined:
      return UndefinedError(obj);
    case Value::Type::kDict: {
      // Python finds dict methods before keys: `d.items` is the method.
      if (In(kDictMethods, name))
        return In(kUnsafeMethods, name) ? Unsafe(obj, name) : Method(obj, name);
      if (const Value* v = obj.dict()->Find(name)) return *v;
      return NoAttr(obj, name);
    }
    case Value::Type::kString:
      if (In(kStrMethods, name)) return Method(obj, name);
      return NoAttr(obj, name);
    case Value::Type::kList:
      if ((obj.list()->kind == ListKind::kList && In(kListMethods, name)) ||
          (obj.list()->kind == ListKind::kTuple && (name == "count" || name == "index"))) {
        if (In(kUnsafeMethods, name) || name == "remove" || name == "reverse" || name == "sort")
          return Unsafe(obj, name);
        return Method(obj, name);
      }
      return NoAttr(obj, name);
    case Value::Type::kNamespace:
      if (Value* v = obj.ns()->Find(name)) return *v;
      return NoAttr(obj, name);
    case Value::Type::kLoop: {
      const LoopData& l = *obj.loop();
      int64_t len = static_cast<int64_t>(l.items->items.size());
      if (name == "index") return Value::Int(l.index0 + 1);
      if (name == "index0") return Value::Int(l.index0);
      if (name == "revindex") return Value::Int(len - l.index0);
      if (name == "revindex0") return Value::Int(len - l.index0 - 1);
      if (name == "first") return Value::Bool(l.index0 == 0);
      if (name == "last") return Value::Bool(l.index0 == len - 1);
      if (name == "length") return Value::Int(len);
      if (name == "depth") return Value::Int(1);
      if (name == "depth0") return Value::Int(0);
      if (name == "previtem")
        return l.index0 > 0 ? l.items->items[l.index0 - 1]
                            : Value::Undef("there is no previous item");
      if (name == "nextitem")
        return l.index0 + 1 < len ? l.items->items[l.index0 + 1]
                                  : Value::Undef("there is no next item");
      if (name == "cycle" || name == "changed") return Method(obj, name);
      return NoAttr(obj, name);
    }
    default:
      return NoAttr(obj, name);
  }
}

Result<Value> Interpreter::GetItem(const Value& obj, const Value& key) {
  if (obj.is_undefined()) return UndefinedError(obj);
  if (obj.is_dict()) {
    if (key.is_list() || key.is_dict()) return Errorf("unhashable type: '{}'", TypeName(key));
    if (const Value* v = obj.dict()->Find(key)) return *v;
  } else if (obj.is_string() && IsIntLike(key)) {
    std::u32string u = pystr::Decode(obj.as_string());
    int64_t i = IntOf(key), n = static_cast<int64_t>(u.size());
    if (i < 0) i += n;
    if (i < 0 || i >= n) return Value::Undef("string index out of range");
    std::string s;
    pystr::AppendUtf8(s, u[i]);
    return Value::Str(std::move(s));
  } else if (obj.is_list() && IsIntLike(key) &&
             (obj.list()->kind == ListKind::kList || obj.list()->kind == ListKind::kTuple)) {
    const auto& items = obj.list()->items;
    int64_t i = IntOf(key), n = static_cast<int64_t>(items.size());
    if (i < 0) i += n;
    if (i < 0 || i >= n) return Value::Undef(fmt::format("{} index out of range", TypeName(obj)));
    return items[i];
  }
  // The sandbox falls back to attribute lookup for string keys.
  if (key.is_string() && !obj.is_dict()) return GetAttr(obj, key.as_string());
  if (key.is_string() && obj.is_dict() && In(kDictMethods, key.as_string()))
    return GetAttr(obj, key.as_string());
  LUMEN_ASSIGN_OR_RETURN(std::string k, Repr(key));
  return Value::Undef(fmt::format("'{}' has no attribute {}",
                                  obj.is_none() ? "None" : TypeName(obj) + " object", k));
}

Result<Value> Interpreter::CallMethod(const Callable& m, CallArgs& args) {
  const Value& self = m.receiver;
  const std::string& name = m.name;
  if (self.is_string()) {
    const std::string& s = self.as_string();
    if (name == "strip" || name == "lstrip" || name == "rstrip") {
      LUMEN_ASSIGN_OR_RETURN(auto a, Bind(name, args, {{"chars", Value::None()}}));
      LUMEN_ASSIGN_OR_RETURN(auto chars, OptStr(a[0], "strip"));
      return Value::Str(pystr::Strip(s, chars, name != "rstrip", name != "lstrip"));
    }
    if (name == "split" || name == "rsplit") {
      LUMEN_ASSIGN_OR_RETURN(
          auto a, Bind(name, args, {{"sep", Value::None()}, {"maxsplit", Value::Int(-1)}}));
      LUMEN_ASSIGN_OR_RETURN(auto sep, OptStr(a[0], "sep"));
      if (sep && sep->empty()) return Error("empty separator");
      LUMEN_ASSIGN_OR_RETURN(int64_t maxsplit, IntArg(a[1], "maxsplit"));
      auto parts =
          name == "split" ? pystr::Split(s, sep, maxsplit) : pystr::RSplit(s, sep, maxsplit);
      LUMEN_RETURN_IF_ERROR(Charge(static_cast<int64_t>(parts.size())));
      return StrList(parts);
    }
    if (name == "splitlines") {
      LUMEN_ASSIGN_OR_RETURN(auto a, Bind(name, args, {{"keepends", Value::Bool(false)}}));
      return StrList(pystr::SplitLines(s, Truthy(a[0])));
    }
    if (name == "startswith" || name == "endswith") {
      LUMEN_ASSIGN_OR_RETURN(auto a, Bind(name, args, {{"prefix", std::nullopt}}));
      std::vector<Value> options;
      if (a[0].is_list() && a[0].list()->kind == ListKind::kTuple)
        options = a[0].list()->items;
      else
        options.push_back(a[0]);
      for (const Value& o : options) {
        if (!o.is_string())
          return Errorf("{} first arg must be str or a tuple of str, not {}", name, TypeName(o));
        const std::string& p = o.as_string();
        bool hit = name == "startswith"
                       ? s.compare(0, p.size(), p) == 0 && s.size() >= p.size()
                       : s.size() >= p.size() && s.compare(s.size() - p.size(), p.size(), p) == 0;
        if (hit) return Value::Bool(true);
      }
      return Value::Bool(false);
    }
    if (name == "replace") {
      LUMEN_ASSIGN_OR_RETURN(
          auto a, Bind(name, args,
                       {{"old", std::nullopt}, {"new", std::nullopt}, {"count", Value::Int(-1)}}));
      if (!a[0].is_string() || !a[1].is_string()) return Error("replace() arguments must be str");
      LUMEN_ASSIGN_OR_RETURN(int64_t count, IntArg(a[2], "count"));
      std::string r = pystr::Replace(s, a[0].as_string(), a[1].as_string(), count);
      LUMEN_RETURN_IF_ERROR(CheckString(r.size()));
      return Value::Str(std::move(r));
    }
    if (name == "upper" || name == "lower" || name == "title" || name == "capitalize" ||
        name == "casefold") {
      LUMEN_RETURN_IF_ERROR(Bind(name, args, {}).status());
      if (name == "upper") return Value::Str(pystr::Upper(s));
      if (name == "title") return Value::Str(pystr::TitleMethod(s));
      if (name == "capitalize") return Value::Str(pystr::Capitalize(s));
      return Value::Str(pystr::Lower(s));
    }
    if (name == "find" || name == "rfind" || name == "index" || name == "rindex" ||
        name == "count") {
      LUMEN_ASSIGN_OR_RETURN(auto a, Bind(name, args, {{"sub", std::nullopt}}));
      if (!a[0].is_string()) return Errorf("{}() argument must be str", name);
      if (name == "count") return Value::Int(pystr::Count(s, a[0].as_string()));
      int64_t r = pystr::Find(s, a[0].as_string(), name[0] == 'r');
      if (r < 0 && (name == "index" || name == "rindex")) return Error("substring not found");
      return Value::Int(r);
    }
    if (name == "join") {
      LUMEN_ASSIGN_OR_RETURN(auto a, Bind(name, args, {{"iterable", std::nullopt}}));
      LUMEN_ASSIGN_OR_RETURN(auto items, Iterate(a[0]));
      std::string r;
      for (size_t i = 0; i < items.size(); ++i) {
        if (!items[i].is_string())
          return Errorf("sequence item {}: expected str instance, {} found", i, TypeName(items[i]));
        if (i) r += s;
        r += items[i].as_string();
        LUMEN_RETURN_IF_ERROR(CheckString(r.size()));
      }
      return Value::Str(std::move(r));
    }
    if (name == "removeprefix" || name == "removesuffix") {
      LUMEN_ASSIGN_OR_RETURN(auto a, Bind(name, args, {{"affix", std::nullopt}}));
      if (!a[0].is_string()) return Errorf("{}() argument must be str", name);
      const std::string& p = a[0].as_string();
      if (name == "removeprefix" && s.compare(0, p.size(), p) == 0 && s.size() >= p.size())
        return Value::Str(s.substr(p.size()));
      if (name == "removesuffix" && !p.empty() && s.size() >= p.size() &&
          s.compare(s.size() - p.size(), p.size(), p) == 0)
        return Value::Str(s.substr(0, s.size() - p.size()));
      return self;
    }
    if (name == "isdigit" || name == "isalpha" || name == "isalnum" || name == "isspace" ||
        name == "islower" || name == "isupper" || name == "isascii") {
      LUMEN_RETURN_IF_ERROR(Bind(name, args, {}).status());
      if (name == "islower") return Value::Bool(pystr::IsLowerCase(s));
      if (name == "isupper") return Value::Bool(pystr::IsUpperCase(s));
      std::u32string u = pystr::Decode(s);
      if (name == "isascii")
        return Value::Bool(std::all_of(u.begin(), u.end(), [](char32_t c) { return c < 0x80; }));
      if (u.empty()) return Value::Bool(false);
      for (char32_t c : u) {
        bool ok;
        if (name == "isspace") {
          ok = pystr::IsSpace(c);
        } else if (c >= 0x80) {
          return Errorf("str.{}() on non-ASCII text is not supported", name);
        } else if (name == "isdigit") {
          ok = std::isdigit(static_cast<int>(c));
        } else if (name == "isalpha") {
          ok = std::isalpha(static_cast<int>(c));
        } else {
          ok = std::isalnum(static_cast<int>(c));
        }
        if (!ok) return Value::Bool(false);
      }
      return Value::Bool(true);
    }
    if (name == "center" || name == "ljust" || name == "rjust") {
      LUMEN_ASSIGN_OR_RETURN(
          auto a, Bind(name, args, {{"width", std::nullopt}, {"fillchar", Value::Str(" ")}}));
      LUMEN_ASSIGN_OR_RETURN(int64_t w, IntArg(a[0], "width"));
      if (!a[1].is_string() || pystr::Length(a[1].as_string()) != 1)
        return Error("The fill character must be exactly one character long");
      LUMEN_RETURN_IF_ERROR(CheckString(static_cast<size_t>(std::max<int64_t>(0, w))));
      return Value::Str(Pad(s, w, a[1].as_string(),
                            name == "center"  ? 0
                            : name == "ljust" ? 1
                                              : 2));
    }
    if (name == "zfill") {
      LUMEN_ASSIGN_OR_RETURN(auto a, Bind(name, args, {{"width", std::nullopt}}));
      LUMEN_ASSIGN_OR_RETURN(int64_t w, IntArg(a[0], "width"));
      LUMEN_RETURN_IF_ERROR(CheckString(static_cast<size_t>(std::max<int64_t>(0, w))));
      int64_t len = static_cast<int64_t>(pystr::Length(s));
      if (w <= len) return self;
      size_t sign = (!s.empty() && (s[0] == '+' || s[0] == '-')) ? 1 : 0;
      return Value::Str(s.substr(0, sign) + std::string(w - len, '0') + s.substr(sign));
    }
    return Errorf("unsupported construct: string method '{}'", name);
  }
  if (self.is_dict()) {
    const DictData& d = *self.dict();
    if (name == "get") {
      LUMEN_ASSIGN_OR_RETURN(auto a,
                             Bind(name, args, {{"key", std::nullopt}, {"default", Value::None()}}));
      if (const Value* v = d.Find(a[0])) return *v;
      return a[1];
    }
    if (name == "items" || name == "keys" || name == "values") {
      LUMEN_RETURN_IF_ERROR(Bind(name, args, {}).status());
      std::vector<Value> out;
      for (const auto& [k, v] : d.entries) {
        if (name == "items") {
          LUMEN_ASSIGN_OR_RETURN(Value t, Value::List({k, v}, ListKind::kTuple));
          out.push_back(std::move(t));
        } else {
          out.push_back(name == "keys" ? k : v);
        }
      }
      LUMEN_RETURN_IF_ERROR(Charge(static_cast<int64_t>(out.size())));
      return Value::List(std::move(out), ListKind::kView, "dict_" + name);
    }
    if (name == "copy") return self;
    return Errorf("unsupported construct: dict method '{}'", name);
  }
  if (self.is_list()) {
    const auto& items = self.list()->items;
    if (name == "copy") return Value::List(items, self.list()->kind);
    if (name == "count" || name == "index") {
      LUMEN_ASSIGN_OR_RETURN(auto a, Bind(name, args, {{"value", std::nullopt}}));
      int64_t n = 0;
      for (size_t i = 0; i < items.size(); ++i) {
        if (Equals(items[i], a[0])) {
          if (name == "index") return Value::Int(static_cast<int64_t>(i));
          ++n;
        }
      }
      if (name == "index") return Error("value is not in list");
      return Value::Int(n);
    }
  }
  if (self.is_loop()) {
    LoopData& l = *self.loop();
    if (name == "cycle") {
      if (!args.kw.empty() || args.pos.empty()) return Error("no items for cycling given");
      return args.pos[static_cast<size_t>(l.index0) % args.pos.size()];
    }
    if (name == "changed") {
      LUMEN_ASSIGN_OR_RETURN(Value v, Value::List(args.pos, ListKind::kTuple));
      if (l.has_changed && Equals(l.last_changed, v)) return Value::Bool(false);
      l.last_changed = v;
      l.has_changed = true;
      return Value::Bool(true);
    }
  }
  return Errorf("unsupported construct: method '{}' of '{}'", name, TypeName(self));
}

Result<Value> Interpreter::CallGlobal(const Callable& g, CallArgs& args) {
  const std::string& name = g.name;
  if (name == "raise_exception") {
    LUMEN_ASSIGN_OR_RETURN(auto a, Bind(name, args, {{"message", std::nullopt}}));
    LUMEN_ASSIGN_OR_RETURN(std::string msg, ToStr(a[0]));
    return Errorf("raise_exception: {}", msg);
  }
  if (name == "strftime_now") {
    LUMEN_ASSIGN_OR_RETURN(auto a, Bind(name, args, {{"format", std::nullopt}}));
    if (!a[0].is_string()) return Error("strftime_now() argument must be str");
    std::time_t t = options_.now ? *options_.now : std::time(nullptr);
    std::tm tm{};
    localtime_r(&t, &tm);
    const std::string& f = a[0].as_string();
    if (f.size() > 256) return Error("strftime_now() format too long");
    std::string buf(f.size() * 16 + 64, '\0');
    size_t n = std::strftime(buf.data(), buf.size(), f.c_str(), &tm);
    buf.resize(n);
    return Value::Str(std::move(buf));
  }
  if (name == "range") {
    if (!args.kw.empty()) return Error("range() takes no keyword arguments");
    int64_t start = 0, stop = 0, step = 1;
    std::vector<int64_t> v;
    for (const Value& a : args.pos) {
      LUMEN_ASSIGN_OR_RETURN(int64_t i, IntArg(a, "range"));
      v.push_back(i);
    }
    if (v.size() == 1) {
      stop = v[0];
    } else if (v.size() == 2 || v.size() == 3) {
      start = v[0];
      stop = v[1];
      if (v.size() == 3) step = v[2];
    } else {
      return Errorf("range expected 1 to 3 arguments, got {}", v.size());
    }
    if (step == 0) return Error("range() arg 3 must not be zero");
    std::vector<Value> items;
    for (int64_t i = start; step > 0 ? i < stop : i > stop; i += step) {
      if (items.size() >= 100000)
        return Error("Range too big. The sandbox blocks ranges larger than MAX_RANGE (100000).");
      items.push_back(Value::Int(i));
      if ((step > 0 && i > INT64_MAX - step) || (step < 0 && i < INT64_MIN - step)) break;
    }
    LUMEN_RETURN_IF_ERROR(Charge(static_cast<int64_t>(items.size())));
    return Value::List(std::move(items));
  }
  if (name == "namespace" || name == "dict") {
    std::vector<std::pair<Value, Value>> entries;
    if (args.pos.size() > 1) return Errorf("{}() takes at most one positional argument", name);
    if (args.pos.size() == 1) {
      if (!args.pos[0].is_dict()) return Errorf("{}() positional argument must be a dict", name);
      entries = args.pos[0].dict()->entries;
    }
    for (auto& [k, v] : args.kw) entries.emplace_back(Value::Str(k), v);
    if (name == "dict") return Value::Dict(std::move(entries));
    auto ns = std::make_shared<NamespaceData>();
    for (auto& [k, v] : entries) {
      if (!k.is_string()) return Error("namespace() keys must be strings");
      if (Value* slot = ns->Find(k.as_string()))
        *slot = v;
      else
        ns->attrs.emplace_back(k.as_string(), v);
    }
    return Value::Namespace(std::move(ns));
  }
  return Errorf("unsupported construct: global function '{}()'", name);
}

}  // namespace lumen::tokenize
