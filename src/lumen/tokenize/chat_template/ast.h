// Syntax tree of a parsed chat template (the Jinja2 subset).
//
// Expressions and statements are plain structs owned by unique_ptr; every
// node records its source line:column for error messages. Parse bounds the
// depth of every expression tree (kMaxExprDepth) and statement nesting
// (kMaxStmtDepth) so evaluating the tree cannot overflow the stack.
#pragma once

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "lumen/tokenize/chat_template/value.h"

namespace lumen::tokenize {

inline constexpr int kMaxExprDepth = 256;
inline constexpr int kMaxStmtDepth = 256;

struct Expr;
using ExprPtr = std::unique_ptr<Expr>;

struct Expr {
  enum class Kind {
    kConst,     // value
    kName,      // name
    kList,      // args = items
    kTuple,     // args = items
    kDict,      // args = k0, v0, k1, v1, ...
    kGetAttr,   // args[0] . name
    kGetItem,   // args[0] [ args[1] ]
    kSlice,     // args[0] [ args[1] : args[2] : args[3] ] (null parts allowed)
    kCall,      // args[0] ( args[1..], kwargs )
    kFilter,    // args[0] | name ( args[1..], kwargs ); args[0] null in filter blocks
    kTest,      // args[0] is name ( args[1..], kwargs )
    kNeg,       // - args[0]
    kPos,       // + args[0]
    kNot,       // not args[0]
    kBinary,    // args[0] name args[1]: + - * / // % ** ~
    kAnd,       // args[0] and args[1]
    kOr,        // args[0] or args[1]
    kCompare,   // args[0] ops[0] args[1] ops[1] args[2] ...
    kCondExpr,  // args[1] if args[0] else args[2] (args[2] may be null)
  };
  Kind kind;
  int line = 0;
  int column = 0;
  int depth = 1;
  Value value;
  std::string name;
  std::vector<ExprPtr> args;
  std::vector<std::pair<std::string, ExprPtr>> kwargs;
  std::vector<std::string> ops;
};

struct Stmt;
using StmtPtr = std::unique_ptr<Stmt>;
using Body = std::vector<StmtPtr>;

// Assignment target: one or more names, or namespace attribute `ns.attr`.
struct Target {
  std::vector<std::string> names;
  bool is_tuple = false;
  std::string attr;  // non-empty: names[0].attr
};

struct MacroParam {
  std::string name;
  ExprPtr default_value;  // may be null
};

struct Stmt {
  enum class Kind {
    kOutput,       // text
    kPrint,        // expr
    kIf,           // conds[i] -> bodies[i]; else_body
    kFor,          // target in expr [if cond] body [else else_body]
    kSet,          // target = expr
    kSetBlock,     // target [| filters] body
    kMacro,        // name(params) body
    kCallBlock,    // call[(params)] expr body
    kFilterBlock,  // filters body
    kWith,         // targets/values body
    kBreak,
    kContinue,
    kGeneration,  // HF's {% generation %}: body rendered as is
  };
  Kind kind;
  int line = 0;
  int column = 0;
  std::string text;
  ExprPtr expr;
  ExprPtr cond;
  std::vector<ExprPtr> conds;
  std::vector<Body> bodies;
  Body body;
  Body else_body;
  Target target;
  std::vector<ExprPtr> filters;  // kFilter nodes with null subject
  std::string name;
  std::vector<MacroParam> params;
  bool uses_varargs = false;
  bool uses_kwargs = false;
  bool uses_caller = false;
  std::vector<Target> with_targets;
  std::vector<ExprPtr> with_values;
};

struct Template {
  Body body;
};

}  // namespace lumen::tokenize
