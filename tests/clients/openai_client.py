"""Drives a running `minisgl serve` with the official `openai` Python client.

Run by engine/tests/server.rs (`openai_client_matches_offline_generation`):

    python3 tests/clients/openai_client.py EXPECTATIONS.json

EXPECTATIONS.json holds the server's base URL, the model name and cases,
each with the output the engine's offline greedy generation produced for the
same prompt ids:

    {"base_url": "http://127.0.0.1:PORT/v1", "model": "qwen3-tiny",
     "cases": [{"kind": "chat", "messages": [...], "max_tokens": 24,
                "text": "...", "prompt_tokens": 15, "completion_tokens": 24,
                "finish_reason": "length"},
               {"kind": "completion", "prompt": "...", ...}]}

Every case is requested non-streaming, streaming with
`stream_options.include_usage`, and streaming without it; text, finish reason
and usage must match exactly. Chat cases are also asked for `n=2` choices with
log probabilities. Then a few error cases check that the client
raises the right exception classes. Exit status 0 when all pass, 1 with a
list of failures otherwise (2 when `openai` cannot be imported).
"""

import json
import sys

try:
    import openai
except ImportError as e:  # pragma: no cover - environment problem
    print(f"cannot import openai ({e}); run `source scripts/env.sh` first", file=sys.stderr)
    sys.exit(2)

failures = []


def check(cond, what):
    if not cond:
        failures.append(what)


def run_chat(client, model, case):
    name = f"chat {case['messages']!r}"
    kwargs = dict(model=model, messages=case["messages"], max_tokens=case["max_tokens"], temperature=0)

    r = client.chat.completions.create(**kwargs)
    choice = r.choices[0]
    check(r.object == "chat.completion", f"{name}: object {r.object!r}")
    check(choice.message.role == "assistant", f"{name}: role {choice.message.role!r}")
    check(choice.message.content == case["text"], f"{name}: text {choice.message.content!r} != {case['text']!r}")
    check(choice.finish_reason == case["finish_reason"], f"{name}: finish_reason {choice.finish_reason!r}")
    check(r.usage.prompt_tokens == case["prompt_tokens"], f"{name}: prompt_tokens {r.usage.prompt_tokens}")
    check(r.usage.completion_tokens == case["completion_tokens"], f"{name}: completion_tokens {r.usage.completion_tokens}")
    check(r.usage.total_tokens == case["prompt_tokens"] + case["completion_tokens"], f"{name}: total_tokens")

    # n greedy choices are alike; log probabilities come one per token, each
    # with its alternatives, the chosen token the most likely (greedy).
    r = client.chat.completions.create(n=2, logprobs=True, top_logprobs=3, **kwargs)
    check([c.index for c in r.choices] == [0, 1], f"{name} (n=2): indices {[c.index for c in r.choices]!r}")
    for c in r.choices:
        check(c.message.content == case["text"], f"{name} (n=2): text {c.message.content!r}")
        content = c.logprobs.content if c.logprobs else []
        check(len(content) == case["completion_tokens"], f"{name}: {len(content)} logprobs for {case['completion_tokens']} tokens")
        for t in content:
            check(len(t.top_logprobs) == 3 and t.logprob <= 0, f"{name}: logprobs entry {t!r}")
            check(abs(t.top_logprobs[0].logprob - t.logprob) < 1e-6, f"{name}: greedy token {t.token!r} is not the most likely")
    check(r.usage.completion_tokens == 2 * case["completion_tokens"], f"{name} (n=2): usage {r.usage!r}")
    check(r.usage.prompt_tokens == case["prompt_tokens"], f"{name} (n=2): usage {r.usage!r}")

    for include_usage in (True, False):
        extra = {"stream_options": {"include_usage": True}} if include_usage else {}
        text, finish, usage, roles, usage_chunks = "", None, None, [], 0
        for chunk in client.chat.completions.create(stream=True, **kwargs, **extra):
            check(chunk.object == "chat.completion.chunk", f"{name}: chunk object {chunk.object!r}")
            if chunk.usage is not None:
                usage = chunk.usage
                usage_chunks += 1
                check(chunk.choices == [], f"{name}: the usage chunk has choices")
            for c in chunk.choices:
                if c.delta.role:
                    roles.append(c.delta.role)
                text += c.delta.content or ""
                if c.finish_reason:
                    finish = c.finish_reason
        what = f"{name} (stream, include_usage={include_usage})"
        check(text == case["text"], f"{what}: text {text!r} != {case['text']!r}")
        check(finish == case["finish_reason"], f"{what}: finish_reason {finish!r}")
        check(roles == ["assistant"], f"{what}: roles {roles!r}")
        if include_usage:
            check(usage_chunks == 1, f"{what}: {usage_chunks} usage chunks")
            check(usage is not None and usage.completion_tokens == case["completion_tokens"], f"{what}: usage {usage!r}")
            check(usage is not None and usage.prompt_tokens == case["prompt_tokens"], f"{what}: usage {usage!r}")
        else:
            check(usage is None, f"{what}: usage sent without include_usage")


