/*
 * ast.h — the syntax tree of a .kiln model description, and the parser that
 * builds it (frontend/parser.y + frontend/lexer.l).
 *
 * A .kiln file is a list of items:
 *
 *     model NAME;                                  KF_ITEM_MODEL
 *     matches "model_type", ...;                   KF_ITEM_MATCHES
 *     param NAME = expr;                           KF_ITEM_PARAM
 *     [optional] [layer] weight NAME[dims] = "tensor" | ... [if expr];
 *                                                  KF_ITEM_WEIGHT
 *     assert expr, "message";                      KF_ITEM_ASSERT
 *     ignore "tensor", ...;                        KF_ITEM_IGNORE
 *     forward { statements }                       KF_ITEM_FORWARD
 *     fn NAME(a, b) { statements; return expr; }   KF_ITEM_FN
 *
 * Every node lives in the parse's arena (ks_arena) and is freed with it; the
 * tree holds no other memory. Locations are 1-based line and column (bytes)
 * of the token that names the node: the operator of a binary expression, the
 * callee of a call, the `config` (or `generation`) keyword of a config path.
 *
 * Prefix: kf_ (frontend).
 */
#ifndef KILN_FRONTEND_AST_H
#define KILN_FRONTEND_AST_H

#include <stddef.h>
#include <stdint.h>

#include "support/support.h"

/* Deepest expression tree the parser accepts: evaluation recurses over it,
 * so an input of a million nested operators must not reach the C stack. */
enum { KF_MAX_EXPR_DEPTH = 200, KF_MAX_BLOCK_DEPTH = 64, KF_MAX_CALL_DEPTH = 32 /* user functions (lower_fn.c) */ };

typedef struct kf_loc {
    int line; /* 1-based line */
    int col;  /* 1-based column, in bytes */
} kf_loc;

typedef struct kf_expr kf_expr;
typedef struct kf_stmt kf_stmt;

/* ---- expressions ----------------------------------------------------------- */
typedef enum kf_expr_kind {
    KF_EXPR_INT,    /* integer literal: u.i */
    KF_EXPR_FLOAT,  /* floating literal: u.f */
    KF_EXPR_STR,    /* string literal: u.s */
    KF_EXPR_BOOL,   /* true / false: u.i (0 or 1) */
    KF_EXPR_NONE,   /* none: an absent tensor */
    KF_EXPR_NAME,   /* identifier: u.name */
    KF_EXPR_INDEX,  /* NAME[expr], a layer weight of one layer: u.index */
    KF_EXPR_CONFIG, /* config.a.b[2] or generation.a: u.config */
    KF_EXPR_UNARY,  /* -x, !x: u.unary */
    KF_EXPR_BINARY, /* a OP b: u.binary */
    KF_EXPR_COND,   /* c ? a : b: u.cond */
    KF_EXPR_CALL,   /* f(args): u.call */
} kf_expr_kind;

/* Binary and unary operators; the single-character ones are their ASCII
 * code, the others are these. */
typedef enum kf_op {
    KF_OP_EQ = 256, /* == */
    KF_OP_NE,       /* != */
    KF_OP_LE,       /* <= */
    KF_OP_GE,       /* >= */
    KF_OP_AND,      /* && */
    KF_OP_OR,       /* || */
    KF_OP_COALESCE, /* ?? */
} kf_op;

/* The text of an operator, e.g. "+" or "??", for messages. */
const char *kf_op_text(int op);

/* The JSON documents config paths read. */
typedef enum kf_doc_id {
    KF_DOC_CONFIG,     /* config.json: `config.a.b` */
    KF_DOC_GENERATION, /* generation_config.json: `generation.a.b` */
    KF_N_DOCS
} kf_doc_id;

/* One step of a config path: `.key` or `[index]`. */
typedef struct kf_config_step {
    const char *key; /* member name; NULL for an index step */
    kf_expr *index;  /* index expression of an index step; NULL for a member */
    kf_loc loc;      /* where the step starts ('.' or '[') */
    kf_doc_id doc;   /* the first step: the document the path reads (`config.` or `generation.`) */
} kf_config_step;

/* One argument of a call: positional (name NULL) or named (`name: value`). */
typedef struct kf_arg {
    const char *name; /* attribute name, or NULL for a positional argument */
    kf_expr *value;   /* the argument */
    kf_loc loc;       /* start of the argument (its name when named) */
} kf_arg;

