#include "lumen/tokenize/chat_template/parser.h"

#include <algorithm>
#include <array>

#include "lumen/tokenize/chat_template/lexer.h"

namespace lumen::tokenize {
namespace {

constexpr std::array<std::string_view, 40> kSupportedFilters = {
    "abs",      "attr",   "capitalize", "center",     "count",      "d",           "default",
    "dictsort", "e",      "escape",     "first",      "float",      "forceescape", "indent",
    "int",      "items",  "join",       "last",       "length",     "list",        "lower",
    "map",      "max",    "min",        "reject",     "rejectattr", "replace",     "reverse",
    "round",    "safe",   "select",     "selectattr", "sort",       "string",      "sum",
    "title",    "tojson", "trim",       "unique",     "upper"};
constexpr std::array<std::string_view, 15> kUnsupportedJinjaFilters = {
    "wordcount", "batch",    "filesizeformat", "format", "groupby",  "pprint",  "random", "slice",
    "striptags", "truncate", "urlencode",      "urlize", "wordwrap", "xmlattr", "unsafe"};
constexpr std::array<std::string_view, 39> kSupportedTests = {
    "odd",     "even",        "divisibleby", "defined",  "undefined", "none",   "boolean",
    "false",   "true",        "integer",     "float",    "lower",     "upper",  "string",
    "mapping", "number",      "sequence",    "iterable", "callable",  "sameas", "escaped",
    "in",      "==",          "eq",          "equalto",  "!=",        "ne",     ">",
    "gt",      "greaterthan", ">=",          "ge",       "<",         "lt",     "lessthan",
    "<=",      "le",          "filter",      "test"};

template <size_t N>
bool Contains(const std::array<std::string_view, N>& a, std::string_view s) {
  return std::find(a.begin(), a.end(), s) != a.end();
}

class Parser {
 public:
  explicit Parser(std::vector<Token> tokens) : toks_(std::move(tokens)) {}

  Result<Template> Run() {
    Template t;
    LUMEN_ASSIGN_OR_RETURN(t.body, ParseBody({}));
    if (Cur().type != TokenType::kEof) return Fail(Cur(), "unexpected tag");
    return t;
  }

 private:
  const Token& Cur() const { return toks_[pos_]; }
  const Token& Look(size_t k = 1) const { return toks_[std::min(pos_ + k, toks_.size() - 1)]; }
  void Advance() {
    if (pos_ + 1 < toks_.size()) ++pos_;
  }
  bool IsOp(std::string_view op) const {
    return Cur().type == TokenType::kOperator && Cur().text == op;
  }
  bool IsName(std::string_view name) const {
    return Cur().type == TokenType::kName && Cur().text == name;
  }
  static std::string Describe(const Token& t) {
    switch (t.type) {
      case TokenType::kEof:
        return "end of template";
      case TokenType::kBlockEnd:
        return "end of statement block";
      case TokenType::kVarEnd:
        return "end of print statement";
      case TokenType::kData:
        return "template data";
      case TokenType::kString:
        return "string literal";
      default:
        return "'" + t.text + "'";
    }
  }
  Status Fail(const Token& t, std::string_view what) const {
    return Errorf("template syntax error at {}:{}: {}", t.line, t.column, what);
  }
  Status Expected(std::string_view what) const {
    return Fail(Cur(), fmt::format("expected {}, got {}", what, Describe(Cur())));
  }
  Status ExpectOp(std::string_view op) {
    if (!IsOp(op)) return Expected(fmt::format("'{}'", op));
    Advance();
    return Status::Ok();
  }
  Result<std::string> ExpectName() {
    if (Cur().type != TokenType::kName) return Expected("a name");
    std::string n = Cur().text;
    Advance();
    return n;
  }
  Status ExpectBlockEnd() {
    if (Cur().type != TokenType::kBlockEnd) return Expected("end of statement block '%}'");
    Advance();
    return Status::Ok();
  }

  Result<ExprPtr> Node(Expr::Kind kind, const Token& at, std::vector<ExprPtr> args = {}) {
    auto e = std::make_unique<Expr>();
    e->kind = kind;
    e->line = at.line;
    e->column = at.column;
    int d = 0;
    for (const auto& a : args)
      if (a) d = std::max(d, a->depth);
    e->args = std::move(args);
    e->depth = d + 1;
    if (e->depth > kMaxExprDepth)
      return Fail(at, fmt::format("expression nested deeper than {} levels", kMaxExprDepth));
    return e;
  }
  Status Rebalance(Expr& e) {
    int d = 0;
    for (const auto& a : e.args)
      if (a) d = std::max(d, a->depth);
    for (const auto& kw : e.kwargs) d = std::max(d, kw.second->depth);
    e.depth = d + 1;
    if (e.depth > kMaxExprDepth)
      return Errorf("template syntax error at {}:{}: expression nested deeper than {} levels",
                    e.line, e.column, kMaxExprDepth);
    return Status::Ok();
  }

