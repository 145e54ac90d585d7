#!/usr/bin/env python3
"""serve_check.py — `kiln serve` against `kiln run` (issue #14's CPU acceptance), Python's standard library only.

Starts servers on free ports and checks, printing one line a check and exiting 1 if any failed:
  - 32 concurrent clients, different prompts and lengths, greedy: each text is exactly what `kiln run
    --temperature 0 -n N` prints after the prompt; streamed chunks concatenate to the same text;
  - seeded sampling through the server gives `kiln run --temperature T --seed S`'s text;
  - a server whose KV cache holds a few requests at once (--kv-blocks 24): 16 long requests all finish
    with their exact texts (preemption), and /metrics counts the preemptions;
  - a streaming client that goes away mid-stream: the others finish, the KV blocks all come back;
  - bad requests, each its status and an OpenAI error object while a long request is being served:
    malformed JSON, a bad field, an unknown path, a wrong method, a body past 1 MiB, a prompt past the
    context, no API key (401) on a server that wants one, a full queue (429);
  - logprobs: greedy tokens are their own top alternative, and the first token's log probability is
    log_softmax of `kiln run --logits-out`'s last row;
  - /health, /v1/models, /metrics;
  - with MODEL_DIR and TEMPLATE (and jinja2 importable): the model again with that chat template in its
    tokenizer_config.json; /v1/chat/completions answers what /v1/completions answers on the ids of the
    conversation as jinja2 renders it (transformers' settings), streamed too.

    python3 serve_check.py KILN ENGINE [MODEL_DIR TEMPLATE]
"""
import http.client, json, os, re, socket, subprocess, sys, threading, time

KILN, ENGINE = sys.argv[1], sys.argv[2]
failures = 0


def check(ok, what):
    global failures
    print(("ok   " if ok else "FAIL ") + what, flush=True)
    failures += 0 if ok else 1


servers = []  # every server started, stopped at exit whatever happens (ctest waits for their output pipes)


@__import__("atexit").register
def stop_servers():
    for p in servers:
        if p.poll() is None:
            p.kill()


class Server:
    def __init__(self, *args):
        self.p = subprocess.Popen([KILN, "serve", ENGINE, "--port", "0", *args], stderr=subprocess.PIPE, text=True)
        servers.append(self.p)
        line = self.p.stderr.readline()
        m = re.search(r"http://127\.0\.0\.1:(\d+)", line)
        if not m:
            raise SystemExit("kiln serve did not start: " + line + self.p.stderr.read())
        self.port = int(m.group(1))

    def request(self, method, path, body=None, headers=None, timeout=120):
        c = http.client.HTTPConnection("127.0.0.1", self.port, timeout=timeout)
        data = body if isinstance(body, (bytes, type(None))) else json.dumps(body).encode()
        c.request(method, path, body=data, headers=headers or {"Content-Type": "application/json"})
        r = c.getresponse()
        out = (r.status, r.read())
        c.close()
        return out

    def complete(self, body, **kw):
        status, data = self.request("POST", "/v1/completions", body, **kw)
        return status, json.loads(data) if data[:1] == b"{" else data

    def stream(self, body, stop_after=None):
        """The text pieces of a streamed completion, and its final chunk; stop_after: close after that many."""
        c = http.client.HTTPConnection("127.0.0.1", self.port, timeout=120)
        c.request("POST", "/v1/completions", body=json.dumps(dict(body, stream=True)).encode())
        r = c.getresponse()
        pieces, final = [], None
        buf = b""
        while True:
            chunk = r.read1(65536) if hasattr(r, "read1") else r.read(1)
            if not chunk:
                break
            buf += chunk
            while b"\n\n" in buf:
                event, buf = buf.split(b"\n\n", 1)
                payload = event[len(b"data: "):]
                if payload == b"[DONE]":
                    c.close()
                    return pieces, final
                j = json.loads(payload)
                if j["choices"][0]["finish_reason"]:
                    final = j
                else:
                    pieces.append(j["choices"][0]["text"])
                if stop_after is not None and len(pieces) >= stop_after:
                    c.sock.shutdown(socket.SHUT_RDWR)
                    c.close()
                    return pieces, None
        c.close()
        return pieces, final

    def metrics(self):
        status, data = self.request("GET", "/metrics")
        return {m.group(1): float(m.group(2)) for m in re.finditer(r"^([a-z_]+(?:\{[^}]*\})?) (\S+)$", data.decode(), re.M)}

    def stop(self):
        self.p.terminate()
        try:
            self.p.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.p.kill()
        return self.p.returncode