struct kf_expr {
    kf_expr_kind kind; /* which member of u holds the data */
    kf_loc loc;        /* the token that names the node (see the file comment) */
    int depth;         /* 1 + the deepest child: bounded by KF_MAX_EXPR_DEPTH */
    union {
        int64_t i;      /* KF_EXPR_INT, KF_EXPR_BOOL */
        double f;       /* KF_EXPR_FLOAT */
        const char *s;  /* KF_EXPR_STR: decoded, NUL-terminated */
        const char *name; /* KF_EXPR_NAME */
        struct {
            const char *name; /* the weight */
            kf_expr *index;   /* the layer */
        } index;        /* KF_EXPR_INDEX */
        struct {
            kf_config_step *steps; /* path from the document's root, in order */
            size_t n;              /* number of steps, >= 1 */
            kf_doc_id doc;         /* the document it reads */
        } config;       /* KF_EXPR_CONFIG */
        struct {
            int op;     /* '-' or '!' */
            kf_expr *a; /* operand */
        } unary;        /* KF_EXPR_UNARY */
        struct {
            int op;         /* ASCII code or kf_op */
            kf_expr *a, *b; /* operands */
        } binary;       /* KF_EXPR_BINARY */
        struct {
            kf_expr *c, *a, *b; /* condition, then, else */
        } cond;         /* KF_EXPR_COND */
        struct {
            const char *name; /* callee: a builtin or a scalar function */
            kf_arg *args;     /* arguments in order */
            size_t n;         /* number of arguments */
        } call;         /* KF_EXPR_CALL */
    } u;
};

/* ---- statements of the forward block -------------------------------------- */
typedef struct kf_block {
    kf_stmt **v; /* statements in order */
    size_t n;    /* number of statements */
} kf_block;

typedef enum kf_stmt_kind {
    KF_STMT_ASSIGN, /* name = value; */
    KF_STMT_OUTPUT, /* output name = value; */
    KF_STMT_FOR,    /* for name in lo .. hi { body } */
    KF_STMT_IF,     /* if cond { body } else { orelse } */
    KF_STMT_RETURN, /* return value; (a function's last statement) */
} kf_stmt_kind;

struct kf_stmt {
    kf_stmt_kind kind; /* which fields below are used */
    kf_loc loc;        /* the statement's first token */
    const char *name;  /* ASSIGN/OUTPUT: the name; FOR: the loop variable */
    kf_loc name_loc;   /* where name is written */
    kf_expr *value;    /* ASSIGN/OUTPUT/RETURN: the value; IF: the condition */
    kf_expr *lo, *hi;  /* FOR: the range lo .. hi (hi excluded) */
    kf_block body;     /* FOR: the body; IF: the then branch */
    kf_block orelse;   /* IF: the else branch (an `else if` is one IF in it) */
};

/* ---- items ------------------------------------------------------------------ */
/* One alternative of a weight: a checkpoint tensor name (a template with
 * {i} in layer weights), read transposed and/or restricted to rows. */
typedef struct kf_weight_src {
    const char *tensor; /* the name or template, decoded */
    kf_loc loc;         /* the string literal */
    int transposed;     /* `.T`: its last two dims swapped (stored [in, out], read as [out, in]; of a 3-D
                           [experts, in, out]: each expert's) */
    int row_dim;        /* the dim row_lo.. select from, after .T: 0 (`[lo : hi]`) or 1 (`[:, lo : hi]`) */
    kf_expr *row_lo;    /* `[lo : hi]`: rows of dim row_dim after .T; NULL: all */
    kf_expr *row_hi;    /* end of the rows (excluded); NULL when row_lo is */
    kf_expr *row_step;  /* `[lo : hi : step]`: every step-th row from lo; NULL: 1 */
    int transposed_after; /* `[:, lo : hi].T`: the rows of dim 1 first, then each index's matrix transposed */
} kf_weight_src;

typedef enum kf_item_kind {
    KF_ITEM_MODEL,   /* model NAME; */
    KF_ITEM_MATCHES, /* matches "a", "b"; */
    KF_ITEM_PARAM,   /* param NAME = expr; */
    KF_ITEM_WEIGHT,  /* [optional] [layer] weight NAME[dims] = srcs [if cond]; */
    KF_ITEM_ASSERT,  /* assert expr, "message"; */
    KF_ITEM_IGNORE,  /* ignore "h.{i}.attn.bias", ...; checkpoint tensors the model does not read, on purpose */
    KF_ITEM_FORWARD, /* forward { ... } */
    KF_ITEM_FN,      /* fn NAME(params) { ... return expr; }: expanded where it is called */
} kf_item_kind;