  // Guards parser recursion (parentheses, unary chains, nested literals).
  struct DepthGuard {
    explicit DepthGuard(int& d) : d_(d) { ++d_; }
    ~DepthGuard() { --d_; }
    int& d_;
  };
  Status CheckDepth() const {
    if (nest_ > kMaxExprDepth)
      return Fail(Cur(), fmt::format("expression nested deeper than {} levels", kMaxExprDepth));
    return Status::Ok();
  }

  // ---- statements ----

  // Parses until a block tag whose name is in `ends`; leaves Cur() at that name.
  Result<Body> ParseBody(const std::vector<std::string_view>& ends) {
    if (++stmt_depth_ > kMaxStmtDepth) {
      return Fail(Cur(), fmt::format("statements nested deeper than {} levels", kMaxStmtDepth));
    }
    Body body;
    while (true) {
      const Token& t = Cur();
      if (t.type == TokenType::kEof) {
        if (!ends.empty()) {
          std::string names;
          for (auto e : ends) names += (names.empty() ? "'" : ", '") + std::string(e) + "'";
          return Fail(t, fmt::format("unexpected end of template, expected {}", names));
        }
        break;
      }
      if (t.type == TokenType::kData) {
        auto s = std::make_unique<Stmt>();
        s->kind = Stmt::Kind::kOutput;
        s->line = t.line;
        s->column = t.column;
        s->text = t.text;
        body.push_back(std::move(s));
        Advance();
      } else if (t.type == TokenType::kVarBegin) {
        Advance();
        auto s = std::make_unique<Stmt>();
        s->kind = Stmt::Kind::kPrint;
        s->line = t.line;
        s->column = t.column;
        LUMEN_ASSIGN_OR_RETURN(s->expr, ParseTuple(true, {}, false));
        if (Cur().type != TokenType::kVarEnd) return Expected("end of print statement '}}'");
        Advance();
        body.push_back(std::move(s));
      } else if (t.type == TokenType::kBlockBegin) {
        const Token& name = Look();
        if (name.type == TokenType::kName &&
            std::find(ends.begin(), ends.end(), name.text) != ends.end()) {
          Advance();
          break;
        }
        Advance();
        LUMEN_ASSIGN_OR_RETURN(StmtPtr s, ParseStatement());
        body.push_back(std::move(s));
      } else {
        return Fail(t, fmt::format("unexpected {}", Describe(t)));
      }
    }
    --stmt_depth_;
    return body;
  }

  Result<StmtPtr> ParseStatement() {
    const Token& t = Cur();
    if (t.type != TokenType::kName) return Fail(t, "tag name expected");
    auto s = std::make_unique<Stmt>();
    s->line = t.line;
    s->column = t.column;
    const std::string name = t.text;
    if (name == "for") return ParseFor(std::move(s));
    if (name == "if") return ParseIf(std::move(s));
    if (name == "set") return ParseSet(std::move(s));
    if (name == "macro") return ParseMacro(std::move(s));
    if (name == "call") return ParseCallBlock(std::move(s));
    if (name == "filter") return ParseFilterBlock(std::move(s));
    if (name == "with") return ParseWith(std::move(s));
    if (name == "generation") {
      Advance();
      s->kind = Stmt::Kind::kGeneration;
      LUMEN_RETURN_IF_ERROR(ExpectBlockEnd());
      LUMEN_ASSIGN_OR_RETURN(s->body, ParseBody({"endgeneration"}));
      Advance();
      LUMEN_RETURN_IF_ERROR(ExpectBlockEnd());
      return s;
    }
    if (name == "break" || name == "continue") {
      if (loop_depth_ == 0) return Fail(t, fmt::format("'{}' outside of a loop", name));
      Advance();
      s->kind = name == "break" ? Stmt::Kind::kBreak : Stmt::Kind::kContinue;
      LUMEN_RETURN_IF_ERROR(ExpectBlockEnd());
      return s;
    }
    static constexpr std::array<std::string_view, 12> kUnsupported = {
        "include", "extends", "block", "import", "from",  "autoescape",
        "do",      "trans",   "raw",   "print",  "debug", "pluralize"};
    if (Contains(kUnsupported, name))
      return Fail(t, fmt::format("unsupported construct '{{% {} %}}'", name));
    return Fail(t, fmt::format("unknown tag '{}'", name));
  }