def run_completion(client, model, case):
    name = f"completion {case['prompt']!r}"
    kwargs = dict(model=model, prompt=case["prompt"], max_tokens=case["max_tokens"], temperature=0)

    r = client.completions.create(**kwargs)
    choice = r.choices[0]
    check(r.object == "text_completion", f"{name}: object {r.object!r}")
    check(choice.text == case["text"], f"{name}: text {choice.text!r} != {case['text']!r}")
    check(choice.finish_reason == case["finish_reason"], f"{name}: finish_reason {choice.finish_reason!r}")
    check(r.usage.prompt_tokens == case["prompt_tokens"], f"{name}: prompt_tokens {r.usage.prompt_tokens}")
    check(r.usage.completion_tokens == case["completion_tokens"], f"{name}: completion_tokens {r.usage.completion_tokens}")

    text, finish, usage = "", None, None
    for chunk in client.completions.create(stream=True, stream_options={"include_usage": True}, **kwargs):
        if chunk.usage is not None:
            usage = chunk.usage
        for c in chunk.choices:
            text += c.text
            if c.finish_reason:
                finish = c.finish_reason
    check(text == case["text"], f"{name} (stream): text {text!r} != {case['text']!r}")
    check(finish == case["finish_reason"], f"{name} (stream): finish_reason {finish!r}")
    check(usage is not None and usage.completion_tokens == case["completion_tokens"], f"{name} (stream): usage {usage!r}")


def run_errors(client, model):
    msgs = [{"role": "user", "content": "hi"}]
    expectations = [
        (openai.NotFoundError, dict(model="no-such-model", messages=msgs)),
        (openai.BadRequestError, dict(model=model, messages=msgs, temperature=-1)),
        (openai.BadRequestError, dict(model=model, messages=msgs, n=0)),
        (openai.BadRequestError, dict(model=model, messages=msgs, top_logprobs=2)),
        (openai.BadRequestError, dict(model=model, messages=msgs, frequency_penalty=3)),
        (openai.BadRequestError, dict(model=model, messages=[])),
        (openai.BadRequestError, dict(model=model, messages=msgs, extra_body={"bogus_field": 1})),
    ]
    for cls, kwargs in expectations:
        try:
            client.chat.completions.create(**kwargs)
            failures.append(f"error case {kwargs!r}: no exception")
        except cls as e:
            body = e.body if isinstance(e.body, dict) else {}
            # openai >= 1 unwraps {"error": {...}} into e.body.
            err = body.get("error", body)
            check(isinstance(err.get("message"), str) and err["message"], f"error case {kwargs!r}: no message in {e.body!r}")
        except Exception as e:  # noqa: BLE001 - report any other class as a failure
            failures.append(f"error case {kwargs!r}: {type(e).__name__}: {e}")


def main():
    with open(sys.argv[1], encoding="utf-8") as f:
        spec = json.load(f)
    client = openai.OpenAI(base_url=spec["base_url"], api_key="unused", max_retries=0, timeout=120)
    model = spec["model"]
    ids = [m.id for m in client.models.list().data]
    check(ids == [model], f"models.list: {ids!r}")
    for case in spec["cases"]:
        if case["kind"] == "chat":
            run_chat(client, model, case)
        else:
            run_completion(client, model, case)
    run_errors(client, model)
    if failures:
        print(f"{len(failures)} failure(s):", file=sys.stderr)
        for f_ in failures:
            print(f"  - {f_}", file=sys.stderr)
        sys.exit(1)
    print(f"openai client: {len(spec['cases'])} cases OK against {spec['base_url']} (openai {openai.__version__})")


if __name__ == "__main__":
    main()