typedef struct kf_item {
    kf_item_kind kind;     /* which fields below are used */
    kf_loc loc;            /* the item's first token */
    const char *name;      /* MODEL, PARAM, WEIGHT, FN: the name */
    kf_loc name_loc;       /* where name is written */
    kf_expr *value;        /* PARAM: the value; ASSERT: the condition; WEIGHT: the `if` condition or NULL */
    const char **strings;  /* MATCHES: the model_type values; IGNORE: tensor names ({i}: any layer); FN: the
                              parameters' names */
    kf_loc *string_locs;   /* MATCHES, IGNORE, FN: where each is written */
    size_t n_strings;      /* MATCHES, IGNORE, FN: how many */
    const char *message;   /* ASSERT: the message */
    kf_expr **dims;        /* WEIGHT: declared shape */
    size_t n_dims;         /* WEIGHT: number of dims */
    kf_weight_src **srcs;  /* WEIGHT: alternatives, first present wins */
    size_t n_srcs;         /* WEIGHT: number of alternatives */
    int is_layer;          /* WEIGHT: one tensor per layer ({i} in the template) */
    int is_optional;       /* WEIGHT: absent from the checkpoint -> none */
    kf_block body;         /* FORWARD, FN: the statements */
} kf_item;

typedef struct kf_file {
    kf_item **items; /* in source order */
    size_t n_items;  /* number of items */
} kf_file;

/* ---- parse-time lists ---------------------------------------------------------
 * Bison builds lists before it knows their length; they grow on the heap and
 * move into the arena when the rule that owns them is reduced. A list that
 * bison discards during error recovery is freed by the grammar's %destructor. */
typedef struct kf_vec {
    void **v;   /* elements */
    size_t n;   /* number of elements */
    size_t cap; /* capacity of v */
} kf_vec;

kf_vec *kf_vec_new(void);
void kf_vec_push(kf_vec *vec, void *elem);
void kf_vec_free(kf_vec *vec);
/* Move the elements into an array in arena a (NULL when empty) and free vec. */
void **kf_vec_finish(kf_vec *vec, ks_arena *a, size_t *n);

/* ---- the parser ---------------------------------------------------------------- */
/* State shared by the scanner and the parser of one parse (jq's locfile +
 * parser context): no globals, so parses can run side by side. */
typedef struct kf_lex_str kf_lex_str; /* the scanner's string buffer (lexer.l) */
typedef struct kf_parser {
    const ks_source *src; /* the text, its name for messages */
    ks_diag *diag;        /* where errors go */
    ks_arena *arena;      /* owns the tree */
    kf_file *file;        /* the result */
    void *scanner;        /* flex's yyscan_t */
    kf_lex_str *lex_str;  /* the string literal being scanned */
    int line, col;        /* scanner position of the next byte */
    kf_loc tok_end[2];    /* just past the last token [0] and the one before it [1] */
    int tok_kind[2];      /* the kinds (bison token numbers) of the same two tokens */
    int errors_at_start;  /* diag->errors when the parse began */
    int brace_depth;      /* '{' open now */
    kf_loc brace_open[KF_MAX_BLOCK_DEPTH]; /* where the open '{' are, outermost first */
    int too_deep;         /* nesting limit hit: reported once */
    int bracket_depth;    /* '(' and '[' open now */
    int prefix_run;       /* prefix operators ('-', '!') in a row just before the next token */
    struct {
        int coalesce;     /* `??` of the chain being read, at this level */
        int cond;         /* `?` of the conditional chain being read, at this level */
    } chain[KF_MAX_EXPR_DEPTH + 1]; /* per bracket level (0: outside any): the right-associative chains
                                       that wait for their last operand (parser.y check_nesting) */
    int stopped;          /* too many errors: the scanner returns end of file */
} kf_parser;

/* Parse a .kiln text. Errors are reported through d; the tree (possibly
 * partial) is returned in any case, and the caller checks d->errors. */
kf_file *kf_parse(const ks_source *src, ks_arena *a, ks_diag *d);

/* Tree constructors used by the grammar (frontend/ast.c). They compute
 * depth and report an over-deep expression once. */
kf_expr *kf_expr_new(kf_parser *p, kf_expr_kind kind, kf_loc loc);
kf_expr *kf_expr_unary(kf_parser *p, int op, kf_expr *a, kf_loc loc);
kf_expr *kf_expr_binary(kf_parser *p, int op, kf_expr *a, kf_expr *b, kf_loc loc);
kf_expr *kf_expr_cond(kf_parser *p, kf_expr *c, kf_expr *a, kf_expr *b, kf_loc loc);
kf_expr *kf_expr_call(kf_parser *p, const char *name, kf_vec *args, kf_loc loc);
kf_expr *kf_expr_index(kf_parser *p, const char *name, kf_expr *index, kf_loc loc);
kf_expr *kf_expr_config(kf_parser *p, kf_vec *steps, kf_loc loc);

/* Scanner entry points used by kf_parse and kf_kiln_matches (lexer.l). */
int kf_lex_init(kf_parser *p);
void kf_lex_destroy(kf_parser *p);

#endif