  Result<Target> ParseTarget(bool with_namespace) {
    Target target;
    if (with_namespace && Cur().type == TokenType::kName && Look().type == TokenType::kOperator &&
        Look().text == "." && Look(2).type == TokenType::kName) {
      target.names.push_back(Cur().text);
      target.attr = Look(2).text;
      Advance();
      Advance();
      Advance();
      return target;
    }
    bool paren = IsOp("(");
    if (paren) Advance();
    while (true) {
      LUMEN_ASSIGN_OR_RETURN(std::string n, ExpectName());
      target.names.push_back(std::move(n));
      if (!IsOp(",")) break;
      target.is_tuple = true;
      Advance();
      if (Cur().type != TokenType::kName) break;  // trailing comma
    }
    if (paren) LUMEN_RETURN_IF_ERROR(ExpectOp(")"));
    for (const auto& n : target.names)
      if (n == "true" || n == "false" || n == "none" || n == "True" || n == "False" || n == "None")
        return Fail(Cur(), fmt::format("cannot assign to '{}'", n));
    return target;
  }

  Result<StmtPtr> ParseFor(StmtPtr s) {
    Advance();
    s->kind = Stmt::Kind::kFor;
    LUMEN_ASSIGN_OR_RETURN(s->target, ParseTarget(false));
    if (!IsName("in")) return Expected("'in'");
    Advance();
    LUMEN_ASSIGN_OR_RETURN(s->expr, ParseTuple(false, {"recursive"}, false));
    if (IsName("if")) {
      Advance();
      LUMEN_ASSIGN_OR_RETURN(s->cond, ParseExpression(true));
    }
    if (IsName("recursive")) return Fail(Cur(), "unsupported construct 'recursive' for-loop");
    LUMEN_RETURN_IF_ERROR(ExpectBlockEnd());
    ++loop_depth_;
    LUMEN_ASSIGN_OR_RETURN(s->body, ParseBody({"endfor", "else"}));
    --loop_depth_;
    if (IsName("else")) {
      Advance();
      LUMEN_RETURN_IF_ERROR(ExpectBlockEnd());
      LUMEN_ASSIGN_OR_RETURN(s->else_body, ParseBody({"endfor"}));
    }
    Advance();
    LUMEN_RETURN_IF_ERROR(ExpectBlockEnd());
    return s;
  }

  Result<StmtPtr> ParseIf(StmtPtr s) {
    Advance();
    s->kind = Stmt::Kind::kIf;
    while (true) {
      LUMEN_ASSIGN_OR_RETURN(ExprPtr cond, ParseTuple(false, {}, false));
      LUMEN_RETURN_IF_ERROR(ExpectBlockEnd());
      LUMEN_ASSIGN_OR_RETURN(Body body, ParseBody({"elif", "else", "endif"}));
      s->conds.push_back(std::move(cond));
      s->bodies.push_back(std::move(body));
      if (IsName("elif")) {
        Advance();
        continue;
      }
      if (IsName("else")) {
        Advance();
        LUMEN_RETURN_IF_ERROR(ExpectBlockEnd());
        LUMEN_ASSIGN_OR_RETURN(s->else_body, ParseBody({"endif"}));
      }
      break;
    }
    Advance();
    LUMEN_RETURN_IF_ERROR(ExpectBlockEnd());
    return s;
  }

  Result<StmtPtr> ParseSet(StmtPtr s) {
    Advance();
    LUMEN_ASSIGN_OR_RETURN(s->target, ParseTarget(true));
    if (IsOp("=")) {
      Advance();
      s->kind = Stmt::Kind::kSet;
      LUMEN_ASSIGN_OR_RETURN(s->expr, ParseTuple(true, {}, false));
      LUMEN_RETURN_IF_ERROR(ExpectBlockEnd());
      return s;
    }
    s->kind = Stmt::Kind::kSetBlock;
    LUMEN_RETURN_IF_ERROR(ParseFilterChain(s->filters, false));
    LUMEN_RETURN_IF_ERROR(ExpectBlockEnd());
    LUMEN_ASSIGN_OR_RETURN(s->body, ParseBody({"endset"}));
    Advance();
    LUMEN_RETURN_IF_ERROR(ExpectBlockEnd());
    return s;
  }

  Status ParseParams(std::vector<MacroParam>& params) {
    LUMEN_RETURN_IF_ERROR(ExpectOp("("));
    while (!IsOp(")")) {
      if (!params.empty()) LUMEN_RETURN_IF_ERROR(ExpectOp(","));
      if (IsOp(")")) break;
      MacroParam p;
      LUMEN_ASSIGN_OR_RETURN(p.name, ExpectName());
      if (IsOp("=")) {
        Advance();
        LUMEN_ASSIGN_OR_RETURN(p.default_value, ParseExpression(true));
      } else if (!params.empty() && params.back().default_value) {
        return Fail(Cur(), "non-default argument follows default argument");
      }
      params.push_back(std::move(p));
    }
    Advance();
    return Status::Ok();
  }

