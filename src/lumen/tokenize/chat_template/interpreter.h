// Evaluator for parsed chat templates (internal to chat_template/).
//
// Walks the syntax tree with Jinja2's semantics under Hugging Face's
// ImmutableSandboxedEnvironment: lexical frames (for/macro/with/set-block open
// a scope, if does not), Python truthiness and operators, sandboxed attribute
// lookup (dict methods shadow keys on `.`, mutating methods are unsafe), and
// the default Undefined. Every render is bounded: output bytes, evaluation
// depth, macro recursion and total steps, each failing with a clear message.
#pragma once

#include <ctime>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "lumen/core/status.h"
#include "lumen/tokenize/chat_template/ast.h"
#include "lumen/tokenize/chat_template/value.h"

namespace lumen::tokenize {

struct RenderLimits {
  size_t max_output_bytes = size_t{16} << 20;  // also bounds any one string value
  int max_call_depth = 256;                    // nested macro calls
  int max_eval_depth = 1000;                   // nested evaluation (tree depth + calls)
  int64_t max_steps = 20'000'000;              // statements + expressions + loop items
};

struct RenderOptions {
  RenderLimits limits;
  // Time strftime_now() formats (local time); nullopt: the current time.
  std::optional<std::time_t> now;
};

struct Frame {
  std::shared_ptr<Frame> parent;
  std::vector<std::pair<std::string, Value>> vars;
  Value* FindLocal(std::string_view name);
  void Set(std::string_view name, Value v);
};
using FramePtr = std::shared_ptr<Frame>;

struct Callable {
  enum class Type { kMacro, kCaller, kMethod, kGlobal };
  Type type;
  std::string name;
  const Stmt* stmt = nullptr;    // kMacro: the macro; kCaller: the call block
  std::weak_ptr<Frame> closure;  // weak: a frame holding its own macro is no cycle
  Value receiver;                // kMethod
};

struct LoopData {
  std::shared_ptr<ListData> items;
  int64_t index0 = 0;
  Value last_changed;
  bool has_changed = false;
};

struct CallArgs {
  std::vector<Value> pos;
  std::vector<std::pair<std::string, Value>> kw;
};

class Interpreter {
 public:
  explicit Interpreter(const RenderOptions& options) : options_(options) {}

  Result<std::string> Render(const Template& tmpl, const Value& context);

  // ---- used by builtins.cc ----
  Result<Value> GetAttr(const Value& obj, const std::string& name);
  Result<Value> GetItem(const Value& obj, const Value& key);
  Result<Value> Call(const Value& fn, CallArgs args, const Expr* at);
  Result<Value> ApplyFilter(const std::string& name, const Value& v, CallArgs args, const Expr* at);
  Result<bool> ApplyTest(const std::string& name, const Value& v, CallArgs args);
  Result<Value> CallMethod(const Callable& m, CallArgs& args);
  Result<Value> CallGlobal(const Callable& g, CallArgs& args);
  Result<std::vector<Value>> Iterate(const Value& v);
  Status CheckString(size_t bytes) const;
  Status Charge(int64_t steps);
  Result<Value> Contains(const Value& container, const Value& item);

 private:
  Result<Value> Eval(const Expr& e, const FramePtr& f);
  Result<Value> EvalInner(const Expr& e, const FramePtr& f);
  Status Exec(const Body& body, const FramePtr& f, std::string& out);
  Status ExecStmt(const Stmt& s, const FramePtr& f, std::string& out);
  Status ExecFor(const Stmt& s, const FramePtr& f, std::string& out);
  Status Assign(const Target& t, const Value& v, const FramePtr& f, const Stmt& at);
  Result<Value> Lookup(const std::string& name, const FramePtr& f);
  Result<Value> EvalBinary(const Expr& e, const Value& a, const Value& b);
  Result<Value> EvalCompare(const Expr& e, const FramePtr& f);
  Result<Value> EvalSlice(const Expr& e, const FramePtr& f);
  Result<CallArgs> EvalArgs(const Expr& e, size_t first, const FramePtr& f);
  Result<Value> CallMacro(const Callable& m, CallArgs args);
  Result<std::string> ApplyFilterChain(const std::vector<ExprPtr>& filters, std::string s,
                                       const FramePtr& f);
  Status Append(std::string& out, std::string_view s) const;
  Status At(const Expr& e, Status s) const;

  enum class Flow { kNormal, kBreak, kContinue };
  const RenderOptions& options_;
  Flow flow_ = Flow::kNormal;
  int depth_ = 0;
  int call_depth_ = 0;
  int64_t steps_ = 0;
};

// "line:col" of an expression, for messages.
std::string Where(const Expr& e);

}  // namespace lumen::tokenize
