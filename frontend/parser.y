/*
 * parser.y — the .kiln grammar (jq's src/parser.y): a pure parser with
 * locations, verbose messages and error rules that recover at `;` and `}`
 * so that one run reports several errors. Context comes in through
 * %parse-param; the tree goes into the parse's arena. Lists grow on the heap
 * until their rule is reduced; %destructor frees the ones bison discards.
 *
 * Precedence, loosest first (Swift puts ?? in the same place):
 *     c ? a : b      right
 *     ||             left
 *     &&             left
 *     == != < <= > >=   non-associative (a < b < c is an error)
 *     ??             right
 *     + -            left
 *     * / %          left
 *     - ! (unary)
 */
%define api.pure full
%define api.prefix {kf_yy}
%define api.token.prefix {TOK_}
%locations
%define parse.error verbose
/* Conflicts are resolved with precedence, never by raising this. */
%expect 0
%parse-param {kf_parser *p}
%lex-param {kf_parser *p}

%code requires {
#include "frontend/ast.h"
}

%code {
#include <string.h>

#include "frontend/frontend.h"

int kf_lxlex(KF_YYSTYPE *lval, KF_YYLTYPE *lloc, void *scanner);
static int kf_yylex(KF_YYSTYPE *lval, KF_YYLTYPE *lloc, kf_parser *p);
static void kf_yyerror(KF_YYLTYPE *loc, kf_parser *p, const char *msg);

#define LOC(l) ((kf_loc){(l).first_line, (l).first_column})

/* Stop after this many errors: a binary file given as .kiln would
 * otherwise print one per byte. */
enum { KF_MAX_ERRORS = 50 };

static kf_item *item_new(kf_parser *p, kf_item_kind kind, kf_loc loc)
{
    kf_item *it = ks_arena_alloc(p->arena, sizeof *it);
    it->kind = kind;
    it->loc = loc;
    return it;
}

static kf_stmt *stmt_new(kf_parser *p, kf_stmt_kind kind, kf_loc loc)
{
    kf_stmt *st = ks_arena_alloc(p->arena, sizeof *st);
    st->kind = kind;
    st->loc = loc;
    return st;
}

static kf_block block_of(kf_parser *p, kf_vec *v)
{
    kf_block b;
    b.v = (kf_stmt **)kf_vec_finish(v, p->arena, &b.n);
    return b;
}

static kf_weight_src *source_new(kf_parser *p, const char *tensor, kf_loc loc, int transposed, int dim,
                                 kf_expr *lo, kf_expr *hi, kf_expr *step)
{
    kf_weight_src *s = ks_arena_alloc(p->arena, sizeof *s);
    s->tensor = tensor;
    s->loc = loc;
    s->transposed = transposed;
    s->row_dim = dim;
    s->row_lo = lo;
    s->row_hi = hi;
    s->row_step = step;
    s->transposed_after = 0;
    return s;
}

/* `.T` is the only member a tensor name takes. */
static int check_transpose(kf_parser *p, const char *ident, KF_YYLTYPE loc)
{
    if (strcmp(ident, "T") != 0)
        ks_error_at(p->diag, p->src, loc.first_line, loc.first_column,
                    "unknown tensor modifier '.%s' (only .T, read transposed, exists)", ident);
    return 1;
}

/* A string item of `matches` or `ignore`, with its place. */
typedef struct kf_str_item {
    const char *s; /* the string */
    kf_loc loc;    /* where it is written */
} kf_str_item;

/* `matches` and `ignore`: an item holding a list of strings. */
/* The names in `strings` (kf_str_item) into it->strings and it->string_locs. */
static void strings_into(kf_parser *p, kf_item *it, kf_vec *strings)
{
    size_t n;
    kf_str_item **v = (kf_str_item **)kf_vec_finish(strings, p->arena, &n);
    it->strings = ks_arena_alloc(p->arena, (n ? n : 1) * sizeof *it->strings);
    it->string_locs = ks_arena_alloc(p->arena, (n ? n : 1) * sizeof *it->string_locs);
    for (size_t i = 0; i < n; i++) {
        it->strings[i] = v[i]->s;
        it->string_locs[i] = v[i]->loc;
    }
    it->n_strings = n;
}

static kf_item *strings_item(kf_parser *p, kf_item_kind kind, kf_vec *strings, kf_loc loc)
{
    kf_item *it = item_new(p, kind, loc);
    strings_into(p, it, strings);
    return it;
}
}