  Result<StmtPtr> ParseMacro(StmtPtr s) {
    Advance();
    s->kind = Stmt::Kind::kMacro;
    LUMEN_ASSIGN_OR_RETURN(s->name, ExpectName());
    LUMEN_RETURN_IF_ERROR(ParseParams(s->params));
    LUMEN_RETURN_IF_ERROR(ExpectBlockEnd());
    macros_.push_back(s.get());
    int saved_loop = loop_depth_;
    loop_depth_ = 0;
    LUMEN_ASSIGN_OR_RETURN(s->body, ParseBody({"endmacro"}));
    loop_depth_ = saved_loop;
    macros_.pop_back();
    Advance();
    LUMEN_RETURN_IF_ERROR(ExpectBlockEnd());
    return s;
  }

  Result<StmtPtr> ParseCallBlock(StmtPtr s) {
    Advance();
    s->kind = Stmt::Kind::kCallBlock;
    if (IsOp("(")) LUMEN_RETURN_IF_ERROR(ParseParams(s->params));
    LUMEN_ASSIGN_OR_RETURN(s->expr, ParseExpression(true));
    if (s->expr->kind != Expr::Kind::kCall) return Fail(Cur(), "expected a call in '{% call %}'");
    LUMEN_RETURN_IF_ERROR(ExpectBlockEnd());
    macros_.push_back(s.get());
    int saved_loop = loop_depth_;
    loop_depth_ = 0;
    LUMEN_ASSIGN_OR_RETURN(s->body, ParseBody({"endcall"}));
    loop_depth_ = saved_loop;
    macros_.pop_back();
    Advance();
    LUMEN_RETURN_IF_ERROR(ExpectBlockEnd());
    return s;
  }

  Result<StmtPtr> ParseFilterBlock(StmtPtr s) {
    Advance();
    s->kind = Stmt::Kind::kFilterBlock;
    LUMEN_RETURN_IF_ERROR(ParseFilterChain(s->filters, true));
    LUMEN_RETURN_IF_ERROR(ExpectBlockEnd());
    LUMEN_ASSIGN_OR_RETURN(s->body, ParseBody({"endfilter"}));
    Advance();
    LUMEN_RETURN_IF_ERROR(ExpectBlockEnd());
    return s;
  }

  Result<StmtPtr> ParseWith(StmtPtr s) {
    Advance();
    s->kind = Stmt::Kind::kWith;
    while (Cur().type != TokenType::kBlockEnd) {
      if (!s->with_targets.empty()) LUMEN_RETURN_IF_ERROR(ExpectOp(","));
      LUMEN_ASSIGN_OR_RETURN(Target t, ParseTarget(false));
      LUMEN_RETURN_IF_ERROR(ExpectOp("="));
      LUMEN_ASSIGN_OR_RETURN(ExprPtr v, ParseExpression(true));
      s->with_targets.push_back(std::move(t));
      s->with_values.push_back(std::move(v));
    }
    Advance();
    LUMEN_ASSIGN_OR_RETURN(s->body, ParseBody({"endwith"}));
    Advance();
    LUMEN_RETURN_IF_ERROR(ExpectBlockEnd());
    return s;
  }

  // `| name(args) | name ...`; start_inline: the first filter has no leading '|'.
  Status ParseFilterChain(std::vector<ExprPtr>& out, bool start_inline) {
    while (IsOp("|") || start_inline) {
      if (!start_inline) Advance();
      start_inline = false;
      LUMEN_ASSIGN_OR_RETURN(ExprPtr f, ParseFilterTail(nullptr));
      out.push_back(std::move(f));
    }
    return Status::Ok();
  }

  // ---- expressions ----

  bool IsTupleEnd(const std::vector<std::string_view>& extra) const {
    const Token& t = Cur();
    if (t.type == TokenType::kVarEnd || t.type == TokenType::kBlockEnd ||
        t.type == TokenType::kEof || (t.type == TokenType::kOperator && t.text == ")"))
      return true;
    return t.type == TokenType::kName &&
           std::find(extra.begin(), extra.end(), t.text) != extra.end();
  }

  Result<ExprPtr> ParseTuple(bool with_condexpr, const std::vector<std::string_view>& extra,
                             bool explicit_parens) {
    const Token start = Cur();
    std::vector<ExprPtr> items;
    bool is_tuple = false;
    while (true) {
      if (!items.empty()) LUMEN_RETURN_IF_ERROR(ExpectOp(","));
      if (IsTupleEnd(extra)) break;
      LUMEN_ASSIGN_OR_RETURN(ExprPtr e, ParseExpression(with_condexpr));
      items.push_back(std::move(e));
      if (IsOp(","))
        is_tuple = true;
      else
        break;
    }
    if (!is_tuple) {
      if (!items.empty()) return std::move(items[0]);
      if (!explicit_parens) return Expected("an expression");
    }
    return Node(Expr::Kind::kTuple, start, std::move(items));
  }

  Result<ExprPtr> ParseExpression(bool with_condexpr) {
    DepthGuard g(nest_);
    LUMEN_RETURN_IF_ERROR(CheckDepth());
    if (with_condexpr) return ParseCondExpr();
    return ParseOr();
  }

