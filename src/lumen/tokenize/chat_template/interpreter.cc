#include "lumen/tokenize/chat_template/interpreter.h"

#include <cmath>

#include "lumen/tokenize/chat_template/pystr.h"

namespace lumen::tokenize {
namespace {

constexpr std::string_view kErrPrefix = "template error at ";

bool IsIntLike(const Value& v) { return v.is_int() || v.is_bool(); }
int64_t IntOf(const Value& v) { return v.is_bool() ? (v.as_bool() ? 1 : 0) : v.as_int(); }

Status UndefinedError(const Value& v) {
  if (!v.undefined_hint().empty()) return Error(v.undefined_hint());
  return Error("value is undefined");
}

Status Overflow() { return Error("integer overflow (integers are 64-bit)"); }

// Python's floor division and modulo on int64.
int64_t FloorDiv(int64_t a, int64_t b) {
  int64_t q = a / b;
  if ((a % b != 0) && ((a < 0) != (b < 0))) --q;
  return q;
}
int64_t PyMod(int64_t a, int64_t b) {
  int64_t m = a % b;
  if (m != 0 && ((m < 0) != (b < 0))) m += b;
  return m;
}
double PyFMod(double a, double b) {
  double m = std::fmod(a, b);
  if (m != 0 && ((m < 0) != (b < 0))) m += b;
  return m;
}

}  // namespace

std::string Where(const Expr& e) { return fmt::format("{}:{}", e.line, e.column); }

Value* Frame::FindLocal(std::string_view name) {
  for (auto& [k, v] : vars)
    if (k == name) return &v;
  return nullptr;
}

void Frame::Set(std::string_view name, Value v) {
  if (Value* slot = FindLocal(name)) {
    *slot = std::move(v);
  } else {
    vars.emplace_back(std::string(name), std::move(v));
  }
}

Status Interpreter::At(const Expr& e, Status s) const {
  if (s.ok() || s.message().rfind(kErrPrefix, 0) == 0) return s;
  return Errorf("{}{}: {}", kErrPrefix, Where(e), s.message());
}

Status Interpreter::CheckString(size_t bytes) const {
  if (bytes > options_.limits.max_output_bytes)
    return Errorf("string of {} bytes exceeds the output limit of {} bytes", bytes,
                  options_.limits.max_output_bytes);
  return Status::Ok();
}

Status Interpreter::Append(std::string& out, std::string_view s) const {
  if (out.size() + s.size() > options_.limits.max_output_bytes)
    return Errorf("rendered output exceeds the limit of {} bytes",
                  options_.limits.max_output_bytes);
  out.append(s);
  return Status::Ok();
}

Status Interpreter::Charge(int64_t steps) {
  steps_ += steps;
  if (steps_ > options_.limits.max_steps)
    return Errorf("template exceeded the evaluation step limit ({} steps)",
                  options_.limits.max_steps);
  return Status::Ok();
}

Result<std::string> Interpreter::Render(const Template& tmpl, const Value& context) {
  auto root = std::make_shared<Frame>();
  if (context.is_dict()) {
    for (const auto& [k, v] : context.dict()->entries)
      if (k.is_string()) root->Set(k.as_string(), v);
  }
  std::string out;
  LUMEN_RETURN_IF_ERROR(Exec(tmpl.body, root, out));
  return out;
}

// ---------------- statements ----------------

Status Interpreter::Exec(const Body& body, const FramePtr& f, std::string& out) {
  for (const auto& s : body) {
    LUMEN_RETURN_IF_ERROR(ExecStmt(*s, f, out));
    if (flow_ != Flow::kNormal) break;
  }
  return Status::Ok();
}

Status Interpreter::Assign(const Target& t, const Value& v, const FramePtr& f, const Stmt& at) {
  if (!t.attr.empty()) {
    LUMEN_ASSIGN_OR_RETURN(Value obj, Lookup(t.names[0], f));
    if (!obj.is_namespace())
      return Errorf("{}{}:{}: cannot assign attribute '{}' on non-namespace object '{}'",
                    kErrPrefix, at.line, at.column, t.attr, t.names[0]);
    // A namespace holding itself would be a reference cycle; templates never need it.
    std::vector<const Value*> stack{&v};
    while (!stack.empty()) {
      const Value* x = stack.back();
      stack.pop_back();
      if (x->is_namespace() || x->is_loop() || x->is_callable())
        return Errorf(
            "{}{}:{}: storing a namespace, loop or macro inside a namespace is not "
            "supported",
            kErrPrefix, at.line, at.column);
      if (x->is_list())
        for (const auto& i : x->list()->items) stack.push_back(&i);
      if (x->is_dict())
        for (const auto& [k, val] : x->dict()->entries) stack.push_back(&val);
    }
    if (Value* slot = obj.ns()->Find(t.attr)) {
      *slot = v;
    } else {
      obj.ns()->attrs.emplace_back(t.attr, v);
    }
    return Status::Ok();
  }
  if (!t.is_tuple) {
    f->Set(t.names[0], v);
    return Status::Ok();
  }
  auto items = Iterate(v);
  if (!items.ok())
    return Errorf("{}{}:{}: cannot unpack: {}", kErrPrefix, at.line, at.column,
                  items.status().message());
  if (items->size() != t.names.size())
    return Errorf("{}{}:{}: {} values to unpack (expected {}, got {})", kErrPrefix, at.line,
                  at.column, items->size() < t.names.size() ? "not enough" : "too many",
                  t.names.size(), items->size());
  for (size_t i = 0; i < t.names.size(); ++i) f->Set(t.names[i], (*items)[i]);
  return Status::Ok();
}

Result<std::string> Interpreter::ApplyFilterChain(const std::vector<ExprPtr>& filters,
                                                  std::string s, const FramePtr& f) {
  Value v = Value::Str(std::move(s));
  for (const auto& fe : filters) {
    LUMEN_ASSIGN_OR_RETURN(CallArgs args, EvalArgs(*fe, 1, f));
    auto r = ApplyFilter(fe->name, v, std::move(args), fe.get());
    if (!r.ok()) return At(*fe, r.status());
    v = std::move(r).value();
  }
  return ToStr(v);
}

Status Interpreter::ExecStmt(const Stmt& s, const FramePtr& f, std::string& out) {
  LUMEN_RETURN_IF_ERROR(Charge(1));
  if (++depth_ > options_.limits.max_eval_depth) {
    --depth_;
    return Errorf("{}{}:{}: evaluation nested deeper than {} levels", kErrPrefix, s.line, s.column,
                  options_.limits.max_eval_depth);
  }
  struct Dec {
    int& d;
    ~Dec() { --d; }
  } dec{depth_};
  switch (s.kind) {
    case Stmt::Kind::kOutput:
      return Append(out, s.text);
    case Stmt::Kind::kPrint: {
      LUMEN_ASSIGN_OR_RETURN(Value v, Eval(*s.expr, f));
      auto str = ToStr(v);
      if (!str.ok()) return At(*s.expr, str.status());
      return Append(out, *str);
    }
    case Stmt::Kind::kIf:
      for (size_t i = 0; i < s.conds.size(); ++i) {
        LUMEN_ASSIGN_OR_RETURN(Value c, Eval(*s.conds[i], f));
        if (Truthy(c)) return Exec(s.bodies[i], f, out);
      }
      return Exec(s.else_body, f, out);
    case Stmt::Kind::kFor:
      return ExecFor(s, f, out);
    case Stmt::Kind::kSet: {
      LUMEN_ASSIGN_OR_RETURN(Value v, Eval(*s.expr, f));
      return Assign(s.target, v, f, s);
    }
    case Stmt::Kind::kSetBlock: {
      auto inner = std::make_shared<Frame>();
      inner->parent = f;
      std::string body;
      LUMEN_RETURN_IF_ERROR(Exec(s.body, inner, body));
      LUMEN_ASSIGN_OR_RETURN(std::string v, ApplyFilterChain(s.filters, std::move(body), inner));
      return Assign(s.target, Value::Str(std::move(v)), f, s);
    }
    case Stmt::Kind::kFilterBlock: {
      auto inner = std::make_shared<Frame>();
      inner->parent = f;
      std::string body;
      LUMEN_RETURN_IF_ERROR(Exec(s.body, inner, body));
      LUMEN_ASSIGN_OR_RETURN(std::string v, ApplyFilterChain(s.filters, std::move(body), inner));
      return Append(out, v);
    }
    case Stmt::Kind::kMacro: {
      auto c = std::make_shared<Callable>();
      c->type = Callable::Type::kMacro;
      c->name = s.name;
      c->stmt = &s;
      c->closure = f;
      f->Set(s.name, Value::Fn(std::move(c)));
      return Status::Ok();
    }
    case Stmt::Kind::kCallBlock: {
      auto c = std::make_shared<Callable>();
      c->type = Callable::Type::kCaller;
      c->name = "caller";
      c->stmt = &s;
      c->closure = f;
      const Expr& call = *s.expr;
      LUMEN_ASSIGN_OR_RETURN(Value fn, Eval(*call.args[0], f));
      LUMEN_ASSIGN_OR_RETURN(CallArgs args, EvalArgs(call, 1, f));
      args.kw.emplace_back("caller", Value::Fn(std::move(c)));
      auto r = Call(fn, std::move(args), &call);
      if (!r.ok()) return At(call, r.status());
      auto str = ToStr(*r);
      if (!str.ok()) return At(call, str.status());
      return Append(out, *str);
    }
    case Stmt::Kind::kWith: {
      auto inner = std::make_shared<Frame>();
      inner->parent = f;
      for (size_t i = 0; i < s.with_targets.size(); ++i) {
        LUMEN_ASSIGN_OR_RETURN(Value v, Eval(*s.with_values[i], f));
        LUMEN_RETURN_IF_ERROR(Assign(s.with_targets[i], v, inner, s));
      }
      return Exec(s.body, inner, out);
    }
    case Stmt::Kind::kGeneration: {
      auto inner = std::make_shared<Frame>();
      inner->parent = f;
      return Exec(s.body, inner, out);
    }
    case Stmt::Kind::kBreak:
      flow_ = Flow::kBreak;
      return Status::Ok();
    case Stmt::Kind::kContinue:
      flow_ = Flow::kContinue;
      return Status::Ok();
  }
  return Status::Ok();
}

Status Interpreter::ExecFor(const Stmt& s, const FramePtr& f, std::string& out) {
  LUMEN_ASSIGN_OR_RETURN(Value seq, Eval(*s.expr, f));
  auto items_r = Iterate(seq);
  if (!items_r.ok()) return At(*s.expr, items_r.status());
  std::vector<Value> items = std::move(items_r).value();
  auto loop_frame = std::make_shared<Frame>();
  loop_frame->parent = f;
  if (s.cond) {
    std::vector<Value> kept;
    for (auto& item : items) {
      LUMEN_RETURN_IF_ERROR(Charge(1));
      auto test_frame = std::make_shared<Frame>();
      test_frame->parent = loop_frame;
      LUMEN_RETURN_IF_ERROR(Assign(s.target, item, test_frame, s));
      LUMEN_ASSIGN_OR_RETURN(Value c, Eval(*s.cond, test_frame));
      if (Truthy(c)) kept.push_back(std::move(item));
    }
    items = std::move(kept);
  }
  if (items.empty()) {
    auto else_frame = std::make_shared<Frame>();
    else_frame->parent = f;
    return Exec(s.else_body, else_frame, out);
  }
  auto loop = std::make_shared<LoopData>();
  loop->items = std::make_shared<ListData>();
  loop->items->items = std::move(items);
  Value loop_value = Value::Loop(loop);
  const auto& list = loop->items->items;
  for (size_t i = 0; i < list.size(); ++i) {
    LUMEN_RETURN_IF_ERROR(Charge(1));
    loop->index0 = static_cast<int64_t>(i);
    LUMEN_RETURN_IF_ERROR(Assign(s.target, list[i], loop_frame, s));
    loop_frame->Set("loop", loop_value);
    LUMEN_RETURN_IF_ERROR(Exec(s.body, loop_frame, out));
    if (flow_ == Flow::kBreak) {
      flow_ = Flow::kNormal;
      break;
    }
    flow_ = Flow::kNormal;
  }
  return Status::Ok();
}

// ---------------- expressions ----------------

Result<Value> Interpreter::Lookup(const std::string& name, const FramePtr& f) {
  for (Frame* fr = f.get(); fr; fr = fr->parent.get()) {
    if (Value* v = fr->FindLocal(name)) return *v;
  }
  static constexpr std::string_view kGlobals[] = {"range",           "namespace",    "dict",
                                                  "raise_exception", "strftime_now", "cycler",
                                                  "joiner",          "lipsum"};
  for (std::string_view g : kGlobals) {
    if (g == name) {
      auto c = std::make_shared<Callable>();
      c->type = Callable::Type::kGlobal;
      c->name = name;
      return Value::Fn(std::move(c));
    }
  }
  return Value::Undef(fmt::format("'{}' is undefined", name));
}

Result<Value> Interpreter::Eval(const Expr& e, const FramePtr& f) {
  LUMEN_RETURN_IF_ERROR(Charge(1));
  if (++depth_ > options_.limits.max_eval_depth) {
    --depth_;
    return Errorf("{}{}: evaluation nested deeper than {} levels", kErrPrefix, Where(e),
                  options_.limits.max_eval_depth);
  }
  auto r = EvalInner(e, f);
  --depth_;
  if (!r.ok()) return At(e, r.status());
  return r;
}

Result<CallArgs> Interpreter::EvalArgs(const Expr& e, size_t first, const FramePtr& f) {
  CallArgs args;
  for (size_t i = first; i < e.args.size(); ++i) {
    LUMEN_ASSIGN_OR_RETURN(Value v, Eval(*e.args[i], f));
    args.pos.push_back(std::move(v));
  }
  for (const auto& [k, x] : e.kwargs) {
    LUMEN_ASSIGN_OR_RETURN(Value v, Eval(*x, f));
    args.kw.emplace_back(k, std::move(v));
  }
  return args;
}

Result<Value> Interpreter::EvalInner(const Expr& e, const FramePtr& f) {
  switch (e.kind) {
    case Expr::Kind::kConst:
      return e.value;
    case Expr::Kind::kName:
      return Lookup(e.name, f);
    case Expr::Kind::kList:
    case Expr::Kind::kTuple: {
      std::vector<Value> items;
      for (const auto& a : e.args) {
        LUMEN_ASSIGN_OR_RETURN(Value v, Eval(*a, f));
        items.push_back(std::move(v));
      }
      return Value::List(std::move(items),
                         e.kind == Expr::Kind::kTuple ? ListKind::kTuple : ListKind::kList);
    }
    case Expr::Kind::kDict: {
      std::vector<std::pair<Value, Value>> entries;
      for (size_t i = 0; i + 1 < e.args.size(); i += 2) {
        LUMEN_ASSIGN_OR_RETURN(Value k, Eval(*e.args[i], f));
        if (k.is_list() || k.is_dict() || k.is_namespace() || k.is_undefined())
          return Errorf("unhashable type: '{}'", TypeName(k));
        LUMEN_ASSIGN_OR_RETURN(Value v, Eval(*e.args[i + 1], f));
        entries.emplace_back(std::move(k), std::move(v));
      }
      return Value::Dict(std::move(entries));
    }
    case Expr::Kind::kGetAttr: {
      LUMEN_ASSIGN_OR_RETURN(Value obj, Eval(*e.args[0], f));
      return GetAttr(obj, e.name);
    }
    case Expr::Kind::kGetItem: {
      LUMEN_ASSIGN_OR_RETURN(Value obj, Eval(*e.args[0], f));
      LUMEN_ASSIGN_OR_RETURN(Value key, Eval(*e.args[1], f));
      return GetItem(obj, key);
    }
    case Expr::Kind::kSlice:
      return EvalSlice(e, f);
    case Expr::Kind::kCall: {
      LUMEN_ASSIGN_OR_RETURN(Value fn, Eval(*e.args[0], f));
      LUMEN_ASSIGN_OR_RETURN(CallArgs args, EvalArgs(e, 1, f));
      return Call(fn, std::move(args), &e);
    }
    case Expr::Kind::kFilter: {
      LUMEN_ASSIGN_OR_RETURN(Value v, Eval(*e.args[0], f));
      LUMEN_ASSIGN_OR_RETURN(CallArgs args, EvalArgs(e, 1, f));
      return ApplyFilter(e.name, v, std::move(args), &e);
    }
    case Expr::Kind::kTest: {
      LUMEN_ASSIGN_OR_RETURN(Value v, Eval(*e.args[0], f));
      LUMEN_ASSIGN_OR_RETURN(CallArgs args, EvalArgs(e, 1, f));
      LUMEN_ASSIGN_OR_RETURN(bool b, ApplyTest(e.name, v, std::move(args)));
      return Value::Bool(b);
    }
    case Expr::Kind::kNeg:
    case Expr::Kind::kPos: {
      LUMEN_ASSIGN_OR_RETURN(Value v, Eval(*e.args[0], f));
      bool neg = e.kind == Expr::Kind::kNeg;
      if (IsIntLike(v)) {
        int64_t i = IntOf(v);
        if (neg && i == INT64_MIN) return Overflow();
        return Value::Int(neg ? -i : i);
      }
      if (v.is_float()) return Value::Float(neg ? -v.as_double() : v.as_double());
      if (v.is_undefined()) return UndefinedError(v);
      return Errorf("bad operand type for unary {}: '{}'", neg ? "-" : "+", TypeName(v));
    }
    case Expr::Kind::kNot: {
      LUMEN_ASSIGN_OR_RETURN(Value v, Eval(*e.args[0], f));
      return Value::Bool(!Truthy(v));
    }
    case Expr::Kind::kAnd:
    case Expr::Kind::kOr: {
      LUMEN_ASSIGN_OR_RETURN(Value a, Eval(*e.args[0], f));
      bool t = Truthy(a);
      if (e.kind == Expr::Kind::kAnd ? !t : t) return a;
      return Eval(*e.args[1], f);
    }
    case Expr::Kind::kBinary: {
      LUMEN_ASSIGN_OR_RETURN(Value a, Eval(*e.args[0], f));
      LUMEN_ASSIGN_OR_RETURN(Value b, Eval(*e.args[1], f));
      return EvalBinary(e, a, b);
    }
    case Expr::Kind::kCompare:
      return EvalCompare(e, f);
    case Expr::Kind::kCondExpr: {
      LUMEN_ASSIGN_OR_RETURN(Value c, Eval(*e.args[0], f));
      if (Truthy(c)) return Eval(*e.args[1], f);
      if (e.args[2]) return Eval(*e.args[2], f);
      return Value::Undef("the inline if-expression on " + Where(e) +
                          " evaluated to false and no else section was defined.");
    }
  }
  return Error("unknown expression");
}

Result<Value> Interpreter::EvalBinary(const Expr& e, const Value& a, const Value& b) {
  const std::string& op = e.name;
  if (op == "~") {
    LUMEN_ASSIGN_OR_RETURN(std::string x, ToStr(a));
    LUMEN_ASSIGN_OR_RETURN(std::string y, ToStr(b));
    LUMEN_RETURN_IF_ERROR(CheckString(x.size() + y.size()));
    return Value::Str(x + y);
  }
  if (a.is_undefined()) return UndefinedError(a);
  if (b.is_undefined()) return UndefinedError(b);
  auto type_error = [&]() {
    return Errorf("unsupported operand type(s) for {}: '{}' and '{}'", op, TypeName(a),
                  TypeName(b));
  };
  if (a.is_number() && b.is_number()) {
    bool ints = IsIntLike(a) && IsIntLike(b);
    if (ints) {
      int64_t x = IntOf(a), y = IntOf(b), r = 0;
      if (op == "+") {
        if (__builtin_add_overflow(x, y, &r)) return Overflow();
        return Value::Int(r);
      }
      if (op == "-") {
        if (__builtin_sub_overflow(x, y, &r)) return Overflow();
        return Value::Int(r);
      }
      if (op == "*") {
        if (__builtin_mul_overflow(x, y, &r)) return Overflow();
        return Value::Int(r);
      }
      if (op == "/") {
        if (y == 0) return Error("division by zero");
        return Value::Float(static_cast<double>(x) / static_cast<double>(y));
      }
      if (op == "//" || op == "%") {
        if (y == 0) return Error("integer division or modulo by zero");
        if (x == INT64_MIN && y == -1) return Overflow();
        return Value::Int(op == "//" ? FloorDiv(x, y) : PyMod(x, y));
      }
      if (op == "**") {
        if (y < 0) return Value::Float(std::pow(static_cast<double>(x), static_cast<double>(y)));
        int64_t result = 1, base = x;
        while (y > 0) {
          if (y & 1)
            if (__builtin_mul_overflow(result, base, &result)) return Overflow();
          y >>= 1;
          if (y > 0 && __builtin_mul_overflow(base, base, &base)) return Overflow();
        }
        return Value::Int(result);
      }
    } else {
      double x = a.as_double(), y = b.as_double();
      if (op == "+") return Value::Float(x + y);
      if (op == "-") return Value::Float(x - y);
      if (op == "*") return Value::Float(x * y);
      if (op == "/") {
        if (y == 0) return Error("float division by zero");
        return Value::Float(x / y);
      }
      if (op == "//") {
        if (y == 0) return Error("float floor division by zero");
        return Value::Float(std::floor(x / y));
      }
      if (op == "%") {
        if (y == 0) return Error("float modulo");
        return Value::Float(PyFMod(x, y));
      }
      if (op == "**") {
        if (x == 0 && y < 0) return Error("0.0 cannot be raised to a negative power");
        return Value::Float(std::pow(x, y));
      }
    }
    return type_error();
  }
  if (op == "+") {
    if (a.is_string() && b.is_string()) {
      LUMEN_RETURN_IF_ERROR(CheckString(a.as_string().size() + b.as_string().size()));
      return Value::Str(a.as_string() + b.as_string());
    }
    if (a.is_list() && b.is_list() && a.list()->kind == b.list()->kind &&
        (a.list()->kind == ListKind::kList || a.list()->kind == ListKind::kTuple)) {
      std::vector<Value> items = a.list()->items;
      items.insert(items.end(), b.list()->items.begin(), b.list()->items.end());
      LUMEN_RETURN_IF_ERROR(Charge(static_cast<int64_t>(items.size())));
      return Value::List(std::move(items), a.list()->kind);
    }
    if (a.is_string() || b.is_string())
      return Errorf("can only concatenate str (not \"{}\") to str",
                    TypeName(a.is_string() ? b : a));
    return type_error();
  }
  if (op == "*") {
    const Value& seq = IsIntLike(a) ? b : a;
    const Value& n = IsIntLike(a) ? a : b;
    if (IsIntLike(n) &&
        (seq.is_string() || (seq.is_list() && (seq.list()->kind == ListKind::kList ||
                                               seq.list()->kind == ListKind::kTuple)))) {
      int64_t count = std::max<int64_t>(0, IntOf(n));
      if (seq.is_string()) {
        size_t len = seq.as_string().size();
        if (len > 0 && static_cast<uint64_t>(count) > options_.limits.max_output_bytes / len)
          return CheckString(options_.limits.max_output_bytes + 1);
        std::string r;
        r.reserve(len * count);
        for (int64_t i = 0; i < count; ++i) r += seq.as_string();
        return Value::Str(std::move(r));
      }
      size_t len = seq.list()->items.size();
      if (len > 0 && static_cast<uint64_t>(count) > 10'000'000 / len)
        return Error("list repetition too large");
      LUMEN_RETURN_IF_ERROR(Charge(static_cast<int64_t>(len * count)));
      std::vector<Value> items;
      for (int64_t i = 0; i < count; ++i)
        items.insert(items.end(), seq.list()->items.begin(), seq.list()->items.end());
      return Value::List(std::move(items), seq.list()->kind);
    }
    return type_error();
  }
  if (op == "%" && a.is_string())
    return Error("unsupported construct: printf-style string formatting with '%'");
  return type_error();
}

Result<Value> Interpreter::Contains(const Value& container, const Value& item) {
  if (container.is_string()) {
    if (!item.is_string()) {
      if (item.is_undefined()) return UndefinedError(item);
      return Errorf("'in <string>' requires string as left operand, not {}", TypeName(item));
    }
    return Value::Bool(container.as_string().find(item.as_string()) != std::string::npos);
  }
  if (container.is_dict()) {
    if (item.is_list() || item.is_dict()) return Errorf("unhashable type: '{}'", TypeName(item));
    return Value::Bool(container.dict()->Find(item) != nullptr);
  }
  if (container.is_list() || container.is_undefined()) {
    LUMEN_ASSIGN_OR_RETURN(std::vector<Value> items, Iterate(container));
    for (const auto& v : items)
      if (Equals(v, item)) return Value::Bool(true);
    return Value::Bool(false);
  }
  return Errorf("argument of type '{}' is not iterable", TypeName(container));
}

Result<Value> Interpreter::EvalCompare(const Expr& e, const FramePtr& f) {
  LUMEN_ASSIGN_OR_RETURN(Value left, Eval(*e.args[0], f));
  for (size_t i = 0; i < e.ops.size(); ++i) {
    LUMEN_ASSIGN_OR_RETURN(Value right, Eval(*e.args[i + 1], f));
    const std::string& op = e.ops[i];
    bool r;
    if (op == "==") {
      r = Equals(left, right);
    } else if (op == "!=") {
      r = !Equals(left, right);
    } else if (op == "in" || op == "notin") {
      LUMEN_ASSIGN_OR_RETURN(Value c, Contains(right, left));
      r = c.as_bool() == (op == "in");
    } else {
      LUMEN_ASSIGN_OR_RETURN(int c, Compare(left, right));
      r = op == "<" ? c < 0 : op == "<=" ? c <= 0 : op == ">" ? c > 0 : c >= 0;
    }
    if (!r) return Value::Bool(false);
    left = std::move(right);
  }
  return Value::Bool(true);
}

Result<Value> Interpreter::EvalSlice(const Expr& e, const FramePtr& f) {
  LUMEN_ASSIGN_OR_RETURN(Value obj, Eval(*e.args[0], f));
  std::optional<int64_t> parts[3];
  for (int i = 0; i < 3; ++i) {
    if (!e.args[i + 1]) continue;
    LUMEN_ASSIGN_OR_RETURN(Value v, Eval(*e.args[i + 1], f));
    if (v.is_none()) continue;
    if (!IsIntLike(v))
      return Value::Undef("slice indices must be integers or None");  // Jinja: TypeError
    parts[i] = IntOf(v);
  }
  if (obj.is_undefined()) return UndefinedError(obj);
  int64_t step = parts[2].value_or(1);
  if (step == 0) return Error("slice step cannot be zero");
  bool is_str = obj.is_string();
  if (!is_str && !(obj.is_list() &&
                   (obj.list()->kind == ListKind::kList || obj.list()->kind == ListKind::kTuple)))
    return Value::Undef(fmt::format("'{}' object is not subscriptable", TypeName(obj)));
  std::u32string chars;
  if (is_str) chars = pystr::Decode(obj.as_string());
  int64_t len =
      is_str ? static_cast<int64_t>(chars.size()) : static_cast<int64_t>(obj.list()->items.size());
  // CPython's PySlice_AdjustIndices.
  auto adjust = [&](std::optional<int64_t> v, int64_t def_pos, int64_t def_neg) -> int64_t {
    if (!v) return step > 0 ? def_pos : def_neg;
    int64_t x = *v;
    if (x < 0) {
      x += len;
      if (x < 0) x = step < 0 ? -1 : 0;
    } else if (x >= len) {
      x = step < 0 ? len - 1 : len;
    }
    return x;
  };
  int64_t start = adjust(parts[0], 0, len - 1);
  int64_t stop = adjust(parts[1], len, -1);
  std::vector<int64_t> idx;
  if (step > 0) {
    for (int64_t i = start; i < stop; i += step) idx.push_back(i);
  } else {
    for (int64_t i = start; i > stop; i += step) idx.push_back(i);
  }
  LUMEN_RETURN_IF_ERROR(Charge(static_cast<int64_t>(idx.size())));
  if (is_str) {
    std::u32string r;
    for (int64_t i : idx) r.push_back(chars[i]);
    return Value::Str(pystr::Encode(r));
  }
  std::vector<Value> items;
  items.reserve(idx.size());
  for (int64_t i : idx) items.push_back(obj.list()->items[i]);
  return Value::List(std::move(items), obj.list()->kind);
}

Result<Value> Interpreter::Call(const Value& fn, CallArgs args, const Expr* at) {
  if (fn.is_undefined()) return UndefinedError(fn);
  if (!fn.is_callable()) return Errorf("'{}' object is not callable", TypeName(fn));
  const Callable& c = *fn.fn();
  switch (c.type) {
    case Callable::Type::kMacro:
    case Callable::Type::kCaller:
      return CallMacro(c, std::move(args));
    case Callable::Type::kMethod:
      return CallMethod(c, args);
    case Callable::Type::kGlobal:
      return CallGlobal(c, args);
  }
  return Error("bad callable");
}

Result<Value> Interpreter::CallMacro(const Callable& m, CallArgs args) {
  if (call_depth_ >= options_.limits.max_call_depth)
    return Errorf("macro recursion deeper than {} calls (in '{}')", options_.limits.max_call_depth,
                  m.name);
  LUMEN_RETURN_IF_ERROR(Charge(1));
  const Stmt& s = *m.stmt;
  auto frame = std::make_shared<Frame>();
  frame->parent = m.closure.lock();
  if (!frame->parent) return Errorf("macro '{}' called after its scope ended", m.name);
  const auto& params = s.params;
  std::vector<bool> bound(params.size(), false);
  std::vector<Value> varargs;
  for (size_t i = 0; i < args.pos.size(); ++i) {
    if (i < params.size()) {
      frame->Set(params[i].name, args.pos[i]);
      bound[i] = true;
    } else if (s.uses_varargs && m.type == Callable::Type::kMacro) {
      varargs.push_back(args.pos[i]);
    } else {
      return Errorf("macro '{}' takes not more than {} argument(s)", m.name, params.size());
    }
  }
  std::vector<std::pair<Value, Value>> kwargs;
  bool has_caller = false;
  for (auto& [k, v] : args.kw) {
    bool matched = false;
    for (size_t i = 0; i < params.size(); ++i) {
      if (params[i].name == k) {
        if (bound[i]) return Errorf("macro '{}' got multiple values for argument '{}'", m.name, k);
        frame->Set(k, v);
        bound[i] = true;
        matched = true;
      }
    }
    if (matched) continue;
    if (k == "caller" && m.type == Callable::Type::kMacro && s.uses_caller) {
      frame->Set("caller", v);
      has_caller = true;
    } else if (s.uses_kwargs && m.type == Callable::Type::kMacro) {
      kwargs.emplace_back(Value::Str(k), v);
    } else {
      return Errorf("macro '{}' takes no keyword argument '{}'", m.name, k);
    }
  }
  ++call_depth_;
  struct Dec {
    int& d;
    ~Dec() { --d; }
  } dec{call_depth_};
  for (size_t i = 0; i < params.size(); ++i) {
    if (bound[i]) continue;
    if (params[i].default_value) {
      LUMEN_ASSIGN_OR_RETURN(Value v, Eval(*params[i].default_value, frame));
      frame->Set(params[i].name, std::move(v));
    } else {
      frame->Set(params[i].name,
                 Value::Undef(fmt::format("parameter '{}' was not provided", params[i].name)));
    }
  }
  if (m.type == Callable::Type::kMacro) {
    if (s.uses_varargs) {
      LUMEN_ASSIGN_OR_RETURN(Value va, Value::List(std::move(varargs), ListKind::kTuple));
      frame->Set("varargs", std::move(va));
    }
    if (s.uses_kwargs) {
      LUMEN_ASSIGN_OR_RETURN(Value kw, Value::Dict(std::move(kwargs)));
      frame->Set("kwargs", std::move(kw));
    }
    if (s.uses_caller && !has_caller) frame->Set("caller", Value::Undef("No caller defined"));
  }
  std::string out;
  Flow saved = flow_;
  flow_ = Flow::kNormal;
  LUMEN_RETURN_IF_ERROR(Exec(s.body, frame, out));
  flow_ = saved;
  return Value::Str(std::move(out));
}

}  // namespace lumen::tokenize