%union {
    int64_t i;          /* INT */
    double f;           /* FLOAT */
    char *s;            /* IDENT, STRING: in the arena */
    kf_expr *e;         /* expressions */
    kf_stmt *st;        /* statements */
    kf_item *it;        /* items */
    kf_vec *vec;        /* lists under construction (heap) */
    kf_arg *arg;        /* call arguments */
    kf_weight_src *src; /* weight alternatives */
    int flags;          /* weight_kind: 1 layer, 2 optional */
    struct {
        kf_stmt *first; /* the chain's `if` */
        kf_stmt *last;  /* its last `else if`, whose else branch comes next */
    } chain;            /* if_chain */
}

%destructor { kf_vec_free($$); } <vec>

%token END 0 "end of file"
%token <s> IDENT "identifier"
%token <s> STRING "string"
%token <i> INT "integer"
%token <f> FLOAT "number"
%token MODEL "model" MATCHES "matches" PARAM "param" WEIGHT "weight" LAYER "layer"
%token OPTIONAL "optional" FORWARD "forward" FOR "for" IN "in" IF "if" ELSE "else"
%token OUTPUT "output" CONFIG "config" TRUE "true" FALSE "false" NONE "none" ASSERT "assert"
%token IGNORE "ignore" GENERATION "generation" FN "fn" RETURN "return"
%token DOTDOT ".." COALESCE "??" EQ "==" NE "!=" LE "<=" GE ">=" AND "&&" OR "||"

%right '?' ':'
%left "||"
%left "&&"
%nonassoc "==" "!=" '<' '>' "<=" ">="
%right "??"
%left '+' '-'
%left '*' '/' '%'
%precedence UNARY

%type <it> item weight_decl
%type <vec> items strings block stmts exprs args config_path sources idents fn_params
%type <e> expr primary opt_cond
%type <st> stmt if_stmt
%type <chain> if_chain
%type <arg> arg
%type <src> source
%type <flags> weight_kind

%%

file:
  items { size_t n; p->file->items = (kf_item **)kf_vec_finish($1, p->arena, &n); p->file->n_items = n; }
;

items:
  %empty      { $$ = kf_vec_new(); }
| items item  { $$ = $1; if ($2) kf_vec_push($$, $2); }
;

item:
  "model" IDENT ';' {
      $$ = item_new(p, KF_ITEM_MODEL, LOC(@1));
      $$->name = $2;
      $$->name_loc = LOC(@2);
  }
| "matches" strings ';' { $$ = strings_item(p, KF_ITEM_MATCHES, $2, LOC(@1)); }
| "ignore" strings ';'  { $$ = strings_item(p, KF_ITEM_IGNORE, $2, LOC(@1)); }
| "param" IDENT '=' expr ';' {
      $$ = item_new(p, KF_ITEM_PARAM, LOC(@1));
      $$->name = $2;
      $$->name_loc = LOC(@2);
      $$->value = $4;
  }
| weight_decl
| "assert" expr ',' STRING ';' {
      $$ = item_new(p, KF_ITEM_ASSERT, LOC(@1));
      $$->value = $2;
      $$->message = $4;
  }
| "forward" block {
      $$ = item_new(p, KF_ITEM_FORWARD, LOC(@1));
      $$->body = block_of(p, $2);
  }
| "fn" IDENT '(' fn_params ')' block {
      $$ = item_new(p, KF_ITEM_FN, LOC(@1));
      $$->name = $2;
      $$->name_loc = LOC(@2);
      strings_into(p, $$, $4);
      $$->body = block_of(p, $6);
  }
| error ';' { $$ = NULL; }
| error '}' { $$ = NULL; }
;

