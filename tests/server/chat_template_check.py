#!/usr/bin/env python3
"""chat_template_check.py TEST_CHAT_TEMPLATE TEMPLATES_DIR

server/chat_template.c against Python's jinja2 set up as transformers' apply_chat_template sets it
up (transformers/utils/chat_template_utils.py: an ImmutableSandboxedEnvironment with trim_blocks
and lstrip_blocks, the loopcontrols extension, json.dumps as tojson, raise_exception and
strftime_now as globals; rendered with messages, tools=None, documents=None,
add_generation_prompt and the special tokens). First the C program's own checks; then, for each
template in TEMPLATES_DIR, every conversation below rendered by both, compared byte for byte. A
template that refuses a conversation (raise_exception) must refuse it in both, with the same
message. Exit 0 when all agree, 1 when one differs, 77 (skipped) when jinja2 is not installed.
"""
import json
import os
import subprocess
import sys
import tempfile
from datetime import datetime

try:
    import jinja2
    import jinja2.ext
    from jinja2.sandbox import ImmutableSandboxedEnvironment
except ImportError:
    print("chat_template_check: jinja2 is not installed (python3-jinja2): skipped")
    sys.exit(77)


class GenerationTracker(jinja2.ext.Extension):
    """transformers' AssistantTracker, without the tracking: {% generation %} renders its body."""
    tags = {"generation"}

    def parse(self, parser):
        lineno = next(parser.stream).lineno
        body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
        return jinja2.nodes.Scope(body, lineno=lineno)


def make_env():
    def raise_exception(message):
        raise jinja2.exceptions.TemplateError(message)

    def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
        return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)

    def strftime_now(format):
        return datetime.now().strftime(format)

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                        extensions=[GenerationTracker, jinja2.ext.loopcontrols])
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = strftime_now
    return env


def M(role, content):
    return {"role": role, "content": content}


SYS = M("system", "You are a helpful assistant.\nAnswer briefly.")
U1 = M("user", "Hello, how are you?")
A1 = M("assistant", "  I'm doing great. How can I help you today?  ")
U2 = M("user", "I'd like to show off how chat templating works!\n")
A2 = M("assistant", "Sure: {{ braces }} and {% tags %} are only text here.")
U3 = M("user", "\u3000Unicode: caf\u00e9, \u65e5\u672c\u8a9e, emoji \U0001F600\u00a0\t")

CONVERSATIONS = {
    "user": [U1],
    "system_user": [SYS, U1],
    "multi_turn": [U1, A1, U2],
    "system_multi_turn": [SYS, U1, A1, U2, A2, U3],
    "ends_with_assistant": [U1, A1],
    "unicode_whitespace": [U3],
    "empty_content": [M("user", ""), M("assistant", ""), M("user", " ")],
    "bad_alternation": [U1, U2],
    "starts_with_assistant": [A1, U1],
    "system_only": [SYS],
    "unknown_role": [M("tool", "42"), U1],
    "empty": [],
}

# Beyond the shipped templates: constructs of other real templates (Llama 3.1's namespace and
# tojson, Qwen 2.5's tools branch, Mistral v0.3's selectattr), compared the same way.
EXTRA_TEMPLATES = {
    "x_features": (
        "{%- set ns = namespace(n=0, roles=[]) -%}\n"
        "{%- for m in messages if m.role != 'tool' -%}\n"
        "    {%- set ns.n = ns.n + 1 -%}\n"
        "    {%- set ns.roles = ns.roles + [m.role] -%}\n"
        "    {{ loop.index }}/{{ loop.length }} {{ loop.revindex0 }} {{ m['role'] | upper }}"
        "{{ ':' if loop.first else ';' }} {{ m.content | trim | length }}\n"
        "    {%- if m.content.startswith('Hello') or m.content.endswith(('?', '!')) %} [q]{% endif %}\n"
        "    {{ m.content.split()[:2] }} {{ m.content[1:5] }} {{ m.content[::-3] | tojson }}\n"
        "{% else %}\nno messages\n"
        "{%- endfor %}\n"
        "{{ ns.n }} {{ ns.roles | join(',') }} {{ ns.roles | tojson(indent=2) }}\n"
        "{{ messages | selectattr('role', 'equalto', 'user') | list | length }}"
        " {{ messages | rejectattr('role', 'in', ['user']) | map(attribute='role') | list }}\n"
        "{{ (messages | first).content | default('none') if messages else 'empty' }}"
        " {{ (messages | last)['role'] if messages | length > 0 }}\n"
        "{{ 7 // 2 }} {{ -7 // 2 }} {{ 7 % -3 }} {{ 2 ** 10 }} {{ 1 / 3 }} {{ 0.1 + 0.2 }} {{ 1e16 }} {{ 2.5e-5 }}"
        " {{ 10 / 2 }} {{ 'ab' * 3 }} {{ [1, 2] + [3] }} {{ (1, 'a') }} {{ {'k': none, 1: true} }}\n"
        "{{ tools is none }} {{ documents is defined }} {{ foo is defined }} {{ foo | default('d') }}"
        " {{ '' | default('e', true) }} {{ none }} {{ 3 is odd }} {{ 4 is divisibleby 2 }}"
        " {{ 'x' in 'xyz' }} {{ 'q' not in ['a'] }} {{ 1 < 2 < 3 }} {{ 1 == 1.0 }} {{ true + 1 }}\n"
        "{%- for k, v in {'a': 1, 'b': [2]}.items() %} {{ k }}={{ v | tojson }}{% endfor %}\n"
        "{% set block %}  captured {{ bos_token }}  {% endset %}[{{ block | trim }}] {{ 'Hello World' | lower | title }}"
        " {{ 'a-b c' | title }} {{ 'hello world'.title() }} {{ ' x '.strip() ~ '|' ~ 'xxyxx'.strip('x') }}"
        " {{ 'a,b,,c'.split(',') }} {{ 'a b'.replace(' ', '_') }} {{ 'abc' | replace('b', '') | reverse }}"
        " {{ range(3) | list }} {{ range(1, 10, 4) | join }} {{ [3, 1] | first }} {{ 42 | string | length }}"
        " {{ '12' | int + 1 }} {{ 'x' | float }} {{ -3 | abs }} {%- for i in range(10) %}{% if i > 2 %}{% break %}"
        "{% endif %}{% if i == 1 %}{% continue %}{% endif %} {{ i }}{% endfor %}\n"
        "{{ eos_token if add_generation_prompt else bos_token }}\n"
    ),
    "x_raise": "{% for m in messages %}{% if m.role == 'tool' %}{{ raise_exception('tool role at ' ~ loop.index0) }}"
               "{% endif %}{{ m.content }}{% endfor %}",
}

