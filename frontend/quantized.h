/*
 * quantized.h — Hub checkpoints stored quantized, read as they are (frontend/quantized.c).
 *
 * Prefix: kf_ (frontend).
 */
#ifndef KILN_QUANTIZED_H
#define KILN_QUANTIZED_H

#include "frontend/checkpoint.h"
#include "frontend/frontend.h"

/* A checkpoint stored quantized, as config.json's quantization_config says: each quantized layer's
 * packed tensors decoded into the float tensor the unquantized checkpoint would hold, added to c under its name ("P.weight" for AWQ's and GPTQ's
 * P.qweight, P.qzeros, P.scales, P.g_idx), f32 [out, in], exactly (code minus zero, times scale).
 * Read by format, not by architecture: quant_method "awq" (GEMM packing, 4-bit, zero points) and
 * "gptq" (4- and 8-bit, sym and asym, desc_act's g_idx, checkpoint_format gptq or gptq_v2). Another
 * method, or a setting kiln does not read, is an error naming the key; a packed tensor of the wrong
 * dtype or shape one naming the tensor. Returns 0, or -1 after reporting through d. The decoded
 * tensors live in c's arena: f32, 8x the packed bytes of 4-bit weights. An AWQ or GPTQ layer whose
 * groups are whole columns in order (no g_idx that permutes them) also keeps its codes as they are:
 * "P.weight#codes" (u8 [out, in]), "P.weight#scales" (f32 [out, groups]) and "P.weight#zeros" (u8 [out,
 * groups], v1's +1 applied), which `kiln build --quant` of the same layout takes as the engine's codes
 * (compiler/optimize.c) instead of quantizing the decoded weight again. */
int kf_checkpoint_dequantize(kf_checkpoint *c, const kf_json_doc *config, ks_diag *d);

/* Whether kiln reads the quantization_config of config (none: yes), before the checkpoint is
 * opened: 0, or -1 after the error kf_checkpoint_dequantize would report for it. */
int kf_quantization_check(const kf_json_doc *config, ks_diag *d);

#endif
