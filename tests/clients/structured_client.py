"""Structured outputs, tool calls and reasoning through the official `openai` client.

Run by engine/tests/structured_outputs.rs against a running `minisgl serve`:

    python3 tests/clients/structured_client.py BASE_URL [--thinking-template] [--max-tokens N]

Checks, each through the client (non-streaming and streaming):
- 20 JSON schemas (nested objects, arrays, enums, bounded numbers, required and
  optional fields, additionalProperties false) as `response_format`: every
  output parses and validates with `jsonschema`, streamed or not; then, one
  request at a time (so that batching cannot move a logit), streamed deltas
  join to exactly the non-streamed answer (sampling is seeded);
- `json_object` gives a JSON object; a completion with a schema validates;
- `tools` with `tool_choice: required` and with a named function: the calls'
  arguments validate against the tool's parameters, the client's stream helper
  assembles the streamed calls into the same calls, and `finish_reason` says so;
- a schema the server cannot enforce is a 400 naming `response_format`;
- with `--thinking-template` (the server runs engine/tests/data/thinking_tools.jinja
  with `--reasoning-parser qwen3`): the output is split into `reasoning_content`
  exactly as the raw completion of the same prompt reads,
  `chat_template_kwargs: {"enable_thinking": false}` gives content only, the
  template shows the tools (not with `tool_choice: none`), and a conversation
  with an assistant tool call and a `tool` result renders.

Outputs must finish by themselves (finish_reason "stop"): each schema bounds
its strings, arrays and numbers (`multipleOf` bounds a number's digits, which
a random fixture model would otherwise repeat until the length limit).
Exit status 0 when all pass, 1 with the list of failures otherwise.
"""

import argparse
import concurrent.futures
import json
import sys

try:
    import jsonschema
    import openai
except ImportError as e:  # pragma: no cover - environment problem
    print(f"cannot import a client package ({e}); run `source scripts/env.sh` first", file=sys.stderr)
    sys.exit(2)

failures = []


def check(cond, what):
    if not cond:
        failures.append(what)
    return cond


S = {"type": "string", "maxLength": 12}

SCHEMAS = [
    {"type": "object", "properties": {"name": S}, "required": ["name"], "additionalProperties": False},
    {"type": "object", "properties": {"age": {"type": "integer", "minimum": 0, "maximum": 120}}, "required": ["age"],
     "additionalProperties": False},
    {"type": "object", "properties": {"color": {"enum": ["red", "green", "blue"]}}, "required": ["color"], "additionalProperties": False},
    {"type": "array", "items": {"type": "integer", "minimum": -9, "maximum": 9}, "minItems": 1, "maxItems": 4},
    {"type": "object", "properties": {"ok": {"type": "boolean"}, "note": S}, "required": ["ok"], "additionalProperties": False},
    {
        "type": "object",
        "properties": {"user": {"type": "object", "properties": {"id": {"type": "integer", "minimum": 1, "maximum": 999}, "name": S},
                                "required": ["id", "name"], "additionalProperties": False}},
        "required": ["user"],
        "additionalProperties": False,
    },
    {"type": "object", "properties": {"tags": {"type": "array", "items": {"enum": ["a", "b", "c"]}, "maxItems": 3}},
     "required": ["tags"], "additionalProperties": False},
    {"type": "object", "properties": {"score": {"type": "number", "minimum": 0, "maximum": 1, "multipleOf": 0.01}}, "required": ["score"],
     "additionalProperties": False},
    {"type": "object", "properties": {"x": {"type": "integer", "minimum": -100, "maximum": 100},
                                      "y": {"type": "integer", "minimum": -100, "maximum": 100}},
     "required": ["x", "y"], "additionalProperties": False},
    {"type": "object", "properties": {"status": {"const": "done"}, "count": {"type": "integer", "minimum": 0, "maximum": 50}},
     "required": ["status", "count"], "additionalProperties": False},
    {"type": "array", "items": {"type": "object", "properties": {"k": {"enum": ["p", "q"]}, "v": {"type": "integer", "minimum": 0, "maximum": 9}},
                                "required": ["k", "v"], "additionalProperties": False}, "minItems": 1, "maxItems": 3},
    {"type": "object", "properties": {"title": S, "year": {"type": "integer", "minimum": 1900, "maximum": 2100},
                                      "genre": {"enum": ["drama", "comedy"]}},
     "required": ["title", "year"], "additionalProperties": False},
    {"type": "object", "properties": {"value": {"anyOf": [{"type": "integer", "minimum": 0, "maximum": 9}, {"type": "boolean"}]}},
     "required": ["value"], "additionalProperties": False},
    {"type": "object", "properties": {"temp": {"type": "number", "exclusiveMinimum": -50, "exclusiveMaximum": 60, "multipleOf": 0.5}},
     "required": ["temp"], "additionalProperties": False},
    {"type": "object", "properties": {"point": {"type": "array", "items": {"type": "integer", "minimum": 0, "maximum": 99},
                                                "minItems": 2, "maxItems": 2}},
     "required": ["point"], "additionalProperties": False},
    {"type": "object", "properties": {"maybe": {"type": ["integer", "null"], "minimum": 0, "maximum": 5}},
     "required": ["maybe"], "additionalProperties": False},
    {"type": "object",
     "properties": {"a": {"type": "object", "properties": {"b": {"type": "object", "properties": {"c": {"enum": [1, 2, 3]}},
                                                                "required": ["c"], "additionalProperties": False}},
                          "required": ["b"], "additionalProperties": False}},
     "required": ["a"], "additionalProperties": False},
    {"type": "object", "properties": {"code": {"type": "string", "pattern": "^[A-Z]{2}[0-9]{2}$"}}, "required": ["code"],
     "additionalProperties": False},
    {"type": "object", "properties": {"first": S, "last": S, "email": S}, "required": ["first"], "additionalProperties": False},
    {"type": "object", "properties": {"items": {"type": "array", "items": S, "minItems": 0, "maxItems": 2},
                                      "total": {"type": "integer", "minimum": 0, "maximum": 1000}},
     "required": ["items", "total"], "additionalProperties": False},
]
assert len(SCHEMAS) == 20

WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "The weather in a city.",
        "parameters": {"type": "object", "properties": {"city": S, "unit": {"enum": ["celsius", "fahrenheit"]}},
                       "required": ["city", "unit"], "additionalProperties": False},
    },
}
TIME = {
    "type": "function",
    "function": {
        "name": "get_time",
        "parameters": {"type": "object", "properties": {"zone": {"enum": ["UTC", "CET"]}}, "required": ["zone"],
                       "additionalProperties": False},
    },
}
PARAMS = {t["function"]["name"]: t["function"]["parameters"] for t in (WEATHER, TIME)}

MESSAGES = [{"role": "user", "content": "Describe a person in a short JSON object."}]


def valid(instance, schema):
    try:
        jsonschema.validate(instance, schema)
        return True
    except jsonschema.ValidationError as e:
        return str(e).splitlines()[0]


def stream_text(client, **kwargs):
    text, reasoning, finish = "", "", None
    for chunk in client.chat.completions.create(stream=True, **kwargs):
        for c in chunk.choices:
            text += c.delta.content or ""
            reasoning += getattr(c.delta, "reasoning_content", None) or ""
            finish = c.finish_reason or finish
    return text, reasoning, finish


def schema_kwargs(model, i, max_tokens):
    # A frequency penalty breaks the loops a random fixture model falls into
    # (a number whose digits never end); it also runs the penalties beside the mask.
    return dict(model=model, messages=MESSAGES, max_tokens=max_tokens, temperature=1.0, seed=100 + i,
                frequency_penalty=1.0,
                response_format={"type": "json_schema", "json_schema": {"name": f"s{i}", "schema": SCHEMAS[i]}})


def check_valid(name, text, finish, schema):
    if check(finish == "stop", f"{name}: finish_reason {finish!r} ({text!r})"):
        try:
            ok = valid(json.loads(text), schema)
            check(ok is True, f"{name}: {text!r} does not validate: {ok}")
        except json.JSONDecodeError as e:
            check(False, f"{name}: {text!r} is not JSON: {e}")


def check_schema(client, model, i, max_tokens):
    kwargs = schema_kwargs(model, i, max_tokens)
    r = client.chat.completions.create(**kwargs)
    check_valid(f"schema {i}", r.choices[0].message.content, r.choices[0].finish_reason, SCHEMAS[i])
    streamed, _, finish = stream_text(client, **kwargs)
    check_valid(f"schema {i} (streamed)", streamed, finish, SCHEMAS[i])


def check_stream_is_exact(client, model, i, max_tokens):
    kwargs = schema_kwargs(model, i, max_tokens)
    text = client.chat.completions.create(**kwargs).choices[0].message.content
    streamed, _, _ = stream_text(client, **kwargs)
    check(streamed == text, f"schema {i}: streamed {streamed!r} != {text!r}")