  Result<ExprPtr> ParseCondExpr() {
    LUMEN_ASSIGN_OR_RETURN(ExprPtr expr1, ParseOr());
    while (IsName("if")) {
      const Token at = Cur();
      Advance();
      LUMEN_ASSIGN_OR_RETURN(ExprPtr cond, ParseOr());
      ExprPtr expr3;
      if (IsName("else")) {
        Advance();
        DepthGuard g(nest_);
        LUMEN_RETURN_IF_ERROR(CheckDepth());
        LUMEN_ASSIGN_OR_RETURN(expr3, ParseCondExpr());
      }
      std::vector<ExprPtr> args;
      args.push_back(std::move(cond));
      args.push_back(std::move(expr1));
      args.push_back(std::move(expr3));
      LUMEN_ASSIGN_OR_RETURN(expr1, Node(Expr::Kind::kCondExpr, at, std::move(args)));
    }
    return expr1;
  }

  Result<ExprPtr> ParseOr() {
    LUMEN_ASSIGN_OR_RETURN(ExprPtr left, ParseAnd());
    while (IsName("or")) {
      const Token at = Cur();
      Advance();
      LUMEN_ASSIGN_OR_RETURN(ExprPtr right, ParseAnd());
      std::vector<ExprPtr> args;
      args.push_back(std::move(left));
      args.push_back(std::move(right));
      LUMEN_ASSIGN_OR_RETURN(left, Node(Expr::Kind::kOr, at, std::move(args)));
    }
    return left;
  }

  Result<ExprPtr> ParseAnd() {
    LUMEN_ASSIGN_OR_RETURN(ExprPtr left, ParseNot());
    while (IsName("and")) {
      const Token at = Cur();
      Advance();
      LUMEN_ASSIGN_OR_RETURN(ExprPtr right, ParseNot());
      std::vector<ExprPtr> args;
      args.push_back(std::move(left));
      args.push_back(std::move(right));
      LUMEN_ASSIGN_OR_RETURN(left, Node(Expr::Kind::kAnd, at, std::move(args)));
    }
    return left;
  }

  Result<ExprPtr> ParseNot() {
    if (IsName("not")) {
      const Token at = Cur();
      Advance();
      DepthGuard g(nest_);
      LUMEN_RETURN_IF_ERROR(CheckDepth());
      LUMEN_ASSIGN_OR_RETURN(ExprPtr inner, ParseNot());
      std::vector<ExprPtr> args;
      args.push_back(std::move(inner));
      return Node(Expr::Kind::kNot, at, std::move(args));
    }
    return ParseCompare();
  }

  Result<ExprPtr> ParseCompare() {
    const Token at = Cur();
    LUMEN_ASSIGN_OR_RETURN(ExprPtr first, ParseMath1());
    std::vector<ExprPtr> args;
    std::vector<std::string> ops;
    args.push_back(std::move(first));
    while (true) {
      std::string op;
      if (Cur().type == TokenType::kOperator &&
          (Cur().text == "==" || Cur().text == "!=" || Cur().text == "<" || Cur().text == "<=" ||
           Cur().text == ">" || Cur().text == ">=")) {
        op = Cur().text;
        Advance();
      } else if (IsName("in")) {
        op = "in";
        Advance();
      } else if (IsName("not") && Look().type == TokenType::kName && Look().text == "in") {
        op = "notin";
        Advance();
        Advance();
      } else {
        break;
      }
      LUMEN_ASSIGN_OR_RETURN(ExprPtr rhs, ParseMath1());
      args.push_back(std::move(rhs));
      ops.push_back(std::move(op));
    }
    if (ops.empty()) return std::move(args[0]);
    LUMEN_ASSIGN_OR_RETURN(ExprPtr node, Node(Expr::Kind::kCompare, at, std::move(args)));
    node->ops = std::move(ops);
    return node;
  }

  Result<ExprPtr> Binary(const Token& at, std::string op, ExprPtr l, ExprPtr r) {
    std::vector<ExprPtr> args;
    args.push_back(std::move(l));
    args.push_back(std::move(r));
    LUMEN_ASSIGN_OR_RETURN(ExprPtr node, Node(Expr::Kind::kBinary, at, std::move(args)));
    node->name = std::move(op);
    return node;
  }

  Result<ExprPtr> ParseMath1() {
    LUMEN_ASSIGN_OR_RETURN(ExprPtr left, ParseConcat());
    while (IsOp("+") || IsOp("-")) {
      const Token at = Cur();
      Advance();
      LUMEN_ASSIGN_OR_RETURN(ExprPtr right, ParseConcat());
      LUMEN_ASSIGN_OR_RETURN(left, Binary(at, at.text, std::move(left), std::move(right)));
    }
    return left;
  }

