/*
 * long_inputs.h — the megabyte inputs that tests/tokenizer encodes (every id
 * in the vocabulary, lossless ones decoded back) and bench/tokenizer_speed
 * times, and the shared tokenizers they go through.
 */
#ifndef KILN_TESTS_TOKENIZER_LONG_INPUTS_H
#define KILN_TESTS_TOKENIZER_LONG_INPUTS_H

#include "support/support.h"

/* One input: a name and its text. */
typedef struct tok_long_input {
    const char *name; /* "mixed", "stories" or "one 1 MB word" */
    ks_buf text;      /* about a megabyte */
} tok_long_input;

enum { TOK_LONG_INPUTS = 3, TOK_LONG_TOKENIZERS = 4 };

/* The tokenizers, relative to the shared data folder; the first two are
 * byte-level BPE, which decodes every input back to its bytes; the third
 * (SentencePiece-style) decodes the first input with changes, the others back;
 * the fourth (llama2.c) only encodes. */
static const char *const tok_long_tokenizers[TOK_LONG_TOKENIZERS] = {
    "tokenizers/gpt2-bpe/tokenizer.json", "tokenizers/llama3-bpe/tokenizer.json",
    "models/tinystories-656k/tokenizer.json", "models/stories260k/tok512.bin"};

/* 1 when tokenizer i decodes input k back to its bytes. */
static inline int tok_long_lossless(int i, int k) { return k == 0 ? i < 2 : i < 3; }

/* A megabyte of varied text (stories, digits, punctuation, accents, CJK, emoji), a megabyte of
 * plain stories, and one megabyte-long word. Free each text with ks_buf_free. */
static inline void tok_long_inputs(tok_long_input in[TOK_LONG_INPUTS])
{
    const char *parts[] = {"Once upon a time, there was a little girl named Lily. ",
                           "She loved to play outside in the park with her 12345 red balls!\n",
                           "\"Don't worry,\" said Mom; \"we'll find it.\"\t",
                           "caf\xC3\xA9 na\xC3\xAFve \xE4\xB8\xAD\xE6\x96\x87 \xF0\x9F\x99\x82  ",
                           "x=1; y = x*2 # code\n    return x\n\n"};
    in[0] = (tok_long_input){"mixed", {0}};
    in[1] = (tok_long_input){"stories", {0}};
    in[2] = (tok_long_input){"one 1 MB word", {0}};
    for (size_t i = 0; in[0].text.len < (1u << 20); i++) ks_buf_puts(&in[0].text, parts[i % 5]);
    for (size_t i = 0; in[1].text.len < (1u << 20); i++) ks_buf_puts(&in[1].text, parts[i % 2]);
    for (size_t i = 0; i < (1u << 20); i++) ks_buf_put(&in[2].text, "ab" + (i % 2), 1);
}

#endif
