#!/usr/bin/env python3
"""Integration and load test of `burn-gguf serve`, driven by the official `openai` client.

    python3 tests/python/serve_test.py --bin target/debug/burn-gguf \
        --tiny ../shared/fixtures/gguf/tiny-qwen3-Q8_0.gguf [--gemma PATH]

Starts the server on loopback (port chosen by the OS) and checks, exiting non-zero on the first
failure:
1. API: /v1/models; chat completion, non-streaming and streaming (same greedy text); a
   completion whose greedy tokens equal `burn-gguf run --json` for the same prompt; stop
   strings; usage counts; /health.
2. Load: 64 concurrent streaming chats on the tiny model (and 8 on Gemma with --gemma); all
   complete without error; the server's peak RSS (VmHWM) is printed.
3. Bad input: 200 malformed requests of every kind (malformed schemas and tools included): each answered 4xx with an OpenAI error
   body; a normal request afterwards succeeds.
4. Disconnects: 10 clients leave mid-stream; /health then shows no running sequence.
5. Model names through a Hugging Face hub cache (offline), and --reasoning / per-request
   overrides with a Qwen3-style thinking template.
6. A full queue: with one slot and a queue of one, a third request gets 429.
7. SIGTERM during a request: the request completes and the server exits with status 0.
"""
import argparse
import http.client
import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time

from openai import OpenAI


def fail(msg):
    print(f"serve_test: FAIL: {msg}", file=sys.stderr)
    sys.exit(1)


def check(cond, msg):
    if not cond:
        fail(msg)


class Server:
    def __init__(self, binary, models, extra=()):
        args = [binary, "serve", "--host", "127.0.0.1", "--port", "0"]
        for m in models:
            args += ["-m", m]
        args += list(extra)
        self.proc = subprocess.Popen(args, stderr=subprocess.PIPE, text=True)
        self.log = []
        deadline = time.time() + 900
        self.port = None
        while time.time() < deadline:
            line = self.proc.stderr.readline()
            if not line:
                fail(f"server exited while starting:\n{''.join(self.log)}")
            self.log.append(line)
            if line.startswith("listening on http://"):
                self.port = int(line.strip().rsplit(":", 1)[1])
                break
        check(self.port, "server did not start")
        threading.Thread(target=self._drain, daemon=True).start()
        self.base = f"http://127.0.0.1:{self.port}"
        self.client = OpenAI(base_url=self.base + "/v1", api_key="none", max_retries=0, timeout=900)

    def _drain(self):
        for line in self.proc.stderr:
            self.log.append(line)

    def raw(self, method, path, body=None, headers=None):
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=600)
        conn.request(method, path, body=body, headers=headers or {})
        r = conn.getresponse()
        data = r.read()
        conn.close()
        return r.status, data

    def health(self):
        status, data = self.raw("GET", "/health")
        check(status == 200, f"/health: {status}")
        return json.loads(data)

    def peak_rss_kb(self):
        with open(f"/proc/{self.proc.pid}/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1])
        return -1

    def stop(self):
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=120)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                fail("server did not exit within 120 s of SIGTERM")


def run_json(binary, model, prompt, n):
    out = subprocess.run(
        [binary, "run", "-m", model, "-p", prompt, "-n", str(n), "--temp", "0", "--json"],
        capture_output=True, text=True, check=True,
    )
    return json.loads(out.stdout)


def stream_chat(client, model, content, max_tokens, seed=None):
    kw = {"seed": seed} if seed is not None else {}
    stream = client.chat.completions.create(
        model=model, messages=[{"role": "user", "content": content}], max_tokens=max_tokens,
        temperature=0, stream=True, stream_options={"include_usage": True}, **kw,
    )
    text, finish, usage = "", None, None
    for chunk in stream:
        if chunk.usage is not None:
            usage = chunk.usage
        for c in chunk.choices:
            if c.delta.content:
                text += c.delta.content
            if c.finish_reason:
                finish = c.finish_reason
    return text, finish, usage