def run_text(prompt, n, *extra):
    """`kiln run`'s text after the prompt."""
    out = subprocess.run([KILN, "run", ENGINE, "--prompt", prompt, "-n", str(n), *extra], capture_output=True,
                         text=True).stdout
    out = out[:-1] if out.endswith("\n") else out  # kiln run ends its output with a newline
    return out[len(prompt):] if out.startswith(prompt) else None


WORDS = ("Once upon a time there was a little girl named Lily who loved to play in the park with her dog and "
         "her best friend Tom every sunny day of the summer").split()
prompts = [" ".join(WORDS[(3 * i) % 20:(3 * i) % 20 + 2 + (i * 7) % 12]) for i in range(32)]
lengths = [1 + (i * 11) % 48 for i in range(32)]

# ---- 32 concurrent greedy clients -------------------------------------------------------------------
want = [run_text(p, n, "--temperature", "0") for p, n in zip(prompts, lengths)]
srv = Server("--max-batch", "32")
got, streamed = [None] * 32, [None] * 32


def client(i):
    body = {"prompt": prompts[i], "max_tokens": lengths[i], "temperature": 0}
    if i % 2:
        pieces, final = srv.stream(body)
        streamed[i] = ("".join(pieces), final)
    else:
        got[i] = srv.complete(body)


threads = [threading.Thread(target=client, args=(i,)) for i in range(32)]
for t in threads:
    t.start()
for t in threads:
    t.join()
same = 0
for i in range(32):
    if i % 2:
        text, final = streamed[i]
        ok = text == want[i] and final is not None and final["usage"]["completion_tokens"] <= lengths[i]
    else:
        status, j = got[i]
        ok = status == 200 and j["choices"][0]["text"] == want[i] and j["usage"]["prompt_tokens"] > 0
    if not ok:
        print(f"  client {i}: {got[i] if i % 2 == 0 else streamed[i]!r} against {want[i]!r}")
    same += ok
check(same == 32, f"32 concurrent greedy clients (16 streamed) get kiln run's text: {same} of 32")

# ---- seeded sampling --------------------------------------------------------------------------------
same = 0
for i in range(4):
    w = run_text(prompts[i], 30, "--temperature", "0.8", "--top-p", "0.9", "--seed", str(100 + i))
    status, j = srv.complete({"prompt": prompts[i], "max_tokens": 30, "temperature": 0.8, "top_p": 0.9, "seed": 100 + i})
    same += status == 200 and j["choices"][0]["text"] == w
check(same == 4, f"seeded sampling gives kiln run --seed's text: {same} of 4")

# ---- log probabilities --------------------------------------------------------------------------------
import math, struct, tempfile
ids = [1, 415, 1804, 263, 931]
status, j = srv.complete({"prompt": ids, "max_tokens": 8, "temperature": 0, "logprobs": 3})
lp = j["choices"][0]["logprobs"] if status == 200 else None
ok = lp is not None and len(lp["tokens"]) == j["usage"]["completion_tokens"] and \
    "".join(lp["tokens"]) == j["choices"][0]["text"] and all(v <= 0 for v in lp["token_logprobs"]) and \
    all(len(t) <= 3 and max(t.values()) == v and sum(math.exp(x) for x in t.values()) <= 1 + 1e-6
        for t, v in zip(lp["top_logprobs"], lp["token_logprobs"]))
# the first token's against log_softmax of the prompt's last logits row, from kiln run --logits-out
with tempfile.NamedTemporaryFile(suffix=".f32") as f:
    subprocess.run([KILN, "run", ENGINE, "--ids", ",".join(map(str, ids)), "-n", "0", "--logits-out", f.name],
                   capture_output=True, check=True)
    raw = open(f.name, "rb").read()