strings:
  STRING {
      $$ = kf_vec_new();
      kf_str_item *s = ks_arena_alloc(p->arena, sizeof *s);
      s->s = $1;
      s->loc = LOC(@1);
      kf_vec_push($$, s);
  }
| strings ',' STRING {
      $$ = $1;
      kf_str_item *s = ks_arena_alloc(p->arena, sizeof *s);
      s->s = $3;
      s->loc = LOC(@3);
      kf_vec_push($$, s);
  }
;

fn_params:
  %empty  { $$ = kf_vec_new(); }
| idents
;

idents:
  IDENT {
      $$ = kf_vec_new();
      kf_str_item *s = ks_arena_alloc(p->arena, sizeof *s);
      s->s = $1;
      s->loc = LOC(@1);
      kf_vec_push($$, s);
  }
| idents ',' IDENT {
      $$ = $1;
      kf_str_item *s = ks_arena_alloc(p->arena, sizeof *s);
      s->s = $3;
      s->loc = LOC(@3);
      kf_vec_push($$, s);
  }
;

weight_decl:
  weight_kind IDENT '[' exprs ']' '=' sources opt_cond ';' {
      $$ = item_new(p, KF_ITEM_WEIGHT, LOC(@1));
      $$->name = $2;
      $$->name_loc = LOC(@2);
      $$->is_layer = ($1 & 1) != 0;
      $$->is_optional = ($1 & 2) != 0;
      $$->dims = (kf_expr **)kf_vec_finish($4, p->arena, &$$->n_dims);
      $$->srcs = (kf_weight_src **)kf_vec_finish($7, p->arena, &$$->n_srcs);
      $$->value = $8;
  }
;

weight_kind:
  "weight"                     { $$ = 0; }
| "layer" "weight"             { $$ = 1; }
| "optional" "weight"          { $$ = 2; }
| "optional" "layer" "weight"  { $$ = 3; }
;

sources:
  source              { $$ = kf_vec_new(); kf_vec_push($$, $1); }
| sources '|' source  { $$ = $1; kf_vec_push($$, $3); }
;

source:
  STRING                                   { $$ = source_new(p, $1, LOC(@1), 0, 0, NULL, NULL, NULL); }
| STRING '.' IDENT                         { $$ = source_new(p, $1, LOC(@1), check_transpose(p, $3, @3), 0, NULL, NULL, NULL); }
| STRING '[' expr ':' expr ']'             { $$ = source_new(p, $1, LOC(@1), 0, 0, $3, $5, NULL); }
| STRING '.' IDENT '[' expr ':' expr ']'   { $$ = source_new(p, $1, LOC(@1), check_transpose(p, $3, @3), 0, $5, $7, NULL); }
| STRING '[' expr ':' expr ':' expr ']'    { $$ = source_new(p, $1, LOC(@1), 0, 0, $3, $5, $7); }
| STRING '.' IDENT '[' expr ':' expr ':' expr ']' {
      $$ = source_new(p, $1, LOC(@1), check_transpose(p, $3, @3), 0, $5, $7, $9);
  }
| STRING '[' ':' ',' expr ':' expr ']'     { $$ = source_new(p, $1, LOC(@1), 0, 1, $5, $7, NULL); }
| STRING '[' ':' ',' expr ':' expr ']' '.' IDENT {
      $$ = source_new(p, $1, LOC(@1), 0, 1, $5, $7, NULL);
      $$->transposed_after = check_transpose(p, $10, @10);
  }
| STRING '.' IDENT '[' ':' ',' expr ':' expr ']' {
      $$ = source_new(p, $1, LOC(@1), check_transpose(p, $3, @3), 1, $7, $9, NULL);
  }
| STRING '[' ':' ',' expr ':' expr ':' expr ']' { $$ = source_new(p, $1, LOC(@1), 0, 1, $5, $7, $9); }
| STRING '.' IDENT '[' ':' ',' expr ':' expr ':' expr ']' {
      $$ = source_new(p, $1, LOC(@1), check_transpose(p, $3, @3), 1, $7, $9, $11);
  }
;