def api_checks(srv, binary, tiny_id, tiny_path):
    models = [m.id for m in srv.client.models.list().data]
    check(tiny_id in models, f"/v1/models lists {models}, not {tiny_id}")

    msgs = [{"role": "user", "content": "Write a story about a robot."}]
    r = srv.client.chat.completions.create(model=tiny_id, messages=msgs, max_tokens=16, temperature=0)
    c = r.choices[0]
    check(r.object == "chat.completion" and c.message.role == "assistant", f"chat response {r}")
    check(c.finish_reason in ("stop", "length"), f"finish_reason {c.finish_reason}")
    check(0 < r.usage.completion_tokens <= 16, f"usage {r.usage}")
    check(r.usage.total_tokens == r.usage.prompt_tokens + r.usage.completion_tokens, "total")
    text, finish, usage = stream_chat(srv.client, tiny_id, msgs[0]["content"], 16)
    check(text == c.message.content, f"streamed {text!r} != non-streamed {c.message.content!r}")
    check(finish == c.finish_reason and usage.completion_tokens == r.usage.completion_tokens,
          f"stream finish {finish} usage {usage}")
    print(f"chat: {r.usage.completion_tokens} tokens, same text streamed and not: {text!r}")

    # A prompt the tiny model does not end early: 12 greedy tokens to compare.
    prompt = "The capital of France is"
    ref = run_json(binary, tiny_path, prompt, 12)
    check(len(ref["generated_ids"]) == 12, f"run stopped early: {ref}")
    comp = srv.client.completions.create(model=tiny_id, prompt=prompt, max_tokens=12, temperature=0)
    got = comp.choices[0].text
    check(got == ref["text"], f"completion {got!r} != run's {ref['text']!r}")
    check(comp.usage.completion_tokens == len(ref["generated_ids"]),
          f"completion tokens {comp.usage.completion_tokens} != run's {len(ref['generated_ids'])}")
    check(comp.usage.prompt_tokens == len(ref["prompt_ids"]), "prompt tokens differ from run's")
    print(f"completion: same {len(ref['generated_ids'])} greedy tokens as `run`: {got!r}")

    # A stop string taken from the middle of the greedy text cuts it there, streamed or not.
    check(len(got) >= 8, f"greedy text too short for the stop check: {got!r}")
    stop = got[4:7]
    cut = got[: got.index(stop)]
    s = srv.client.completions.create(model=tiny_id, prompt=prompt, max_tokens=12, temperature=0, stop=[stop])
    check(s.choices[0].text == cut and s.choices[0].finish_reason == "stop",
          f"stop {stop!r}: {s.choices[0].text!r} ({s.choices[0].finish_reason}), expected {cut!r}")
    streamed, finish = "", None
    for chunk in srv.client.completions.create(model=tiny_id, prompt=prompt, max_tokens=12,
                                               temperature=0, stop=stop, stream=True):
        for c in chunk.choices:
            streamed += c.text or ""
            finish = c.finish_reason or finish
    check(streamed == cut and finish == "stop", f"streamed with stop: {streamed!r} ({finish})")
    print(f"stop {stop!r}: text cut to {cut!r}, streamed and not")

    # Sampling with a seed is reproducible.
    a = srv.client.completions.create(model=tiny_id, prompt=prompt, max_tokens=8, temperature=0.9, seed=7)
    b = srv.client.completions.create(model=tiny_id, prompt=prompt, max_tokens=8, temperature=0.9, seed=7)
    check(a.choices[0].text == b.choices[0].text, "same seed, different text")
    h = srv.health()
    check(h["status"] == "ok" and h["running"] == 0, f"/health {h}")