row = struct.unpack("%df" % (len(raw) // 4), raw)
vocab = len(row) // len(ids)
last = row[-vocab:]
mx = max(last)
lse = mx + math.log(sum(math.exp(x - mx) for x in last))
ok = ok and abs(lp["token_logprobs"][0] - (mx - lse)) < 1e-5
check(ok, f"logprobs: greedy tokens are their top alternative, text offsets add up, the first "
          f"{lp['token_logprobs'][0] if lp else None:.6f} is log_softmax of kiln run's logits ({mx - lse:.6f})")

# ---- the endpoints, and bad requests while a long one runs -----------------------------------------
status, data = srv.request("GET", "/health")
check(status == 200 and json.loads(data) == {"status": "ok"}, "/health")
status, data = srv.request("GET", "/v1/models")
check(status == 200 and json.loads(data)["data"][0]["object"] == "model", "/v1/models")
long_one = threading.Thread(target=lambda: got.__setitem__(0, srv.complete({"prompt": "Once", "max_tokens": 400,
                                                                           "temperature": 0})))
long_one.start()
bad = [
    ("malformed JSON", "POST", "/v1/completions", b'{"prompt": "Once', 400),
    ("a bad field", "POST", "/v1/completions", {"prompt": "Once", "temperature": 7}, 400),
    ("a list of prompts", "POST", "/v1/completions", {"prompt": ["a", "b"]}, 400),
    ("a token id past the vocabulary", "POST", "/v1/completions", {"prompt": [1, 99999999]}, 400),
    ("logprobs past 20", "POST", "/v1/completions", {"prompt": "Once", "logprobs": 21}, 400),
    ("an unknown path", "GET", "/v2/nothing", None, 404),
    ("a wrong method", "GET", "/v1/completions", None, 405),
    ("a body past 1 MiB", "POST", "/v1/completions", b'{"prompt": "' + b"a" * (1 << 20) + b'"}', 413),
    ("a prompt past the context", "POST", "/v1/completions", {"prompt": [5] * 100000}, 413),
]
for what, method, path, body, code in bad:
    status, data = srv.request(method, path, body)
    ok = status == code
    try:
        ok = ok and "message" in json.loads(data)["error"]
    except ValueError:
        ok = False
    check(ok, f"{what}: {status} (want {code}) and an error object")
long_one.join()
check(got[0][0] == 200 and got[0][1]["usage"]["completion_tokens"] > 0, "the long request, served meanwhile")

# ---- a streaming client that goes away --------------------------------------------------------------
others = [threading.Thread(target=client, args=(i,)) for i in range(1, 8, 2)]
for t in others:
    t.start()
pieces, final = srv.stream({"prompt": "Once", "max_tokens": 400, "temperature": 0}, stop_after=2)
for t in others:
    t.join()
time.sleep(0.5)
m = srv.metrics()
check(all(streamed[i][0] == want[i] for i in range(1, 8, 2)), "a client that went away mid-stream: the others finish")
check(m.get("kiln_kv_blocks_used") == 0 and m.get("kiln_running_requests") == 0,
      f"... and every KV block came back: {m.get('kiln_kv_blocks_used')} used, {m.get('kiln_running_requests')} running")
check(m.get('kiln_requests_total{status="400"}', 0) >= 4 and m.get("kiln_time_to_first_token_seconds_count", 0) >= 32,
      "/metrics counts requests by status and time to first token")
check(srv.stop() == 0, "kiln serve stops on SIGTERM with status 0")

# ---- preemption: a KV cache of 24 blocks for 16 long requests ---------------------------------------
srv = Server("--max-batch", "16", "--kv-blocks", "24")
want16 = [run_text(prompts[i], 120, "--temperature", "0", "--ignore-eos") for i in range(16)]
got16 = [None] * 16


def long_client(i):
    got16[i] = srv.complete({"prompt": prompts[i], "max_tokens": 120, "temperature": 0, "ignore_eos": True})


ts = [threading.Thread(target=long_client, args=(i,)) for i in range(16)]
for t in ts:
    t.start()
for t in ts:
    t.join()
same = sum(got16[i][0] == 200 and got16[i][1]["choices"][0]["text"] == want16[i] for i in range(16))
m = srv.metrics()
check(same == 16, f"16 requests in a KV cache of 24 blocks all finish with kiln run's text: {same} of 16")
check(m.get("kiln_preemptions_total", 0) > 0, f"... preempted and recomputed: {m.get('kiln_preemptions_total')}")
srv.stop()

# ---- the API key and the queue ----------------------------------------------------------------------
srv = Server("--api-key", "sesame", "--max-batch", "1", "--max-queue", "1")
status, j = srv.complete({"prompt": "Once", "max_tokens": 2})
check(status == 401 and "error" in j, "no API key: 401")
auth = {"Content-Type": "application/json", "Authorization": "Bearer sesame"}
status, j = srv.complete({"prompt": "Once", "max_tokens": 2}, headers=auth)
check(status == 200, "the API key: 200")
results = []
ts = [threading.Thread(target=lambda: results.append(srv.complete({"prompt": "Once", "max_tokens": 200,
                                                                   "temperature": 0}, headers=auth)[0]))
      for _ in range(6)]
for t in ts:
    t.start()
for t in ts:
    t.join()
check(429 in results and 200 in results, f"a full queue: 429 for some, 200 for the others ({sorted(results)})")
srv.stop()
# ---- /v1/chat/completions: a ChatML template (tests/data/chat_templates/qwen2.jinja) in a copy of the model ----
MODEL_DIR = sys.argv[3] if len(sys.argv) > 3 else None
TEMPLATE = sys.argv[4] if len(sys.argv) > 4 else None
try:
    import jinja2  # the oracle: the template rendered as transformers' apply_chat_template does
except ImportError:
    jinja2 = None
if MODEL_DIR and TEMPLATE and jinja2:
    import tempfile
    work = tempfile.mkdtemp(prefix="kiln_serve_chat.")
    model = os.path.join(work, "model")
    os.mkdir(model)
    for f in os.listdir(MODEL_DIR):
        if f != "tokenizer_config.json":
            os.symlink(os.path.join(MODEL_DIR, f), os.path.join(model, f))
    cfg = json.load(open(os.path.join(MODEL_DIR, "tokenizer_config.json")))
    cfg["chat_template"] = open(TEMPLATE).read()
    json.dump(cfg, open(os.path.join(model, "tokenizer_config.json"), "w"))
    chat_engine = os.path.join(work, "chat.engine")
    subprocess.run([KILN, "build", model, "-o", chat_engine], check=True, capture_output=True)
    ENGINE = chat_engine
    env = jinja2.Environment(trim_blocks=True, lstrip_blocks=True)
    tpl = env.from_string(cfg["chat_template"])
    srv = Server()
    conversations = [
        [{"role": "user", "content": "Tell me a story about a cat."}],
        [{"role": "system", "content": "You tell short stories."}, {"role": "user", "content": "A dog?"},
         {"role": "assistant", "content": "Once there was a dog."}, {"role": "user", "content": "And then?"}],
    ]
    same = 0
    for k, conv in enumerate(conversations):
        text = tpl.render(messages=conv, add_generation_prompt=True, bos_token="", eos_token="")
        ids = [int(x) for x in subprocess.run([KILN, "tokenize", chat_engine, "--prompt", text, "--no-special"],
                                              capture_output=True, text=True, check=True).stdout.split()]
        _, want_j = srv.complete({"prompt": ids, "max_tokens": 24, "temperature": 0})
        status, j = srv.request("POST", "/v1/chat/completions", {"messages": conv, "max_tokens": 24, "temperature": 0})
        j = json.loads(j)
        ok = status == 200 and j["object"] == "chat.completion" and j["choices"][0]["message"]["role"] == "assistant" \
            and j["choices"][0]["message"]["content"] == want_j["choices"][0]["text"] \
            and j["usage"]["prompt_tokens"] == len(ids)
        if not ok:
            print(f"  conversation {k}: {j!r} against the prompt {text!r} -> {want_j!r}")
        same += ok
    check(same == len(conversations), f"/v1/chat/completions renders the template as jinja2 and answers as "
          f"/v1/completions on those ids: {same} of {len(conversations)}")
    # a chat stream: chat.completion.chunk deltas, the role first, concatenating to the same text
    c = http.client.HTTPConnection("127.0.0.1", srv.port, timeout=60)
    c.request("POST", "/v1/chat/completions", body=json.dumps({"messages": conversations[0], "max_tokens": 24,
                                                                "temperature": 0, "stream": True}).encode())
    raw = c.getresponse().read().decode()
    events = [json.loads(e[6:]) for e in raw.split("\n\n") if e.startswith("data: {")]
    text = "".join(e["choices"][0]["delta"].get("content", "") for e in events)
    _, j = srv.complete({"messages": conversations[0]} and {"prompt": [int(x) for x in subprocess.run(
        [KILN, "tokenize", chat_engine, "--prompt", tpl.render(messages=conversations[0], add_generation_prompt=True,
                                                               bos_token="", eos_token=""), "--no-special"],
        capture_output=True, text=True, check=True).stdout.split()], "max_tokens": 24, "temperature": 0})
    check(events and events[0]["object"] == "chat.completion.chunk" and events[0]["choices"][0]["delta"].get("role") ==
          "assistant" and text == j["choices"][0]["text"] and raw.rstrip().endswith("data: [DONE]"),
          "a chat stream: deltas, the role first, the same text")
    status, j = srv.request("POST", "/v1/chat/completions", {"messages": [{"content": "no role"}]})
    check(status == 400 and "role" in json.loads(j)["error"]["message"], "a message without a role: 400")
    srv.stop()
elif MODEL_DIR:
    print("skip /v1/chat/completions: no jinja2 (python3-jinja2) for the oracle")
print(f"serve_check: {failures} failed")
sys.exit(1 if failures else 0)