opt_cond:
  %empty     { $$ = NULL; }
| "if" expr  { $$ = $2; }
;

block:
  '{' stmts '}'        { $$ = $2; }
| '{' stmts error '}'  { $$ = $2; }
;

stmts:
  %empty      { $$ = kf_vec_new(); }
| stmts stmt  { $$ = $1; if ($2) kf_vec_push($$, $2); }
;

stmt:
  IDENT '=' expr ';' {
      $$ = stmt_new(p, KF_STMT_ASSIGN, LOC(@1));
      $$->name = $1;
      $$->name_loc = LOC(@1);
      $$->value = $3;
  }
| "output" IDENT '=' expr ';' {
      $$ = stmt_new(p, KF_STMT_OUTPUT, LOC(@1));
      $$->name = $2;
      $$->name_loc = LOC(@2);
      $$->value = $4;
  }
| "for" IDENT "in" expr ".." expr block {
      $$ = stmt_new(p, KF_STMT_FOR, LOC(@1));
      $$->name = $2;
      $$->name_loc = LOC(@2);
      $$->lo = $4;
      $$->hi = $6;
      $$->body = block_of(p, $7);
  }
| "return" expr ';' {
      $$ = stmt_new(p, KF_STMT_RETURN, LOC(@1));
      $$->value = $2;
  }
| if_stmt
| error ';' { $$ = NULL; }
;

/* `if ... else if ... else if ...` is a chain, left-recursive so that bison's
 * stack does not grow with its length; each `else if` is the one statement
 * of the else branch before it (lowering walks the chain in a loop). */
if_stmt:
  if_chain                 { $$ = $1.first; }
| if_chain "else" block    { $$ = $1.first; $1.last->orelse = block_of(p, $3); }
;

if_chain:
  "if" expr block {
      $$.first = $$.last = stmt_new(p, KF_STMT_IF, LOC(@1));
      $$.last->value = $2;
      $$.last->body = block_of(p, $3);
  }
| if_chain "else" "if" expr block {
      kf_stmt *st = stmt_new(p, KF_STMT_IF, LOC(@3));
      st->value = $4;
      st->body = block_of(p, $5);
      $1.last->orelse.v = ks_arena_alloc(p->arena, sizeof *$1.last->orelse.v);
      $1.last->orelse.v[0] = st;
      $1.last->orelse.n = 1;
      $$.first = $1.first;
      $$.last = st;
  }
;

exprs:
  expr            { $$ = kf_vec_new(); kf_vec_push($$, $1); }
| exprs ',' expr  { $$ = $1; kf_vec_push($$, $3); }
;

expr:
  primary
| '-' expr %prec UNARY        { $$ = kf_expr_unary(p, '-', $2, LOC(@1)); }
| '!' expr %prec UNARY        { $$ = kf_expr_unary(p, '!', $2, LOC(@1)); }
| expr '+' expr               { $$ = kf_expr_binary(p, '+', $1, $3, LOC(@2)); }
| expr '-' expr               { $$ = kf_expr_binary(p, '-', $1, $3, LOC(@2)); }
| expr '*' expr               { $$ = kf_expr_binary(p, '*', $1, $3, LOC(@2)); }
| expr '/' expr               { $$ = kf_expr_binary(p, '/', $1, $3, LOC(@2)); }
| expr '%' expr               { $$ = kf_expr_binary(p, '%', $1, $3, LOC(@2)); }
| expr '<' expr               { $$ = kf_expr_binary(p, '<', $1, $3, LOC(@2)); }
| expr '>' expr               { $$ = kf_expr_binary(p, '>', $1, $3, LOC(@2)); }
| expr "<=" expr              { $$ = kf_expr_binary(p, KF_OP_LE, $1, $3, LOC(@2)); }
| expr ">=" expr              { $$ = kf_expr_binary(p, KF_OP_GE, $1, $3, LOC(@2)); }
| expr "==" expr              { $$ = kf_expr_binary(p, KF_OP_EQ, $1, $3, LOC(@2)); }
| expr "!=" expr              { $$ = kf_expr_binary(p, KF_OP_NE, $1, $3, LOC(@2)); }
| expr "&&" expr              { $$ = kf_expr_binary(p, KF_OP_AND, $1, $3, LOC(@2)); }
| expr "||" expr              { $$ = kf_expr_binary(p, KF_OP_OR, $1, $3, LOC(@2)); }
| expr "??" expr              { $$ = kf_expr_binary(p, KF_OP_COALESCE, $1, $3, LOC(@2)); }
| expr '?' expr ':' expr      { $$ = kf_expr_cond(p, $1, $3, $5, LOC(@2)); }
;

