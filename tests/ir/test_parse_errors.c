/*
 * test_parse_errors.c — kir_parse's messages, exactly: each case is a text
 * and the whole log it gives (messages, quoted lines and carets). Every
 * case must fail to parse; several errors come from one run.
 */
#include <stdlib.h>

#include "tests/check.h"
#include "tests/ir/ir_test.h"

typedef struct parse_case {
    const char *name; /* the file name in messages */
    const char *text; /* input */
    const char *log;  /* every message kir_parse writes */
} parse_case;

static const parse_case cases[] = {
    {"many.ir",
     "kiln-ir 1\n"
     "graph \"bad\"\n"
     "param eps = 1e-6\n"
     "param eps = 2\n"
     "%0 : i32[T] = input() {name=\"tokens\"}\n"
     "%1 : f64[T] = input() {name=\"x\"}\n"
     "%2 : f32[T,4] = frobnicate(%0)\n"
     "%3 : f32[T,4] = add(%0, %9)\n"
     "%0 : f32[T] = silu(%3)\n"
     "%4 : f32[T,4] add(%0)\n"
     "%5 : f32[T,4 = silu(%0)\n"
     "%6 : f32[T,4] = scale(%0) {value=1.5.2}\n"
     "%7 : f32[T,4] = scale(%0) {value=}\n"
     "%8 : f32[T,4] = scale(%0) {value=\"abc}\n"
     "%9 : f32[T,4] = slice(%0) {start=0, start=1}\n"
     "%10 : f32[0,4] = silu(%0)\n"
     "%11 : f32[T,4] = silu(%0) @\"x.kiln\":3\n"
     "%12 : f32[T,4] = silu(%5)\n"
     "%13 : f32[T,4] = silu(%0) extra\n",
     "many.ir:4:7: error: param 'eps' defined twice\n"
     "  param eps = 2\n"
     "        ^\n"
     "many.ir:3:7: note: first defined here\n"
     "  param eps = 1e-6\n"
     "        ^\n"
     "many.ir:6:6: error: unknown dtype 'f64'\n"
     "  %1 : f64[T] = input() {name=\"x\"}\n"
     "       ^\n"
     "many.ir:7:17: error: unknown op 'frobnicate'\n"
     "  %2 : f32[T,4] = frobnicate(%0)\n"
     "                  ^\n"
     "many.ir:8:25: error: use of undefined value %9\n"
     "  %3 : f32[T,4] = add(%0, %9)\n"
     "                          ^\n"
     "many.ir:9:1: error: value %0 defined twice\n"
     "  %0 : f32[T] = silu(%3)\n"
     "  ^\n"
     "many.ir:5:1: note: first defined here\n"
     "  %0 : i32[T] = input() {name=\"tokens\"}\n"
     "  ^\n"
     "many.ir:10:15: error: expected '=' after the type, found 'add'\n"
     "  %4 : f32[T,4] add(%0)\n"
     "                ^\n"
     "many.ir:11:14: error: expected ',' or ']' in the type, found '='\n"
     "  %5 : f32[T,4 = silu(%0)\n"
     "               ^\n"
     "many.ir:12:34: error: bad number '1.5.2'\n"
     "  %6 : f32[T,4] = scale(%0) {value=1.5.2}\n"
     "                                   ^\n"
     "many.ir:13:34: error: expected an attribute value (a number, a string or a [list]), found '}'\n"
     "  %7 : f32[T,4] = scale(%0) {value=}\n"
     "                                   ^\n"
     "many.ir:14:34: error: unterminated string\n"
     "  %8 : f32[T,4] = scale(%0) {value=\"abc}\n"
     "                                   ^\n"
     "many.ir:15:37: error: attribute 'start' given twice\n"
     "  %9 : f32[T,4] = slice(%0) {start=0, start=1}\n"
     "                                      ^\n"
     "many.ir:16:11: error: bad dim 0: a dim is a positive integer or T\n"
     "  %10 : f32[0,4] = silu(%0)\n"
     "            ^\n"
     "many.ir:17:38: error: expected ':' after the line number, found end of line\n"
     "  %11 : f32[T,4] = silu(%0) @\"x.kiln\":3\n"
     "                                       ^\n"
     "many.ir:19:27: error: expected end of line after the node, found 'extra'\n"
     "  %13 : f32[T,4] = silu(%0) extra\n"
     "                            ^\n"},

    {"noheader.ir",
     "graph \"x\"\n"
     "%0 : i32[T] = input() {name=\"tokens\"}\n",
     "noheader.ir:1:1: error: expected the header 'kiln-ir 1', found 'graph'\n"
     "  graph \"x\"\n"
     "  ^\n"},

    {"empty.ir", "",
     "empty.ir:1:1: error: expected the header 'kiln-ir 1', found end of input\n"
     "  \n"
     "  ^\n"},

    {"version.ir",
     "kiln-ir 2\n"
     "kiln-ir 1\n"
     "graph \"a\" \"b\"\n"
     "graph \"c\"\n"
     "graph c\n"
     "kiln-ir\n",
     "version.ir:1:9: error: unsupported IR version 2 (this kiln reads version 1)\n"
     "  kiln-ir 2\n"
     "          ^\n"
     "version.ir:2:1: error: the 'kiln-ir' header belongs on the first line\n"
     "  kiln-ir 1\n"
     "  ^\n"
     "version.ir:3:11: error: expected end of line after the graph's name, found '\"b\"'\n"
     "  graph \"a\" \"b\"\n"
     "            ^\n"
     "version.ir:4:1: error: the graph is named twice\n"
     "  graph \"c\"\n"
     "  ^\n"
     "version.ir:5:7: error: expected the graph's name in quotes, found 'c'\n"
     "  graph c\n"
     "        ^\n"
     "version.ir:6:1: error: the 'kiln-ir' header belongs on the first line\n"
     "  kiln-ir\n"
     "  ^\n"},

    {"lex.ir",
     "kiln-ir 1\n"
     "param a = $\n"
     "param b = \"\xff\" \xff\n"
     "param c = \"x\\q\"\n"
     "param d = \"\\x4\"\n"
     "param e = \"\\x00\"\n"
     "param f = \"a\x01\"\n"
     "param g = 99999999999999999999\n"
     "param h = -1e999\n"
     "param i = 12abc\n"
     "% : f32[T] = silu(%0)\n"
     "param = 1\n"
     "param j 1\n"
     "param k = [1, T]\n"
     "param \"a b\" = \"ok\"\n",
     "lex.ir:2:11: error: unexpected character '$'\n"
     "  param a = $\n"
     "            ^\n"
     "lex.ir:3:15: error: unexpected byte 0xff\n"
     "  param b = \"\xff\" \xff\n"
     "                ^\n"
     "lex.ir:4:13: error: bad escape '\\q' in string\n"
     "  param c = \"x\\q\"\n"
     "              ^\n"
     "lex.ir:5:12: error: bad escape in string: \\x needs two hex digits\n"
     "  param d = \"\\x4\"\n"
     "             ^\n"
     "lex.ir:6:12: error: a string cannot hold \\x00\n"
     "  param e = \"\\x00\"\n"
     "             ^\n"
     "lex.ir:7:13: error: control byte 0x01 in a string (write it as \\x01)\n"
     "  param f = \"a\x01\"\n"
     "              ^\n"
     "lex.ir:8:11: error: bad number '99999999999999999999': out of range for a 64-bit integer\n"
     "  param g = 99999999999999999999\n"
     "            ^\n"
     "lex.ir:9:11: error: bad number '-1e999': too large for a double\n"
     "  param h = -1e999\n"
     "            ^\n"
     "lex.ir:10:11: error: bad number '12abc'\n"
     "  param i = 12abc\n"
     "            ^\n"
     "lex.ir:11:1: error: expected a value name after '%'\n"
     "  % : f32[T] = silu(%0)\n"
     "  ^\n"
     "lex.ir:12:7: error: expected a param name, found '='\n"
     "  param = 1\n"
     "        ^\n"
     "lex.ir:13:9: error: expected '=' after the param name, found '1'\n"
     "  param j 1\n"
     "          ^\n"
     "lex.ir:14:15: error: expected a number in the list, found 'T'\n"
     "  param k = [1, T]\n"
     "                ^\n"},

    {"nodes.ir",
     "kiln-ir 1\n"
     "%0 : i32[T] = input() {name=\"tokens\"}\n"
     "%1 i32[T] = input()\n"
     "%2 : [T] = input()\n"
     "%3 : f32 = input()\n"
     "%4 : f32[T,1,2,3,4] = input()\n"
     "%5 : f32[T,x] = input()\n"
     "%6 : f32[T] = 12()\n"
     "%7 : f32[T] = silu %0\n"
     "%8 : f32[T] = silu(%0 %0)\n"
     "%9 : f32[T] = silu(7)\n"
     "%10 : f32[T] = concat(%0,%0,%0,%0,%0,%0,%0,%0,%0,%0,%0,%0,%0,%0,%0,%0,%0)\n"
     "%11 : f32[T] = silu(%0) {1=2}\n"
     "%12 : f32[T] = silu(%0) {a 2}\n"
     "%13 : f32[T] = silu(%0) {a=[1,,2]}\n"
     "%14 : f32[T] = silu(%0) {a=[1 2]}\n"
     "%15 : f32[T] = silu(%0) {a=1 b=2}\n"
     "%16 : f32[T] = silu(%0) @x.kiln:1:2\n"
     "%17 : f32[T] = silu(%0) @\"x.kiln\" 1\n"
     "%18 : f32[T] = silu(%0) @\"x.kiln\":-1:2\n"
     "%19 : f32[T] = silu(%0) @\"x.kiln\":1:c\n"
     "silu(%0)\n"
     "%20 : f32[T] = silu(%0)(\n"
     "%21 : f32[T] = silu(%0) {a=[1.5,T]}\n",
     "nodes.ir:3:4: error: expected ':' after %1, found 'i32'\n"
     "  %1 i32[T] = input()\n"
     "     ^\n"
     "nodes.ir:4:6: error: expected a type like f32[T,128], found '['\n"
     "  %2 : [T] = input()\n"
     "       ^\n"
     "nodes.ir:5:10: error: expected '[' after the dtype, found '='\n"
     "  %3 : f32 = input()\n"
     "           ^\n"
     "nodes.ir:6:18: error: too many dims (at most 4)\n"
     "  %4 : f32[T,1,2,3,4] = input()\n"
     "                   ^\n"
     "nodes.ir:7:12: error: expected a dim (a positive integer or T), found 'x'\n"
     "  %5 : f32[T,x] = input()\n"
     "             ^\n"
     "nodes.ir:8:15: error: expected an op name, found '12'\n"
     "  %6 : f32[T] = 12()\n"
     "                ^\n"
     "nodes.ir:9:20: error: expected '(' after the op name, found '%0'\n"
     "  %7 : f32[T] = silu %0\n"
     "                     ^\n"
     "nodes.ir:10:23: error: expected ',' or ')' after an operand, found '%0'\n"
     "  %8 : f32[T] = silu(%0 %0)\n"
     "                        ^\n"
     "nodes.ir:11:20: error: expected an operand (%N or _), found '7'\n"
     "  %9 : f32[T] = silu(7)\n"
     "                     ^\n"
     "nodes.ir:12:71: error: too many operands (at most 16)\n"
     "  %10 : f32[T] = concat(%0,%0,%0,%0,%0,%0,%0,%0,%0,%0,%0,%0,%0,%0,%0,%0,%0)\n"
     "                                                                        ^\n"
     "nodes.ir:13:26: error: expected an attribute name, found '1'\n"
     "  %11 : f32[T] = silu(%0) {1=2}\n"
     "                           ^\n"
     "nodes.ir:14:28: error: expected '=' after the attribute name 'a', found '2'\n"
     "  %12 : f32[T] = silu(%0) {a 2}\n"
     "                             ^\n"
     "nodes.ir:15:31: error: expected a number or T in the list, found ','\n"
     "  %13 : f32[T] = silu(%0) {a=[1,,2]}\n"
     "                                ^\n"
     "nodes.ir:16:31: error: expected ',' or ']' in the list, found '2'\n"
     "  %14 : f32[T] = silu(%0) {a=[1 2]}\n"
     "                                ^\n"
     "nodes.ir:17:30: error: expected ',' or '}' after an attribute, found 'b'\n"
     "  %15 : f32[T] = silu(%0) {a=1 b=2}\n"
     "                               ^\n"
     "nodes.ir:18:26: error: expected a file name in quotes after '@', found 'x.kiln'\n"
     "  %16 : f32[T] = silu(%0) @x.kiln:1:2\n"
     "                           ^\n"
     "nodes.ir:19:35: error: expected ':' after the file name, found '1'\n"
     "  %17 : f32[T] = silu(%0) @\"x.kiln\" 1\n"
     "                                    ^\n"
     "nodes.ir:20:35: error: bad line number -1\n"
     "  %18 : f32[T] = silu(%0) @\"x.kiln\":-1:2\n"
     "                                    ^\n"
     "nodes.ir:21:37: error: expected a column number, found 'c'\n"
     "  %19 : f32[T] = silu(%0) @\"x.kiln\":1:c\n"
     "                                      ^\n"
     "nodes.ir:22:1: error: expected a node (%N : type = op(...)) or a param, found 'silu'\n"
     "  silu(%0)\n"
     "  ^\n"
     "nodes.ir:23:24: error: expected end of line after the node, found '('\n"
     "  %20 : f32[T] = silu(%0)(\n"
     "                         ^\n"
     "nodes.ir:24:33: error: expected a number in the list of floats, found 'T'\n"
     "  %21 : f32[T] = silu(%0) {a=[1.5,T]}\n"
     "                                  ^\n"},
};

/* Past 50 errors the parser stops with one last message. */
static void test_error_limit(void)
{
    ks_buf text = {0}, log = {0};
    ks_buf_puts(&text, "kiln-ir 1\n");
    for (int i = 0; i < 80; i++) ks_buf_puts(&text, "junk\n");
    kir_graph *g = kt_parse("junk.ir", text.data, &log);
    CHECK(g == NULL);
    int errors = 0;
    for (const char *p = log.data; (p = strstr(p, ": error: ")); p++) errors++;
    CHECK(errors == 51);
    const char *last = "junk.ir: error: too many errors; stopping here\n";
    CHECK(log.len >= strlen(last) && strcmp(log.data + log.len - strlen(last), last) == 0);
    ks_buf_free(&text);
    ks_buf_free(&log);
}

int main(void)
{
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        ks_buf log = {0};
        kir_graph *g = kt_parse(cases[i].name, cases[i].text, &log);
        CHECK(g == NULL);
        kir_graph_free(g);
        CHECK_TEXT(cases[i].name, ks_buf_cstr(&log), cases[i].log);
        ks_buf_free(&log);
    }
    test_error_limit();
    return check_finish("test_parse_errors");
}