  Result<ExprPtr> ParseConcat() {
    LUMEN_ASSIGN_OR_RETURN(ExprPtr left, ParseMath2());
    while (IsOp("~")) {
      const Token at = Cur();
      Advance();
      LUMEN_ASSIGN_OR_RETURN(ExprPtr right, ParseMath2());
      LUMEN_ASSIGN_OR_RETURN(left, Binary(at, "~", std::move(left), std::move(right)));
    }
    return left;
  }

  Result<ExprPtr> ParseMath2() {
    LUMEN_ASSIGN_OR_RETURN(ExprPtr left, ParsePow());
    while (IsOp("*") || IsOp("/") || IsOp("//") || IsOp("%")) {
      const Token at = Cur();
      Advance();
      LUMEN_ASSIGN_OR_RETURN(ExprPtr right, ParsePow());
      LUMEN_ASSIGN_OR_RETURN(left, Binary(at, at.text, std::move(left), std::move(right)));
    }
    return left;
  }

  Result<ExprPtr> ParsePow() {
    LUMEN_ASSIGN_OR_RETURN(ExprPtr left, ParseUnary(true));
    while (IsOp("**")) {
      const Token at = Cur();
      Advance();
      LUMEN_ASSIGN_OR_RETURN(ExprPtr right, ParseUnary(true));
      LUMEN_ASSIGN_OR_RETURN(left, Binary(at, "**", std::move(left), std::move(right)));
    }
    return left;
  }

  Result<ExprPtr> ParseUnary(bool with_filter) {
    DepthGuard g(nest_);
    LUMEN_RETURN_IF_ERROR(CheckDepth());
    const Token at = Cur();
    ExprPtr node;
    if (IsOp("-") || IsOp("+")) {
      Advance();
      LUMEN_ASSIGN_OR_RETURN(ExprPtr inner, ParseUnary(false));
      std::vector<ExprPtr> args;
      args.push_back(std::move(inner));
      LUMEN_ASSIGN_OR_RETURN(
          node, Node(at.text == "-" ? Expr::Kind::kNeg : Expr::Kind::kPos, at, std::move(args)));
    } else {
      LUMEN_ASSIGN_OR_RETURN(node, ParsePrimary());
    }
    LUMEN_ASSIGN_OR_RETURN(node, ParsePostfix(std::move(node)));
    if (with_filter) {
      LUMEN_ASSIGN_OR_RETURN(node, ParseFilterExpr(std::move(node)));
    }
    return node;
  }

  Result<ExprPtr> Const(const Token& at, Value v) {
    LUMEN_ASSIGN_OR_RETURN(ExprPtr e, Node(Expr::Kind::kConst, at));
    e->value = std::move(v);
    return e;
  }

  Result<ExprPtr> ParsePrimary() {
    const Token at = Cur();
    switch (at.type) {
      case TokenType::kName: {
        Advance();
        if (at.text == "true" || at.text == "True") return Const(at, Value::Bool(true));
        if (at.text == "false" || at.text == "False") return Const(at, Value::Bool(false));
        if (at.text == "none" || at.text == "None") return Const(at, Value::None());
        if (!macros_.empty()) {
          if (at.text == "varargs") macros_.back()->uses_varargs = true;
          if (at.text == "kwargs") macros_.back()->uses_kwargs = true;
          if (at.text == "caller") macros_.back()->uses_caller = true;
        }
        LUMEN_ASSIGN_OR_RETURN(ExprPtr e, Node(Expr::Kind::kName, at));
        e->name = at.text;
        return e;
      }
      case TokenType::kString: {
        std::string s;
        while (Cur().type == TokenType::kString) {
          s += Cur().text;
          Advance();
        }
        return Const(at, Value::Str(std::move(s)));
      }
      case TokenType::kInt:
        Advance();
        return Const(at, Value::Int(at.int_value));
      case TokenType::kFloat:
        Advance();
        return Const(at, Value::Float(at.float_value));
      case TokenType::kOperator:
        if (at.text == "(") {
          Advance();
          LUMEN_ASSIGN_OR_RETURN(ExprPtr e, ParseTuple(true, {}, true));
          LUMEN_RETURN_IF_ERROR(ExpectOp(")"));
          return e;
        }
        if (at.text == "[") return ParseListLiteral();
        if (at.text == "{") return ParseDictLiteral();
        break;
      default:
        break;
    }
    return Fail(at, fmt::format("unexpected {}", Describe(at)));
  }

  Result<ExprPtr> ParseListLiteral() {
    const Token at = Cur();
    Advance();
    std::vector<ExprPtr> items;
    while (!IsOp("]")) {
      if (!items.empty()) LUMEN_RETURN_IF_ERROR(ExpectOp(","));
      if (IsOp("]")) break;
      LUMEN_ASSIGN_OR_RETURN(ExprPtr e, ParseExpression(true));
      items.push_back(std::move(e));
    }
    Advance();
    return Node(Expr::Kind::kList, at, std::move(items));
  }