def load(srv, model, n, max_tokens):
    errors, results = [], []

    def one(i):
        try:
            text, finish, usage = stream_chat(srv.client, model, f"Tell me about number {i}.", max_tokens)
            results.append((finish, usage.completion_tokens))
        except Exception as e:  # noqa: BLE001 - any failure counts
            errors.append(repr(e))

    t0 = time.time()
    threads = [threading.Thread(target=one, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    dt = time.time() - t0
    check(not errors, f"{len(errors)} of {n} requests failed: {errors[:3]}")
    check(len(results) == n and all(f in ("stop", "length") for f, _ in results), f"results {results[:5]}")
    tokens = sum(k for _, k in results)
    print(f"load: {n} concurrent streams on {model}: all completed, {tokens} tokens in {dt:.1f} s, "
          f"server peak RSS {srv.peak_rss_kb()} kB")


def bad_requests(srv, model, n_ctx_words):
    big_prompt = "word " * n_ctx_words
    kinds = [
        ("malformed JSON", b'{"model": ', {}),
        ("non-UTF-8 body", b'\xff\xfe{"model": "x"}', {}),
        ("not an object", b"[1, 2, 3]", {}),
        ("unknown model", json.dumps({"model": "nope", "messages": [{"role": "user", "content": "hi"}]}), {}),
        ("missing model", json.dumps({"messages": [{"role": "user", "content": "hi"}]}), {}),
        ("empty messages", json.dumps({"model": model, "messages": []}), {}),
        ("wrong role", json.dumps({"model": model, "messages": [{"role": "wizard", "content": "hi"}]}), {}),
        ("system not first", json.dumps({"model": model, "messages": [{"role": "user", "content": "a"}, {"role": "system", "content": "s"}, {"role": "user", "content": "b"}]}), {}),
        ("last not user", json.dumps({"model": model, "messages": [{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"}]}), {}),
        ("messages not a list", json.dumps({"model": model, "messages": "hi"}), {}),
        ("huge max_tokens", json.dumps({"model": model, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 10**12}), {}),
        ("zero max_tokens", json.dumps({"model": model, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 0}), {}),
        ("negative max_tokens", json.dumps({"model": model, "messages": [{"role": "user", "content": "hi"}], "max_tokens": -5}), {}),
        ("temperature 5", json.dumps({"model": model, "messages": [{"role": "user", "content": "hi"}], "temperature": 5}), {}),
        ("n = 3", json.dumps({"model": model, "messages": [{"role": "user", "content": "hi"}], "n": 3}), {}),
        ("image part", json.dumps({"model": model, "messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}]}), {}),
        ("prompt longer than the context", json.dumps({"model": model, "messages": [{"role": "user", "content": big_prompt}]}), {}),
        ("malformed schema", json.dumps({"model": model, "messages": [{"role": "user", "content": "hi"}], "response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "string", "pattern": "(("}}}}), {}),
        ("response_format not an object", json.dumps({"model": model, "messages": [{"role": "user", "content": "hi"}], "response_format": "json"}), {}),
        ("tools on a template without tools", json.dumps({"model": model, "messages": [{"role": "user", "content": "hi"}], "tools": [{"type": "function", "function": {"name": "f"}}]}), {}),
        ("unknown tool in tool_choice", json.dumps({"model": model, "messages": [{"role": "user", "content": "hi"}], "tools": [{"type": "function", "function": {"name": "f"}}], "tool_choice": {"type": "function", "function": {"name": "g"}}}), {}),
        ("logit_bias (not honoured)", json.dumps({"model": model, "messages": [{"role": "user", "content": "hi"}], "logit_bias": {"5": 10}}), {}),
        ("completion: empty prompt", json.dumps({"model": model, "prompt": ""}), {}),
        ("completion: two prompts", json.dumps({"model": model, "prompt": ["a", "b"]}), {}),
        ("oversized body", b'{"model": "' + b"x" * (3 << 20) + b'"}', {}),
    ]
    paths = ["/v1/chat/completions"] * 22 + ["/v1/completions"] * 2 + ["/v1/chat/completions"]
    counts = {}
    for i in range(200):
        name, body, headers = kinds[i % len(kinds)]
        path = paths[i % len(kinds)]
        if isinstance(body, str):
            body = body.encode()
        status, data = srv.raw("POST", path, body=body, headers={"Content-Type": "application/json", **headers})
        check(400 <= status < 500, f"{name}: status {status}: {data[:200]!r}")
        check(name != "oversized body" or status == 413, f"{name}: status {status}, not 413")
        try:
            err = json.loads(data)["error"]
            check(isinstance(err["message"], str) and err["message"], f"{name}: empty message")
        except (ValueError, KeyError, TypeError):
            fail(f"{name}: body is not an OpenAI error: {data[:200]!r}")
        counts[status] = counts.get(status, 0) + 1
    r = srv.client.chat.completions.create(model=model, messages=[{"role": "user", "content": "hi"}], max_tokens=4, temperature=0)
    check(r.choices[0].finish_reason in ("stop", "length"), "normal request after bad ones")
    print(f"bad input: 200 malformed requests answered {dict(sorted(counts.items()))}; a normal request then succeeded")


def disconnects(srv, model):
    socks = []
    for i in range(10):
        conn = http.client.HTTPConnection("127.0.0.1", srv.port, timeout=600)
        body = json.dumps({"model": model, "messages": [{"role": "user", "content": f"Count to a thousand {i}."}],
                           "max_tokens": 1000, "temperature": 0, "stream": True})
        conn.request("POST", "/v1/chat/completions", body=body, headers={"Content-Type": "application/json"})
        r = conn.getresponse()
        check(r.status == 200, f"stream status {r.status}")
        r.fp.readline()  # the first event
        socks.append(conn)
    before = srv.health()
    for conn in socks:
        conn.sock.close()
        conn.close()
    deadline = time.time() + 60
    while time.time() < deadline:
        h = srv.health()
        if h["running"] == 0 and h["slots_in_use"] == 0 and h["waiting"] == 0:
            print(f"disconnects: 10 clients left mid-stream (running was {before['running']}, "
                  f"slots {before['slots_in_use']}); /health then showed running 0, slots 0")
            return
        time.sleep(0.2)
    fail(f"after 10 disconnects /health still shows {srv.health()}")


THINKING_TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n"
    "{% if enable_thinking is defined and enable_thinking is false %}<think>\n\n</think>\n\n{% endif %}"
    "{% endif %}"
)


def hub_and_reasoning(binary, tiny, tmp):
    """Models named through a Hugging Face hub cache (offline), and --reasoning with a
    Qwen3-style template (thinking off inserts an empty think block)."""
    repo_dir = os.path.join(tmp, "hub", "models--test-org--tiny")
    snapshot = os.path.join(repo_dir, "snapshots", "0123abc")
    os.makedirs(snapshot)
    os.makedirs(os.path.join(repo_dir, "refs"))
    with open(os.path.join(repo_dir, "refs", "main"), "w") as f:
        f.write("0123abc")
    os.symlink(os.path.abspath(tiny), os.path.join(snapshot, "plain.gguf"))
    subprocess.run([sys.executable, "-m", "gguf.scripts.gguf_new_metadata", tiny,
                    os.path.join(snapshot, "thinking.gguf"), "--chat-template", THINKING_TEMPLATE,
                    "--force"], check=True, capture_output=True)
    env = dict(os.environ, HF_HOME=tmp, HF_HUB_OFFLINE="1")

    missing = subprocess.run([binary, "serve", "-m", "test-org/tiny:missing.gguf", "--port", "0"],
                             env=env, capture_output=True, text=True, timeout=60)
    check(missing.returncode != 0 and "missing.gguf" in missing.stderr and "test-org/tiny" in missing.stderr,
          f"a missing hub file: exit {missing.returncode}, {missing.stderr!r}")

    os.environ["HF_HOME"], os.environ["HF_HUB_OFFLINE"] = tmp, "1"
    try:
        srv = Server(binary, ["test-org/tiny"], ["--reasoning", "off"])
    finally:
        del os.environ["HF_HOME"], os.environ["HF_HUB_OFFLINE"]
    try:
        ids = sorted(m.id for m in srv.client.models.list().data)
        check(ids == ["test-org/tiny:plain.gguf", "test-org/tiny:thinking.gguf"], f"hub models {ids}")
        model = "test-org/tiny:thinking.gguf"

        def prompt_tokens(**extra):
            r = srv.client.chat.completions.create(model=model, messages=[{"role": "user", "content": "hi"}],
                                                   max_tokens=1, temperature=0, extra_body=extra)
            return r.usage.prompt_tokens

        off_default = prompt_tokens()
        on = prompt_tokens(reasoning="on")
        auto = prompt_tokens(reasoning="auto")
        kwargs_on = prompt_tokens(chat_template_kwargs={"enable_thinking": True})
        check(off_default > on and on == auto and kwargs_on == on,
              f"prompt tokens: server default off {off_default}, on {on}, auto {auto}, kwargs on {kwargs_on}")
        print(f"hub cache: 'test-org/tiny' served as {ids} offline; a missing file is named in the error; "
              f"reasoning off adds {off_default - on} prompt tokens (the empty think block)")
    finally:
        srv.stop()


def queue_limit(binary, tiny):
    """--max-concurrent 1 --max-queue 1: one request runs, one waits, the third gets 429."""
    srv = Server(binary, [tiny], ["--max-concurrent", "1", "--max-queue", "1"])
    try:
        model = srv.client.models.list().data[0].id
        body = json.dumps({"model": model, "messages": [{"role": "user", "content": "Count."}],
                           "max_tokens": 1000, "temperature": 0, "stream": True})
        running = http.client.HTTPConnection("127.0.0.1", srv.port, timeout=600)
        running.request("POST", "/v1/chat/completions", body=body, headers={"Content-Type": "application/json"})
        r = running.getresponse()
        check(r.status == 200, f"first stream: {r.status}")
        r.fp.readline()
        waiting = http.client.HTTPConnection("127.0.0.1", srv.port, timeout=600)
        waiting.request("POST", "/v1/chat/completions", body=body, headers={"Content-Type": "application/json"})
        deadline = time.time() + 30
        while srv.health()["waiting"] < 1 and time.time() < deadline:
            time.sleep(0.05)
        check(srv.health()["waiting"] == 1, f"no request waiting: {srv.health()}")
        status, data = srv.raw("POST", "/v1/chat/completions", body=body, headers={"Content-Type": "application/json"})
        check(status == 429 and "busy" in json.loads(data)["error"]["message"], f"third request: {status} {data[:200]!r}")
        for c in (running, waiting):
            c.sock.close()
        deadline = time.time() + 60
        while time.time() < deadline:
            h = srv.health()
            if h["running"] == 0 and h["waiting"] == 0 and h["slots_in_use"] == 0:
                break
            time.sleep(0.2)
        check(h["running"] == 0 and h["waiting"] == 0, f"after closing: {h}")
        print("queue: with 1 slot and a queue of 1, the third request got 429; closing both freed everything")
    finally:
        srv.stop()


def sigterm_during_request(binary, tiny):
    srv = Server(binary, [tiny])
    model = srv.client.models.list().data[0].id
    result = {}

    def one():
        result["r"] = srv.client.chat.completions.create(
            model=model, messages=[{"role": "user", "content": "hi"}], max_tokens=48, temperature=0)

    t = threading.Thread(target=one)
    t.start()
    deadline = time.time() + 60
    while srv.health()["running"] == 0 and time.time() < deadline:
        time.sleep(0.05)
    srv.proc.send_signal(signal.SIGTERM)
    t.join(timeout=600)
    check("r" in result and result["r"].choices[0].finish_reason in ("stop", "length"),
          "the request in flight at SIGTERM did not complete")
    code = srv.proc.wait(timeout=120)
    check(code == 0, f"server exited with {code} after SIGTERM")
    print("SIGTERM: the running request completed, then the server exited with status 0")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--bin", required=True)
    ap.add_argument("--tiny", required=True)
    ap.add_argument("--gemma")
    a = ap.parse_args()
    tiny_id = os.path.basename(a.tiny)
    models = [a.tiny] + ([a.gemma] if a.gemma else [])
    srv = Server(a.bin, models, ["--max-concurrent", "8", "--max-queue", "128"])
    try:
        api_checks(srv, a.bin, tiny_id, a.tiny)
        load(srv, tiny_id, 64, 24)
        if a.gemma:
            load(srv, os.path.basename(a.gemma), 8, 8)
        bad_requests(srv, tiny_id, 2100)
        disconnects(srv, tiny_id)
    finally:
        srv.stop()
    with tempfile.TemporaryDirectory() as tmp:
        hub_and_reasoning(a.bin, a.tiny, tmp)
    queue_limit(a.bin, a.tiny)
    sigterm_during_request(a.bin, a.tiny)
    print("serve_test: all checks passed")


if __name__ == "__main__":
    main()