TOKENS = {
    "llama3": ("<|begin_of_text|>", "<|eot_id|>"),
    "qwen2": ("", "<|im_end|>"),
    "mistral": ("<s>", "</s>"),
    "gemma": ("<bos>", "<eos>"),
    "phi3": ("<s>", "<|endoftext|>"),
}


def cases_for(name):
    bos, eos = TOKENS.get(name, ("<s>", "</s>"))
    for conv_name, messages in CONVERSATIONS.items():
        for gen in (False, True):
            yield {"name": f"{conv_name}/{'gen' if gen else 'nogen'}", "messages": messages,
                   "bos_token": bos, "eos_token": eos, "add_generation_prompt": gen}


def render_python(env, source, case):
    try:
        template = env.from_string(source)
        text = template.render(messages=case["messages"], tools=None, documents=None,
                               add_generation_prompt=case["add_generation_prompt"],
                               bos_token=case["bos_token"], eos_token=case["eos_token"])
        return ("OK", text.encode("utf-8"))
    except jinja2.exceptions.TemplateError as e:
        raised = type(e) is jinja2.exceptions.TemplateError  # raise_exception's, not jinja2's own
        return ("ERROR", str(e).encode("utf-8") if raised else None)


def parse_output(data):
    """CASE <name> OK|ERROR <bytes>\\n<bytes>\\n ... -> {name: (status, bytes)}"""
    out, i = {}, 0
    while i < len(data):
        nl = data.index(b"\n", i)
        _, name, status, size = data[i:nl].decode("utf-8").split(" ")
        size = int(size)
        body = data[nl + 1:nl + 1 + size]
        if data[nl + 1 + size:nl + 2 + size] != b"\n":
            raise ValueError(f"bad record for {name}")
        out[name] = (status, body)
        i = nl + 2 + size
    return out


def main():
    if len(sys.argv) != 3:
        print(__doc__)
        return 2
    prog, tdir = sys.argv[1], sys.argv[2]
    self_check = subprocess.run([prog])
    if self_check.returncode != 0:
        print("chat_template_check: test_chat_template's own checks failed")
        return 1
    env = make_env()
    total = agree = 0
    failed = []
    templates = sorted(f for f in os.listdir(tdir) if f.endswith(".jinja"))
    if not templates:
        print(f"chat_template_check: no templates in {tdir}")
        return 1
    extra_dir = tempfile.mkdtemp(prefix="chat_template_check.")
    sources = []
    for fname in templates:
        path = os.path.join(tdir, fname)
        with open(path, encoding="utf-8") as f:
            sources.append((fname[:-len(".jinja")], path, f.read()))
    for name, source in EXTRA_TEMPLATES.items():
        path = os.path.join(extra_dir, name + ".jinja")
        with open(path, "w", encoding="utf-8") as f:
            f.write(source)
        sources.append((name, path, source))
    for name, path, source in sources:
        cases = list(cases_for(name))
        with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as tf:
            json.dump(cases, tf)
            cases_path = tf.name
        try:
            proc = subprocess.run([prog, path, cases_path], stdout=subprocess.PIPE)
        finally:
            os.unlink(cases_path)
        if proc.returncode != 0:
            failed.append(f"{name}: the renderer exited with {proc.returncode}")
            continue
        got = parse_output(proc.stdout)
        n_ok = n_err = 0
        for case in cases:
            total += 1
            want = render_python(env, source, case)
            have = got.get(case["name"])
            if want[0] == "ERROR":
                same = have is not None and have[0] == "ERROR" and (want[1] is None or have[1] == want[1])
            else:
                same = have == want
            if same:
                agree += 1
                n_ok += want[0] == "OK"
                n_err += want[0] == "ERROR"
            else:
                failed.append(f"{name} {case['name']}:\n  jinja2: {want!r}\n  kiln:   {have!r}")
        print(f"{name}: {n_ok + n_err}/{len(cases)} agree ({n_ok} rendered, {n_err} refused by both)")
    for name, _ in EXTRA_TEMPLATES.items():
        os.unlink(os.path.join(extra_dir, name + ".jinja"))
    os.rmdir(extra_dir)
    for f in failed:
        print("MISMATCH " + f)
    print(f"chat_template_check: {agree} of {total} cases agree with jinja2 {jinja2.__version__}")
    return 0 if agree == total and not failed else 1


if __name__ == "__main__":
    sys.exit(main())