primary:
  INT            { $$ = kf_expr_new(p, KF_EXPR_INT, LOC(@1)); $$->u.i = $1; }
| FLOAT          { $$ = kf_expr_new(p, KF_EXPR_FLOAT, LOC(@1)); $$->u.f = $1; }
| STRING         { $$ = kf_expr_new(p, KF_EXPR_STR, LOC(@1)); $$->u.s = $1; }
| "true"         { $$ = kf_expr_new(p, KF_EXPR_BOOL, LOC(@1)); $$->u.i = 1; }
| "false"        { $$ = kf_expr_new(p, KF_EXPR_BOOL, LOC(@1)); $$->u.i = 0; }
| "none"         { $$ = kf_expr_new(p, KF_EXPR_NONE, LOC(@1)); }
| IDENT          { $$ = kf_expr_new(p, KF_EXPR_NAME, LOC(@1)); $$->u.name = $1; }
| IDENT '[' expr ']'       { $$ = kf_expr_index(p, $1, $3, LOC(@1)); }
| IDENT '(' ')'            { $$ = kf_expr_call(p, $1, NULL, LOC(@1)); }
| IDENT '(' args ')'       { $$ = kf_expr_call(p, $1, $3, LOC(@1)); }
| config_path              { $$ = kf_expr_config(p, $1, LOC(@1)); }
| '(' expr ')'             { $$ = $2; }
;

config_path:
  "config" '.' IDENT {
      $$ = kf_vec_new();
      kf_config_step *s = ks_arena_alloc(p->arena, sizeof *s);
      s->key = $3;
      s->loc = LOC(@2);
      s->doc = KF_DOC_CONFIG;
      kf_vec_push($$, s);
  }
| "generation" '.' IDENT {
      $$ = kf_vec_new();
      kf_config_step *s = ks_arena_alloc(p->arena, sizeof *s);
      s->key = $3;
      s->loc = LOC(@2);
      s->doc = KF_DOC_GENERATION;
      kf_vec_push($$, s);
  }
| config_path '.' IDENT {
      $$ = $1;
      kf_config_step *s = ks_arena_alloc(p->arena, sizeof *s);
      s->key = $3;
      s->loc = LOC(@2);
      kf_vec_push($$, s);
  }
| config_path '[' expr ']' {
      $$ = $1;
      kf_config_step *s = ks_arena_alloc(p->arena, sizeof *s);
      s->index = $3;
      s->loc = LOC(@2);
      kf_vec_push($$, s);
  }
;

args:
  arg           { $$ = kf_vec_new(); kf_vec_push($$, $1); }
| args ',' arg  { $$ = $1; kf_vec_push($$, $3); }
;

arg:
  expr {
      $$ = ks_arena_alloc(p->arena, sizeof *$$);
      $$->value = $1;
      $$->loc = LOC(@1);
  }
| IDENT ':' expr {
      $$ = ks_arena_alloc(p->arena, sizeof *$$);
      $$->name = $1;
      $$->value = $3;
      $$->loc = LOC(@1);
  }
| "layer" ':' expr {
      /* `layer` is a keyword; as an attribute name it gets its own message. */
      $$ = ks_arena_alloc(p->arena, sizeof *$$);
      $$->name = "layer";
      $$->value = $3;
      $$->loc = LOC(@1);
  }
;

%%

static int ends_statement(int tok);