  Result<ExprPtr> ParseDictLiteral() {
    const Token at = Cur();
    Advance();
    std::vector<ExprPtr> items;
    while (!IsOp("}")) {
      if (!items.empty()) LUMEN_RETURN_IF_ERROR(ExpectOp(","));
      if (IsOp("}")) break;
      LUMEN_ASSIGN_OR_RETURN(ExprPtr k, ParseExpression(true));
      LUMEN_RETURN_IF_ERROR(ExpectOp(":"));
      LUMEN_ASSIGN_OR_RETURN(ExprPtr v, ParseExpression(true));
      items.push_back(std::move(k));
      items.push_back(std::move(v));
    }
    Advance();
    return Node(Expr::Kind::kDict, at, std::move(items));
  }

  Result<ExprPtr> ParsePostfix(ExprPtr node) {
    while (true) {
      const Token at = Cur();
      if (IsOp(".")) {
        Advance();
        if (Cur().type == TokenType::kName) {
          std::vector<ExprPtr> args;
          args.push_back(std::move(node));
          LUMEN_ASSIGN_OR_RETURN(node, Node(Expr::Kind::kGetAttr, at, std::move(args)));
          node->name = Cur().text;
          Advance();
        } else if (Cur().type == TokenType::kInt) {
          LUMEN_ASSIGN_OR_RETURN(ExprPtr key, Const(Cur(), Value::Int(Cur().int_value)));
          Advance();
          std::vector<ExprPtr> args;
          args.push_back(std::move(node));
          args.push_back(std::move(key));
          LUMEN_ASSIGN_OR_RETURN(node, Node(Expr::Kind::kGetItem, at, std::move(args)));
        } else {
          return Expected("an attribute name");
        }
      } else if (IsOp("[")) {
        Advance();
        LUMEN_ASSIGN_OR_RETURN(node, ParseSubscript(at, std::move(node)));
      } else if (IsOp("(")) {
        LUMEN_ASSIGN_OR_RETURN(node, ParseCall(std::move(node)));
      } else {
        return node;
      }
    }
  }

  Result<ExprPtr> ParseSubscript(const Token& at, ExprPtr obj) {
    DepthGuard g(nest_);
    LUMEN_RETURN_IF_ERROR(CheckDepth());
    std::vector<ExprPtr> parts;
    bool is_slice = false;
    ExprPtr first;
    if (!IsOp(":")) {
      LUMEN_ASSIGN_OR_RETURN(first, ParseExpression(true));
    }
    if (IsOp(":")) {
      is_slice = true;
      Advance();
      ExprPtr stop, step;
      if (!IsOp("]") && !IsOp(",") && !IsOp(":")) {
        LUMEN_ASSIGN_OR_RETURN(stop, ParseExpression(true));
      }
      if (IsOp(":")) {
        Advance();
        if (!IsOp("]") && !IsOp(",")) {
          LUMEN_ASSIGN_OR_RETURN(step, ParseExpression(true));
        }
      }
      parts.push_back(std::move(obj));
      parts.push_back(std::move(first));
      parts.push_back(std::move(stop));
      parts.push_back(std::move(step));
    } else {
      parts.push_back(std::move(obj));
      parts.push_back(std::move(first));
    }
    if (IsOp(",")) return Fail(Cur(), "unsupported construct: multiple subscripts");
    LUMEN_RETURN_IF_ERROR(ExpectOp("]"));
    return Node(is_slice ? Expr::Kind::kSlice : Expr::Kind::kGetItem, at, std::move(parts));
  }

  // Parses `( args )` into node->args[1..] / kwargs.
  Status ParseCallArgs(Expr& node) {
    LUMEN_RETURN_IF_ERROR(ExpectOp("("));
    bool first = true;
    while (!IsOp(")")) {
      if (!first) LUMEN_RETURN_IF_ERROR(ExpectOp(","));
      first = false;
      if (IsOp(")")) break;
      if (IsOp("*") || IsOp("**"))
        return Fail(Cur(), "unsupported construct: *args / **kwargs in a call");
      if (Cur().type == TokenType::kName && Look().type == TokenType::kOperator &&
          Look().text == "=") {
        std::string key = Cur().text;
        Advance();
        Advance();
        LUMEN_ASSIGN_OR_RETURN(ExprPtr v, ParseExpression(true));
        node.kwargs.emplace_back(std::move(key), std::move(v));
      } else {
        if (!node.kwargs.empty())
          return Fail(Cur(), "positional argument follows keyword argument");
        LUMEN_ASSIGN_OR_RETURN(ExprPtr v, ParseExpression(true));
        node.args.push_back(std::move(v));
      }
    }
    Advance();
    return Rebalance(node);
  }