def check_json_object(client, model, max_tokens):
    for seed in (1, 2):
        r = client.chat.completions.create(model=model, messages=MESSAGES, max_tokens=max_tokens, temperature=1.0,
                                           seed=seed, frequency_penalty=1.0, response_format={"type": "json_object"})
        text = r.choices[0].message.content
        if check(r.choices[0].finish_reason == "stop", f"json_object: finish_reason {r.choices[0].finish_reason!r}"):
            try:
                check(isinstance(json.loads(text), dict), f"json_object: {text!r} is not an object")
            except json.JSONDecodeError as e:
                check(False, f"json_object: {text!r} is not JSON: {e}")


def check_completion(client, model, max_tokens):
    schema = SCHEMAS[10]
    kwargs = dict(model=model, prompt="JSON:", max_tokens=max_tokens, temperature=1.0, seed=7,
                  extra_body={"response_format": {"type": "json_schema", "json_schema": {"name": "c", "schema": schema}}})
    r = client.completions.create(**kwargs)
    text = r.choices[0].text
    if check(r.choices[0].finish_reason == "stop", f"completion: finish_reason {r.choices[0].finish_reason!r}"):
        ok = valid(json.loads(text), schema)
        check(ok is True, f"completion: {text!r} does not validate: {ok}")
    streamed = "".join(c.choices[0].text for c in client.completions.create(stream=True, **kwargs) if c.choices)
    check(streamed == text, f"completion: streamed {streamed!r} != {text!r}")


def calls_of(message):
    return [(c.function.name, c.function.arguments) for c in (message.tool_calls or [])]


def check_tools(client, model, max_tokens, streams):
    for label, choice, parallel in [
        ("required", "required", False),
        ("required, parallel", "required", True),
        ("named", {"type": "function", "function": {"name": "get_time"}}, True),
    ]:
        name = f"tools ({label})"
        kwargs = dict(model=model, messages=[{"role": "user", "content": "What is the weather in Paris?"}],
                      tools=[WEATHER, TIME], tool_choice=choice, parallel_tool_calls=parallel, max_tokens=max_tokens,
                      temperature=1.0, seed=11)
        r = client.chat.completions.create(**kwargs)
        msg = r.choices[0].message
        calls = calls_of(msg)
        if not check(calls, f"{name}: no tool_calls, content {msg.content!r}, finish {r.choices[0].finish_reason!r}"):
            continue
        expected_finish = "stop" if isinstance(choice, dict) else "tool_calls"
        check(r.choices[0].finish_reason in (expected_finish, "tool_calls"), f"{name}: finish_reason {r.choices[0].finish_reason!r}")
        check(parallel or len(calls) == 1, f"{name}: {len(calls)} calls without parallel_tool_calls")
        for fn, args in calls:
            check(fn in PARAMS, f"{name}: unknown function {fn!r}")
            if isinstance(choice, dict):
                check(fn == "get_time", f"{name}: called {fn!r}")
            ok = valid(json.loads(args), PARAMS.get(fn, {}))
            check(ok is True, f"{name}: arguments {args!r} do not validate: {ok}")
        check(all(c.id.startswith("call_") and c.type == "function" for c in msg.tool_calls), f"{name}: call ids/types")
        if not streams:
            continue
        # The client's own stream helper assembles the deltas.
        with client.chat.completions.stream(**kwargs) as stream:
            final = stream.get_final_completion()
        check(calls_of(final.choices[0].message) == calls,
              f"{name}: streamed calls {calls_of(final.choices[0].message)!r} != {calls!r}")
        check(final.choices[0].finish_reason == r.choices[0].finish_reason, f"{name}: streamed finish_reason")


def check_tool_history(client, model):
    # A conversation that carries a call and its result renders and runs.
    history = [
        {"role": "user", "content": "Weather in Paris?"},
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": "{\"city\": \"Paris\", \"unit\": \"celsius\"}"}}]},
        {"role": "tool", "tool_call_id": "call_1", "content": "{\"temp\": 21}"},
    ]
    r = client.chat.completions.create(model=model, messages=history, tools=[WEATHER], max_tokens=4, temperature=0)
    check(r.choices[0].finish_reason in ("stop", "length", "tool_calls"), "tool history: no answer")


def check_rejections(client, model):
    bad = {"type": "object", "properties": {"a": {"$ref": "#/$defs/missing"}}}
    try:
        client.chat.completions.create(model=model, messages=MESSAGES, max_tokens=4,
                                       response_format={"type": "json_schema", "json_schema": {"name": "bad", "schema": bad}})
        check(False, "a schema with a dangling $ref was accepted")
    except openai.BadRequestError as e:
        body = e.body if isinstance(e.body, dict) else {}
        check(body.get("param") == "response_format", f"bad schema: param {body.get('param')!r}")
        check("missing" in str(body.get("message", "")), f"bad schema: message {body.get('message')!r} does not name the problem")
    try:
        client.chat.completions.create(model=model, messages=MESSAGES, max_tokens=4, tool_choice="required")
        check(False, "tool_choice required without tools was accepted")
    except openai.BadRequestError:
        pass