/* Nesting that grows bison's stack without a reduction is bounded as the
 * tokens pass, so that a deep text gets a message at its place rather than
 * bison's "memory exhausted" (or a tree too deep to walk): open '(' and '[';
 * runs of prefix operators; and, in each bracket level, right-associative
 * chains: `??` not separated by a looser operator, `?` not separated by ','
 * or the end of the expression (a ?? b ?? ... and c ? a : c ? ... nest to
 * the right). KF_MAX_EXPR_DEPTH operators of a run or chain make an
 * expression deeper than that, with the operand; brackets alone add no depth
 * to the tree, but more than KF_MAX_EXPR_DEPTH of them are refused too. The scanner bounds '{'. Past a limit the parse stops: what
 * follows would only add errors about the same mistake. */
static void check_nesting(kf_parser *p, int tok, const KF_YYLTYPE *loc)
{
    int over = 0, level = p->bracket_depth <= KF_MAX_EXPR_DEPTH ? p->bracket_depth : KF_MAX_EXPR_DEPTH;
    int prefix = 0;
    switch (tok) {
    case '(':
    case '[':
        over = ++p->bracket_depth > KF_MAX_EXPR_DEPTH;
        if (!over) p->chain[p->bracket_depth].coalesce = p->chain[p->bracket_depth].cond = 0;
        break;
    case ')':
    case ']':
        if (p->bracket_depth > 0) p->bracket_depth--;
        break;
    case '-':
    case '!':
        /* prefix unless a '-' comes after an operand: then a binary minus */
        prefix = tok == '!' || !ends_statement(p->tok_kind[0]);
        if (prefix) over = p->prefix_run + 1 >= KF_MAX_EXPR_DEPTH;
        break;
    case TOK_COALESCE: over = ++p->chain[level].coalesce >= KF_MAX_EXPR_DEPTH; break;
    case '?':
        p->chain[level].coalesce = 0;
        over = ++p->chain[level].cond >= KF_MAX_EXPR_DEPTH;
        break;
    case TOK_EQ: case TOK_NE: case '<': case '>': case TOK_LE: case TOK_GE: case TOK_AND: case TOK_OR: case ':':
        p->chain[level].coalesce = 0; /* looser than ??: the chain before it is complete */
        break;
    case ',': case ';': case '{': case '}': case TOK_DOTDOT: case '=': case TOK_END:
        p->chain[level].coalesce = p->chain[level].cond = 0; /* the expression (or argument) ended */
        break;
    default: break;
    }
    p->prefix_run = prefix ? p->prefix_run + 1 : 0;
    if (over) {
        ks_error_at(p->diag, p->src, loc->first_line, loc->first_column,
                    "expression nested too deeply (more than %d levels)", KF_MAX_EXPR_DEPTH);
        p->stopped = 1;
    }
}

static int kf_yylex(KF_YYSTYPE *lval, KF_YYLTYPE *lloc, kf_parser *p)
{
    if (p->stopped || p->diag->errors - p->errors_at_start >= KF_MAX_ERRORS) {
        if (!p->stopped)
            ks_note_at(p->diag, p->src, 0, 0, "too many errors; stopping");
        p->stopped = 1;
        lloc->first_line = lloc->last_line = p->line;
        lloc->first_column = lloc->last_column = p->col;
        return TOK_END;
    }
    int tok = kf_lxlex(lval, lloc, p->scanner);
    check_nesting(p, tok, lloc);
    if (tok == TOK_END) {
        lloc->first_line = lloc->last_line = p->line;
        lloc->first_column = lloc->last_column = p->col;
    }
    p->tok_end[1] = p->tok_end[0];
    p->tok_end[0] = (kf_loc){lloc->last_line, lloc->last_column + 1};
    p->tok_kind[1] = p->tok_kind[0];
    p->tok_kind[0] = tok;
    return tok;
}

/* Whether a token can end a statement: the last of an expression. */
static int ends_statement(int tok)
{
    switch (tok) {
    case TOK_IDENT:
    case TOK_INT:
    case TOK_FLOAT:
    case TOK_STRING:
    case TOK_TRUE:
    case TOK_FALSE:
    case TOK_NONE:
    case ')':
    case ']':
        return 1;
    default:
        return 0;
    }
}