  Result<ExprPtr> ParseCall(ExprPtr callee) {
    DepthGuard g(nest_);
    LUMEN_RETURN_IF_ERROR(CheckDepth());
    const Token at = Cur();
    std::vector<ExprPtr> args;
    args.push_back(std::move(callee));
    LUMEN_ASSIGN_OR_RETURN(ExprPtr node, Node(Expr::Kind::kCall, at, std::move(args)));
    LUMEN_RETURN_IF_ERROR(ParseCallArgs(*node));
    return node;
  }

  // After '|': name(.name)* [args]; subject may be null (filter blocks).
  Result<ExprPtr> ParseFilterTail(ExprPtr subject) {
    const Token at = Cur();
    LUMEN_ASSIGN_OR_RETURN(std::string name, ExpectName());
    while (IsOp(".")) {
      Advance();
      LUMEN_ASSIGN_OR_RETURN(std::string more, ExpectName());
      name += "." + more;
    }
    if (!IsSupportedFilter(name)) {
      if (Contains(kUnsupportedJinjaFilters, name))
        return Fail(at, fmt::format("unsupported construct: filter '{}'", name));
      return Fail(at, fmt::format("no filter named '{}'", name));
    }
    std::vector<ExprPtr> args;
    args.push_back(std::move(subject));
    LUMEN_ASSIGN_OR_RETURN(ExprPtr node, Node(Expr::Kind::kFilter, at, std::move(args)));
    node->name = name;
    if (IsOp("(")) {
      DepthGuard g(nest_);
      LUMEN_RETURN_IF_ERROR(CheckDepth());
      LUMEN_RETURN_IF_ERROR(ParseCallArgs(*node));
    }
    return node;
  }

  Result<ExprPtr> ParseFilterExpr(ExprPtr node) {
    while (true) {
      if (IsOp("|")) {
        Advance();
        LUMEN_ASSIGN_OR_RETURN(node, ParseFilterTail(std::move(node)));
      } else if (IsName("is")) {
        LUMEN_ASSIGN_OR_RETURN(node, ParseTest(std::move(node)));
      } else if (IsOp("(")) {
        LUMEN_ASSIGN_OR_RETURN(node, ParseCall(std::move(node)));
      } else {
        return node;
      }
    }
  }

  Result<ExprPtr> ParseTest(ExprPtr subject) {
    const Token at = Cur();
    Advance();
    bool negated = false;
    if (IsName("not")) {
      negated = true;
      Advance();
    }
    const Token name_tok = Cur();
    LUMEN_ASSIGN_OR_RETURN(std::string name, ExpectName());
    while (IsOp(".")) {
      Advance();
      LUMEN_ASSIGN_OR_RETURN(std::string more, ExpectName());
      name += "." + more;
    }
    if (!IsSupportedTest(name)) return Fail(name_tok, fmt::format("no test named '{}'", name));
    std::vector<ExprPtr> args;
    args.push_back(std::move(subject));
    LUMEN_ASSIGN_OR_RETURN(ExprPtr node, Node(Expr::Kind::kTest, at, std::move(args)));
    node->name = name;
    const Token& c = Cur();
    if (IsOp("(")) {
      DepthGuard g(nest_);
      LUMEN_RETURN_IF_ERROR(CheckDepth());
      LUMEN_RETURN_IF_ERROR(ParseCallArgs(*node));
    } else if ((c.type == TokenType::kName || c.type == TokenType::kString ||
                c.type == TokenType::kInt || c.type == TokenType::kFloat || IsOp("[") ||
                IsOp("{")) &&
               !IsName("else") && !IsName("or") && !IsName("and")) {
      if (IsName("is")) return Fail(c, "you cannot chain multiple tests with 'is'");
      DepthGuard g(nest_);
      LUMEN_RETURN_IF_ERROR(CheckDepth());
      LUMEN_ASSIGN_OR_RETURN(ExprPtr arg, ParsePrimary());
      LUMEN_ASSIGN_OR_RETURN(arg, ParsePostfix(std::move(arg)));
      node->args.push_back(std::move(arg));
      LUMEN_RETURN_IF_ERROR(Rebalance(*node));
    }
    if (negated) {
      std::vector<ExprPtr> nargs;
      nargs.push_back(std::move(node));
      return Node(Expr::Kind::kNot, at, std::move(nargs));
    }
    return node;
  }

  std::vector<Token> toks_;
  size_t pos_ = 0;
  int nest_ = 0;
  int stmt_depth_ = 0;
  int loop_depth_ = 0;
  std::vector<Stmt*> macros_;
};

}  // namespace

bool IsSupportedFilter(std::string_view name) { return Contains(kSupportedFilters, name); }
bool IsSupportedTest(std::string_view name) { return Contains(kSupportedTests, name); }

Result<Template> ParseTemplate(std::string_view source) {
  LUMEN_ASSIGN_OR_RETURN(std::vector<Token> tokens, Lex(source));
  return Parser(std::move(tokens)).Run();
}

}  // namespace lumen::tokenize