def check_reasoning(client, model, base_url):
    import urllib.request

    def post(path, body):
        req = urllib.request.Request(base_url.rsplit("/v1", 1)[0] + path, data=json.dumps(body).encode(),
                                     headers={"content-type": "application/json"})
        with urllib.request.urlopen(req, timeout=60) as resp:
            return json.load(resp)

    msgs = [{"role": "user", "content": "Why is the sky blue?"}]
    # The template shows the tools (here through /tokenize, as chat requests do).
    prompt = post("/tokenize", {"model": model, "messages": msgs, "tools": [WEATHER]})["prompt"]
    check("\"get_weather\"" in prompt and "<tools>" in prompt, f"tools not rendered into the prompt: {prompt!r}")
    prompt = post("/tokenize", {"model": model, "messages": msgs, "tools": [WEATHER], "tool_choice": "none"})["prompt"]
    check("get_weather" not in prompt, f"tool_choice none still renders the tools: {prompt!r}")
    for kwargs, thinking in [({}, True), ({"enable_thinking": False}, False)]:
        name = f"reasoning (thinking={thinking})"
        prompt = post("/tokenize", {"model": model, "messages": msgs, "chat_template_kwargs": kwargs})["prompt"]
        check(("</think>" in prompt) != thinking, f"{name}: chat_template_kwargs not applied: {prompt!r}")
        raw = client.completions.create(model=model, prompt=prompt, max_tokens=24, temperature=0,
                                        extra_body={"add_special_tokens": False}).choices[0].text
        extra = {"chat_template_kwargs": kwargs} if kwargs else {}
        r = client.chat.completions.create(model=model, messages=msgs, max_tokens=24, temperature=0, extra_body=extra)
        msg = r.choices[0].message
        reasoning = getattr(msg, "reasoning_content", None)
        if thinking:
            want_reasoning, _, rest = raw.partition("</think>")
            check(reasoning == want_reasoning, f"{name}: reasoning_content {reasoning!r} != {want_reasoning!r}")
            check((msg.content or "") == rest.lstrip(), f"{name}: content {msg.content!r} != {rest.lstrip()!r}")
        else:
            check(reasoning is None, f"{name}: reasoning_content {reasoning!r}")
            check(msg.content == raw, f"{name}: content {msg.content!r} != {raw!r}")
        text, streamed_reasoning, _ = stream_text(client, model=model, messages=msgs, max_tokens=24, temperature=0, extra_body=extra)
        check((streamed_reasoning or None) == reasoning and text == (msg.content or ""),
              f"{name}: stream ({streamed_reasoning!r}, {text!r}) != ({reasoning!r}, {msg.content!r})")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("base_url")
    ap.add_argument("--thinking-template", action="store_true")
    ap.add_argument("--max-tokens", type=int, default=160)
    ap.add_argument("--workers", type=int, default=8)
    args = ap.parse_args()
    client = openai.OpenAI(base_url=args.base_url, api_key="none", max_retries=0, timeout=300)
    model = client.models.list().data[0].id
    # Concurrent requests batch in the engine: the run takes a fraction of the time.
    with concurrent.futures.ThreadPoolExecutor(args.workers) as pool:
        jobs = [pool.submit(check_schema, client, model, i, args.max_tokens) for i in range(len(SCHEMAS))]
        jobs.append(pool.submit(check_json_object, client, model, args.max_tokens))
        jobs.append(pool.submit(check_tools, client, model, args.max_tokens, False))
        jobs.append(pool.submit(check_rejections, client, model))
        if args.thinking_template:
            jobs.append(pool.submit(check_reasoning, client, model, args.base_url))
            jobs.append(pool.submit(check_tool_history, client, model))
        for job in jobs:
            try:
                job.result()
            except Exception as e:  # noqa: BLE001 - every failure is reported
                failures.append(f"{type(e).__name__}: {e}")
    # One request at a time: streams must equal the whole answers exactly.
    for step in [lambda: check_stream_is_exact(client, model, 10, args.max_tokens),
                 lambda: check_completion(client, model, args.max_tokens),
                 lambda: check_tools(client, model, args.max_tokens, True)]:
        try:
            step()
        except Exception as e:  # noqa: BLE001 - every failure is reported
            failures.append(f"{type(e).__name__}: {e}")
    if failures:
        print(f"{len(failures)} failures:", file=sys.stderr)
        for f in failures:
            print(f"  - {f}", file=sys.stderr)
        sys.exit(1)
    print("structured outputs: all checks passed")


if __name__ == "__main__":
    main()
