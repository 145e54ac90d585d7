"""prefill_report.py — the report of a bench/prefill_bench.py run, from its results (the dict
that the run fills and writes as prefill_bench.json): one table with ratios on stdout, a dated
markdown section for bench/RESULTS.md, and a PNG chart when matplotlib is importable. Needs
neither torch nor a GPU: `python3 bench/prefill_bench.py --chart prefill_bench.json` runs it on
a run's JSON anywhere.
"""
import os


def log(*a):
    print(*a, flush=True)


def gemm_shapes(cfg):
    """The prefill GEMMs of one layer (and the head): (name, K in, N out, per layer?)."""
    D, H, KV = cfg["hidden_size"], cfg["num_attention_heads"], cfg["num_key_value_heads"]
    hd = cfg.get("head_dim", D // H)
    Fi, V = cfg["intermediate_size"], cfg["vocab_size"]
    return [("qkv", D, (H + 2 * KV) * hd, True), ("out", H * hd, D, True), ("gate_up", D, 2 * Fi, True),
            ("down", Fi, D, True), ("lm_head", D, V, False)]


def by_tokens(entries):
    return {e["tokens"]: e for e in entries}


def head_ms(res):
    """The head on the last position: its weights read once at the measured copy rate (a matrix-vector
    product is memory-bound), or None."""
    cfg, c = res["config"], (res.get("ceilings") or {}).get("copy")
    if not c:
        return None
    return 2.0 * cfg["vocab_size"] * cfg["hidden_size"] / (c["tb_per_s"] * 1e12) * 1e3


def ceiling_ttft(res):
    """{T: ms}: the prefill's layer GEMMs and attention at cuBLAS's and SDPA's best times, and the head
    on the last position (the first token needs only its logits)."""
    c, L = res.get("ceilings") or {}, res["config"]["num_hidden_layers"]
    out = {}
    head = head_ms(res)
    for s in c.get("sdpa", []):
        T = s["t"]
        gem = [e for e in c.get("gemm", []) if e["t"] == T]
        if len(gem) < 5 or head is None:
            continue
        per_layer = sum(e["ms_min"] for e in gem if e["name"] != "lm_head") + s["ms_min"]
        out[T] = L * per_layer + head
    return out


def prefill_flops(cfg, T):
    """The FLOPs of a T-token prefill's GEMMs (the last position's logits) and causal attention."""
    H = cfg["num_attention_heads"]
    hd = cfg.get("head_dim", cfg["hidden_size"] // H)
    per_layer = sum(2.0 * T * K * N for _, K, N, layer in gemm_shapes(cfg) if layer) + 4.0 * H * hd * T * (T + 1) / 2
    return cfg["num_hidden_layers"] * per_layer + sum(2.0 * K * N for _, K, N, layer in gemm_shapes(cfg)
                                                      if not layer)


def kv_bytes_per_position(cfg):
    """K and V bytes a position of a sequence holds over all layers, in bf16 (what a decode step reads)."""
    hd = cfg.get("head_dim") or cfg["hidden_size"] // cfg["num_attention_heads"]
    return cfg["num_hidden_layers"] * 2 * cfg["num_key_value_heads"] * hd * 2


def decode_floor(res, kv_bytes=0):
    """A decode step's floor, ms: the weights and kv_bytes of K and V read once at the measured copy rate."""
    c = (res.get("ceilings") or {}).get("copy")
    if not c or not res.get("weight_bytes"):
        return None
    return (res["weight_bytes"] + kv_bytes) / (c["tb_per_s"] * 1e12) * 1e3


def ttft_list(entries):
    """'512 tokens 12.47 ms (min 12.46), ...' of kiln bench's prefill entries."""
    return ", ".join(f"{e['tokens']} tokens {e['ttft_ms_median']:.2f} ms (min {e['ttft_ms_min']:.2f})" for e in entries)


def ratio(x, y):
    return f"{x / y:.2f}x" if x and y else "-"


def num(x, f="{:.2f}"):
    return f.format(x) if x is not None else "-"


def table_rows(res):
    """[(what, kiln, peer, ceiling)] in ms: time to first token per length, then decode."""
    kp, pp, cc = by_tokens(res["kiln"]["prefill"]), by_tokens(res["peer"]["prefill"]), ceiling_ttft(res)
    rows = []
    for T in res["lengths"]:
        rows.append((f"time to first token, {T} tokens (ms)", kp.get(T, {}).get("ttft_ms_median"),
                     pp.get(T, {}).get("ttft_ms_median"), cc.get(T)))
    kd, pd = res["kiln"].get("decode") or {}, res["peer"].get("decode") or {}
    rows.append(("decode, batch 1 (ms/token)", kd.get("ms_per_token_median"), pd.get("ms_per_token_median"),
                 decode_floor(res)))
    for b in res["kiln"].get("decode_batch") or []:  # kiln only (the peer decodes one sequence); floor: the weights
        rows.append((f"decode, batch {b['batch']} (ms/step)", b["ms_per_step_median"], None, decode_floor(res)))
    return rows


def flops_rows(res):
    """[(T, kiln, peer, ceiling)] in TFLOP/s of the prefill (prefill_flops over the times)."""
    rows = []
    for (what, k, p, c), T in zip(table_rows(res), res["lengths"]):
        f = prefill_flops(res["config"], T) / 1e9  # per ms
        rows.append((T, *(f / x if x else None for x in (k, p, c))))
    return rows


def render_table(res):
    w = 40
    lines = [f"{'':{w}} {'kiln':>10} {'peer':>10} {'ceiling':>10} {'kiln/peer':>10} {'kiln/ceil':>10}"]
    for what, k, p, c in table_rows(res):
        lines.append(f"{what:{w}} {num(k):>10} {num(p):>10} {num(c):>10} {ratio(k, p):>10} {ratio(k, c):>10}")
    lines.append("")
    lines.append("prefill, achieved TFLOP/s (GEMM and attention FLOPs / time to first token):")
    for T, k, p, c in flops_rows(res):
        lines.append(f"{f'{T} tokens':{w}} {num(k, '{:.3g}'):>10} {num(p, '{:.3g}'):>10} {num(c, '{:.3g}'):>10}")
    lines.append("")
    lines.append("cuBLAS bf16 GEMM, TFLOP/s (best of 5):")
    Ts = sorted({e["t"] for e in (res.get("ceilings") or {}).get("gemm", [])})
    lines.append(f"{'':{w}} " + " ".join(f"{'T=' + str(T):>10}" for T in Ts))
    for name, K, N, _ in gemm_shapes(res["config"]):
        g = {e["t"]: e for e in res["ceilings"]["gemm"] if e["name"] == name} if Ts else {}
        lines.append(f"{name + f' {K}->{N}':{w}} " + " ".join(f"{num(g.get(T, {}).get('tflops'), '{:.3g}'):>10}"
                                                             for T in Ts))
    for s in (res.get("ceilings") or {}).get("sdpa", []):
        lines.append(f"SDPA causal, {s['t']} tokens: {s['ms_min']:.3f} ms ({s['tflops']:.3g} TFLOP/s; {s['backend']})")
    c = (res.get("ceilings") or {}).get("copy")
    if c:
        lines.append(f"device copy: {c['tb_per_s']:.2f} TB/s (read + written)")
    return "\n".join(lines)


def render_markdown(res):
    g = res["gpu"]
    chk = res["peer"].get("check") or {}
    fmt = lambda v: ", ".join(f"{x:.2e}" for x in v) if v else "-"  # noqa: E731
    md = [f"## kiln against the ceilings and a compiled PyTorch peer (bench/prefill_bench.py) — {res['date']}, "
          f"{g['name']}", ""]
    md.append(f"- GPU: {g['name']}, driver {g['driver']}; torch {g['torch']} (CUDA {g['cuda']}), transformers "
              f"{g['transformers']}. Model: {res['config_name']} ({res.get('parameters', 0) / 1e9:.2f} B parameters), "
              f"random bf16 weights (seed {res['seed']}). Budget {res['budget_s']} s; stages took "
              + ", ".join(f"{k} {v} s" for k, v in res["stage_s"].items()) + ".")
    md.append(f"- Command: `{res['command']}`. kiln: `{res['kiln'].get('build_command', '-')}` "
              f"({res['kiln'].get('build_s', '-')} s), then `kiln bench --json` ({res['reps']} timed runs after "
              f"{res['warmup']} warm-up; median shown). Peer: bench/peer_llama.py, {res['peer'].get('mode', '-')}"
              + (f", compiled in {res['peer']['compile_s']} s" if res["peer"].get("compile_s") else "") + ".")
    md.append(f"- Peer check, relative L2 of the logits at the prompt's last position and one decode step against "
              f"Hugging Face float32: peer float32 {fmt(chk.get('peer_f32_vs_hf_f32'))} (limit {chk.get('f32_limit', '-')}); peer "
              f"bf16 {fmt(chk.get('peer_bf16_vs_hf_f32'))}, compiled {fmt(chk.get('compiled_bf16_vs_hf_f32'))}; "
              f"Hugging Face bf16 {fmt(chk.get('hf_bf16_vs_hf_f32'))} (limit {chk.get('bf16_factor', '-')}x that): "
              f"{'pass' if chk.get('pass') and chk.get('compiled_pass', True) else 'FAIL'}.")
    md += ["", "| | kiln | peer | ceiling | kiln / peer | kiln / ceiling |", "|---|---:|---:|---:|---:|---:|"]
    for what, k, p, c in table_rows(res):
        md.append(f"| {what} | {num(k)} | {num(p)} | {num(c)} | {ratio(k, p)} | {ratio(k, c)} |")
    md += ["", "| prefill, achieved TFLOP/s | kiln | peer | ceiling |", "|---|---:|---:|---:|"]
    for T, k, p, c in flops_rows(res):
        md.append(f"| {T} tokens | {num(k, '{:.3g}')} | {num(p, '{:.3g}')} | {num(c, '{:.3g}')} |")
    md += ["", "Ceiling of a prefill: layers x (QKV + out + gate/up + down GEMMs + causal attention) at cuBLAS's "
           "and SDPA's best measured times, and lm_head on the last position (its weights at the measured copy "
           "rate); of decode: the weights' bytes over the measured copy rate. Kiln and the peer compute the "
           "logits of the last position only (since 2026-12-02 step 4; before, both computed every position's). "
           "Achieved TFLOP/s: the prefill's GEMM FLOPs (the last position's logits) and causal attention FLOPs "
           "over its time to first token."]
    after = res["kiln"].get("prefill_after_peer") or []
    if after:
        md.append("kiln's time to first token measured again after the peer's runs (its memory given back): "
                  + ttft_list(after) + ".")
    plain = res["kiln"].get("prefill_no_overlap") or []
    if plain:
        dec = res["kiln"].get("decode_no_overlap")
        md.append("kiln with `--no-kernel-overlap` (each kernel launched after the one before has ended; the "
                  "default overlaps them, programmatic dependent launch): " + ttft_list(plain)
                  + (f", decode {dec['ms_per_token_median']:.3f} ms/token" if dec else "") + ".")
    c = res["kiln"].get("cold_start")
    if c:
        md.append(f"kiln's cold start: {c['total_s']:.2f} s from the engine file ({c['engine_bytes'] / 1e9:.1f} GB) to "
                  f"the first token: the file read and checked in {c['open_s']:.2f} s ({c['read_gb_per_s']:.2f} GB/s, "
                  f"from the page cache or the disk), the session (weights uploaded) {c['session_s']:.2f} s, the "
                  f"first {c['prompt_tokens']}-token prompt's first token {c['first_token_ms']:.1f} ms.")
    da = res["kiln"].get("decode_at") or []
    if da:
        kv_pos = kv_bytes_per_position(res["config"])
        # the peer's at the same points (prefill_bench.peer_decode_at), where it ran
        peer = {(e["context"], r["batch"]): r["ms_per_step_median"] for e in res["peer"].get("decode_at") or []
                for r in e["rows"]}
        static = {(e["context"], r["batch"]) for e in res["peer"].get("decode_at") or [] for r in e["rows"]
                  if r.get("note") == "static"}
        md += ["", "kiln's decode after longer prompts (sequences of that context each; floor: the weights and every "
                   "sequence's K and V read once a step at the measured copy rate; the peer: its decode compiled "
                   "with a cache of that batch, batch 1 marked static: its static decode's figure, after a short prompt):", "",
               "| context | batch | ms/step | tokens/s | peer ms/step | kiln / peer | floor ms | kiln / floor |",
               "|---:|---:|---:|---:|---:|---:|---:|---:|"]
        for e in da:
            for row in e["rows"]:
                floor = decode_floor(res, row["batch"] * e["context"] * kv_pos)
                pm = peer.get((e["context"], row["batch"]))
                md.append(f"| {e['context']} | {row['batch']} | {row['ms_per_step_median']:.3f} | "
                          f"{row['tokens_per_s']:.0f} | {num(pm)}{' (static)' if (e['context'], row['batch']) in static else ''} | {ratio(row['ms_per_step_median'], pm)} | "
                          f"{num(floor)} | {ratio(row['ms_per_step_median'], floor)} |")
        md.append("")
    cold = res.get("cold") or []
    if cold:
        md.append("Cold prefills (each side's prefill after 3 s idle, alternating: the GPU at its idle clock, not the "
                  "power-capped one of the medians above): " + "; ".join(
                      f"{e['tokens']} tokens kiln {e['kiln_median_ms']:.2f} ms, peer {e['peer_median_ms']:.2f} "
                      f"({e['kiln_median_ms'] / e['peer_median_ms']:.3f}x)" for e in cold) + ".")
    if res["kiln"].get("build_peak_mib"):
        md.append(f"kiln build: {res['kiln'].get('build_s')} s, peak memory {res['kiln']['build_peak_mib']:.0f} MiB "
                  f"(--stats).")
    fr = res["kiln"].get("first_runs")
    if fr:
        md.append(f"kiln's first prefills of a process, {fr['tokens']} tokens: `kiln bench` with no warm-up, 6 runs: "
                  f"the first {fr['bench_first_ms']:.2f} ms, median {fr['bench_median_ms']:.2f}, min "
                  f"{fr['bench_min_ms']:.2f}, max {fr['bench_max_ms']:.2f}; `kiln run` (one prefill, no --profile): "
                  f"time to first token {fr['run_ttft_ms']} ms.")
    notes = [e.get("note") for e in res["kiln"]["prefill"] if e.get("note")]
    if notes:
        md.append("kiln: " + "; ".join(f"{e['tokens']} tokens {e['note']}" for e in res["kiln"]["prefill"]
                                       if e.get("note")) + ".")
    Ts = sorted({e["t"] for e in (res.get("ceilings") or {}).get("gemm", [])})
    if Ts:
        md += ["", "cuBLAS bf16 GEMM through torch.matmul, TFLOP/s (best of 5):", "",
               "| GEMM (K -> N) | " + " | ".join(f"T = {T}" for T in Ts) + " |", "|---|" + "---:|" * len(Ts)]
        for name, K, N, _ in gemm_shapes(res["config"]):
            gg = {e["t"]: e for e in res["ceilings"]["gemm"] if e["name"] == name}
            md.append(f"| {name} ({K} -> {N}) | " + " | ".join(num(gg.get(T, {}).get("tflops"), "{:.3g}")
                                                               for T in Ts) + " |")
        md += ["", "| causal attention (SDPA) | " + " | ".join(f"T = {T}" for T in Ts) + " |",
               "|---|" + "---:|" * len(Ts)]
        sd = {s["t"]: s for s in res["ceilings"]["sdpa"]}
        md.append("| ms | " + " | ".join(num(sd.get(T, {}).get("ms_min"), "{:.3f}") for T in Ts) + " |")
        md.append("| TFLOP/s | " + " | ".join(num(sd.get(T, {}).get("tflops"), "{:.3g}") for T in Ts) + " |")
        be = sorted({s["backend"] for s in res["ceilings"]["sdpa"]})
        md.append(f"\nSDPA: {', '.join(be)}. Device copy: {res['ceilings']['copy']['tb_per_s']:.2f} TB/s (bytes "
                  f"read + written per second).")
    if res["skipped"]:
        md.append("\nSkipped: " + "; ".join(res["skipped"]) + ".")
    if res["errors"]:
        md.append("\nErrors: " + "; ".join(e.splitlines()[0] for e in res["errors"]) + ".")
    return "\n".join(md) + "\n"


def lengths_ticks(ax, lengths):
    """A log axis labelled at the lengths measured, as plain numbers."""
    from matplotlib.ticker import FixedLocator, NullLocator, ScalarFormatter
    ax.xaxis.set_major_locator(FixedLocator(lengths))
    ax.xaxis.set_minor_locator(NullLocator())
    ax.xaxis.set_major_formatter(ScalarFormatter())


def draw_chart(res, path):
    """The PNG: time to first token by length (kiln, peer, ceiling), cuBLAS TFLOP/s by GEMM, decode."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        log("no matplotlib here: no chart (run `python3 bench/prefill_bench.py --chart prefill_bench.json` where "
            "it is)")
        return False
    fig, ax = plt.subplots(1, 3, figsize=(16, 4.8))
    kp, pp, cc = by_tokens(res["kiln"]["prefill"]), by_tokens(res["peer"]["prefill"]), ceiling_ttft(res)
    for label, d, style in (("kiln", {T: e["ttft_ms_median"] for T, e in kp.items()}, "o-"),
                            ("PyTorch peer" + (" (torch.compile)" if res["peer"].get("mode", "").startswith("torch.compile") else
                                               " (eager)"), {T: e["ttft_ms_median"] for T, e in pp.items()}, "s-"),
                            ("ceiling (cuBLAS GEMMs + SDPA)", cc, "^--")):
        Ts = sorted(d)
        if Ts:
            ax[0].plot(Ts, [d[T] for T in Ts], style, label=label)
    ax[0].set(xscale="log", yscale="log", xlabel="prompt tokens", ylabel="time to first token, ms",
              title="prefill (time to first token)")
    lengths_ticks(ax[0], res["lengths"])
    ax[0].legend()
    ax[0].grid(True, which="both", alpha=0.3)
    gem = (res.get("ceilings") or {}).get("gemm", [])
    for name, K, N, _ in gemm_shapes(res["config"]):
        pts = sorted((e["t"], e["tflops"]) for e in gem if e["name"] == name)
        if pts:
            ax[1].plot([p[0] for p in pts], [p[1] for p in pts], "o-", label=f"{name} {K}->{N}")
    ax[1].set(xscale="log", xlabel="T (tokens)", ylabel="TFLOP/s", title="bf16 GEMM through torch.matmul (ceiling)")
    lengths_ticks(ax[1], res["lengths"])
    ax[1].legend(fontsize=8)
    ax[1].grid(True, alpha=0.3)
    kd, pd, fl = (res["kiln"].get("decode") or {}), (res["peer"].get("decode") or {}), decode_floor(res)
    bars = [("kiln", kd.get("ms_per_token_median")), ("peer", pd.get("ms_per_token_median")), ("floor", fl)]
    bars = [(n, v) for n, v in bars if v]
    ax[2].bar([b[0] for b in bars], [b[1] for b in bars], color=["C0", "C1", "C2"][:len(bars)])
    for i, (_, v) in enumerate(bars):
        ax[2].text(i, v, f"{v:.2f}", ha="center", va="bottom")
    ax[2].set(ylabel="ms per token", title="decode, batch 1")
    fig.suptitle(f"kiln vs peer vs ceiling — {res['config_name']}, {res['gpu']['name']}, {res['date']}")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    log(f"chart: {path}")
    return True


def report(res, out):
    log("\n" + render_table(res))
    with open(os.path.join(out, "prefill_bench.md"), "w") as f:
        f.write(render_markdown(res))
    drawn = draw_chart(res, os.path.join(out, "prefill_bench.png"))
    log(f"results in {out}: prefill_bench.md" + (", prefill_bench.json" if os.path.exists(
        os.path.join(out, "prefill_bench.json")) else "") + (", prefill_bench.png" if drawn else ""))