/* Bison's message, then a hint where the mistake is a common one. */
static void kf_yyerror(KF_YYLTYPE *loc, kf_parser *p, const char *msg)
{
    if (p->stopped) return;
    if (strcmp(msg, "memory exhausted") == 0) {
        /* bison's stack is full: only operators waiting for their right
         * operands, thousands deep, fill it (check_nesting bounds the rest) */
        ks_error_at(p->diag, p->src, loc->first_line, loc->first_column,
                    "expression nested too deeply (more than %d levels)", KF_MAX_EXPR_DEPTH);
        p->stopped = 1;
        return;
    }
    ks_error_at(p->diag, p->src, loc->first_line, loc->first_column, "%s", msg);
    const char *expecting = strstr(msg, "expecting");
    if ((!expecting || strstr(expecting, "';'")) && ends_statement(p->tok_kind[1]) && p->tok_end[1].line > 0 &&
        loc->first_line > p->tok_end[1].line) {
        /* The unexpected token starts a new line, after one that could end
         * a statement. */
        ks_note_at(p->diag, p->src, p->tok_end[1].line, p->tok_end[1].col, "missing ';' at the end of this line?");
    }
    switch (p->tok_kind[0]) {
    case '<':
    case '>':
    case TOK_LE:
    case TOK_GE:
    case TOK_EQ:
    case TOK_NE:
        /* %nonassoc makes `a < b < c` an error: say what to write instead. */
        if (strstr(msg, "unexpected") && !expecting)
            ks_note_at(p->diag, p->src, loc->first_line, loc->first_column,
                       "comparisons do not chain: write a < b && b < c");
        break;
    default: break;
    }
    if (strstr(msg, "unexpected end of file") && p->brace_depth > 0) {
        int i = p->brace_depth <= KF_MAX_BLOCK_DEPTH ? p->brace_depth - 1 : KF_MAX_BLOCK_DEPTH - 1;
        ks_note_at(p->diag, p->src, p->brace_open[i].line, p->brace_open[i].col, "this '{' is never closed");
    }
}

kf_file *kf_parse(const ks_source *src, ks_arena *a, ks_diag *d)
{
    kf_parser p = {0};
    p.src = src;
    p.diag = d;
    p.arena = a;
    p.errors_at_start = d->errors;
    p.file = ks_arena_alloc(a, sizeof *p.file);
    if (kf_lex_init(&p) != 0) {
        ks_error(d, src->name, "cannot start the scanner");
        return p.file;
    }
    int rc = kf_yyparse(&p);
    if (rc != 0 && d->errors == p.errors_at_start)
        ks_error(d, src->name, "cannot parse (out of parser memory)");
    kf_lex_destroy(&p);
    return p.file;
}

/* The model_type values of the `matches` lines, read with the scanner alone:
 * a description that does not compile still says what it is for. */
int kf_kiln_matches(const char *kiln_text, const char *model_type)
{
    if (!kiln_text || !model_type) return 0;
    ks_source src = {"<kiln>", kiln_text, strlen(kiln_text)};
    ks_diag quiet = {0};
    quiet.quiet = 1;
    ks_arena a = {0};
    kf_parser p = {0};
    p.src = &src;
    p.diag = &quiet;
    p.arena = &a;
    p.file = NULL;
    int found = 0;
    if (kf_lex_init(&p) == 0) {
        KF_YYSTYPE v;
        KF_YYLTYPE l;
        int tok, in_matches = 0, expect_string = 0;
        while (!found && (tok = kf_lxlex(&v, &l, p.scanner)) != TOK_END) {
            if (tok == TOK_MATCHES) {
                in_matches = expect_string = 1;
            } else if (in_matches && expect_string && tok == TOK_STRING) {
                found = strcmp(v.s, model_type) == 0;
                expect_string = 0;
            } else if (in_matches && !expect_string && tok == ',') {
                expect_string = 1;
            } else {
                in_matches = 0;
            }
        }
    }
    kf_lex_destroy(&p);
    ks_arena_free(&a);
    return found;
}
