// Value: the runtime values of the chat-template interpreter, with Python's
// meaning (Jinja2 evaluates templates as Python objects).
//
// Kinds: undefined (Jinja's default Undefined, carrying a hint for error
// messages), None, bool, int (int64), float (double), str (UTF-8), list (also
// tuple, dict views and one-shot iterators such as `|map` results), dict
// (insertion-ordered, any hashable key), namespace, callable (macro, bound
// method, global function) and loop (the `loop` object). Lists and dicts are
// shared and immutable once built (the sandbox forbids mutation); only
// namespace attributes change. Depth of nested lists/dicts is bounded
// (kMaxValueDepth) so no value can overflow the stack when printed or freed.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <variant>
#include <vector>

#include <nlohmann/json.hpp>

#include "lumen/core/status.h"

namespace lumen::tokenize {

inline constexpr int kMaxValueDepth = 512;

class Value;
struct Callable;  // defined by the interpreter
struct LoopData;  // defined by the interpreter

enum class ListKind { kList, kTuple, kView, kIterator };

struct ListData {
  ListKind kind = ListKind::kList;
  std::vector<Value> items;
  std::string view_name;  // "dict_items" etc. for kView
  size_t pos = 0;         // kIterator: items before pos were consumed
  int depth = 1;
};

struct DictData {
  std::vector<std::pair<Value, Value>> entries;
  int depth = 1;
  const Value* Find(const Value& key) const;
  const Value* Find(std::string_view key) const;
};

struct NamespaceData {
  std::vector<std::pair<std::string, Value>> attrs;
  Value* Find(std::string_view name);
};

struct Undefined {
  std::string hint;  // e.g. "'foo' is undefined"; empty when none
};

class Value {
 public:
  enum class Type {
    kUndefined,
    kNone,
    kBool,
    kInt,
    kFloat,
    kString,
    kList,
    kDict,
    kNamespace,
    kCallable,
    kLoop
  };

  Value() : v_(Undefined{}) {}
  static Value Undef(std::string hint = {}) { return Value(Undefined{std::move(hint)}); }
  static Value None() { return Value(nullptr); }
  static Value Bool(bool b) { return Value(b); }
  static Value Int(int64_t i) { return Value(i); }
  static Value Float(double d) { return Value(d); }
  static Value Str(std::string s) { return Value(std::move(s)); }
  // Fails when nesting would exceed kMaxValueDepth.
  static Result<Value> List(std::vector<Value> items, ListKind kind = ListKind::kList,
                            std::string view_name = {});
  static Result<Value> Dict(std::vector<std::pair<Value, Value>> entries);
  static Value Namespace(std::shared_ptr<NamespaceData> ns) { return Value(std::move(ns)); }
  static Value Fn(std::shared_ptr<Callable> fn) { return Value(std::move(fn)); }
  static Value Loop(std::shared_ptr<LoopData> loop) { return Value(std::move(loop)); }

  Type type() const { return static_cast<Type>(v_.index()); }
  bool is_undefined() const { return type() == Type::kUndefined; }
  bool is_none() const { return type() == Type::kNone; }
  bool is_bool() const { return type() == Type::kBool; }
  bool is_int() const { return type() == Type::kInt; }
  bool is_float() const { return type() == Type::kFloat; }
  bool is_number() const { return is_int() || is_float() || is_bool(); }
  bool is_string() const { return type() == Type::kString; }
  bool is_list() const { return type() == Type::kList; }
  bool is_dict() const { return type() == Type::kDict; }
  bool is_namespace() const { return type() == Type::kNamespace; }
  bool is_callable() const { return type() == Type::kCallable; }
  bool is_loop() const { return type() == Type::kLoop; }

  bool as_bool() const { return std::get<bool>(v_); }
  int64_t as_int() const { return std::get<int64_t>(v_); }
  // int, bool or float as double.
  double as_double() const;
  const std::string& as_string() const { return std::get<std::string>(v_); }
  const std::string& undefined_hint() const { return std::get<Undefined>(v_).hint; }
  const std::shared_ptr<ListData>& list() const { return std::get<std::shared_ptr<ListData>>(v_); }
  const std::shared_ptr<DictData>& dict() const { return std::get<std::shared_ptr<DictData>>(v_); }
  const std::shared_ptr<NamespaceData>& ns() const {
    return std::get<std::shared_ptr<NamespaceData>>(v_);
  }
  const std::shared_ptr<Callable>& fn() const { return std::get<std::shared_ptr<Callable>>(v_); }
  const std::shared_ptr<LoopData>& loop() const { return std::get<std::shared_ptr<LoopData>>(v_); }
  int depth() const;

 private:
  using Storage = std::variant<Undefined, std::nullptr_t, bool, int64_t, double, std::string,
                               std::shared_ptr<ListData>, std::shared_ptr<DictData>,
                               std::shared_ptr<NamespaceData>, std::shared_ptr<Callable>,
                               std::shared_ptr<LoopData>>;
  template <typename T>
  explicit Value(T v) : v_(std::move(v)) {}
  Storage v_;
};

// Python's type name, for error messages ("str", "dict", "NoneType", ...).
std::string TypeName(const Value& v);

// Python bool(v).
bool Truthy(const Value& v);

// Python ==.
bool Equals(const Value& a, const Value& b);

// Python ordering: <0, 0, >0; error for types Python cannot order.
Result<int> Compare(const Value& a, const Value& b);

// Python str(v) as Jinja prints it (undefined prints as "").
Result<std::string> ToStr(const Value& v);
// Python repr(v).
Result<std::string> Repr(const Value& v);

struct JsonOptions {
  bool ensure_ascii = false;
  std::optional<std::string> indent;  // nullopt: single line
  std::optional<std::pair<std::string, std::string>> separators;
  bool sort_keys = false;
};
// Python json.dumps(v, ...) into out.
Status ToJson(const Value& v, const JsonOptions& options, std::string& out);

// Converts JSON input (the render context) to values.
Result<Value> FromJson(const nlohmann::ordered_json& j);

}  // namespace lumen::tokenize
