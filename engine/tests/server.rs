//! The OpenAI-compatible server, end to end.
//!
//! Two kinds of servers: in-process ones over a deterministic fake model
//! ([`HashLm`], for exact control of outputs: stop strings, limits), and
//! `minisgl serve` child processes over the tiny fixture models on the CPU
//! (the real command line, the official `openai` Python client, concurrency,
//! disconnects, signals). Expected outputs always come from the engine's
//! offline `generate` on the same prompt ids.

mod server_support;

use std::net::TcpListener;
use std::time::Duration;

use engine::core::engine::{Engine, EngineConfig, GenerateRequest};
use engine::core::kvcache::CacheKind;
use engine::core::req::SamplingParams;
use engine::core::sampling::logprobs::token_logprobs;
use engine::core::sampling::penalties::Penalties;
use engine::core::scheduler::{SchedulePolicy, SchedulerConfig};
use engine::frontend::server::{self, SamplingDefaults, ServerConfig, ServerHandle, ServerLimits};
use engine::text::chat_template::{ChatTemplate, ModelChatConfig, RenderOptions};
use engine::text::tokenizer::Tokenizer;
use serde_json::{json, Value as Json};
use server_support::*;

const MODEL: &str = "qwen3-tiny";

fn tokenizer() -> Tokenizer {
    Tokenizer::from_dir(&fixture(MODEL)).expect("fixture tokenizer")
}

fn fake_lm(tok: &Tokenizer, max_context_len: usize) -> HashLm {
    HashLm {
        vocab_size: tok.vocab_size(),
        max_context_len,
        banned: Vec::new(),
        step_delay: Duration::ZERO,
        fail_on: None,
        panic_on: None,
    }
}

fn fake_engine(lm: HashLm, tok: &Tokenizer, num_pages: usize) -> Engine<HashLm> {
    Engine::new(
        lm,
        EngineConfig {
            scheduler: SchedulerConfig {
                page_size: 4,
                num_pages,
                max_prefill_length: 64,
                max_running_requests: 32,
                cache: CacheKind::Radix,
                policy: SchedulePolicy::Mixed,
                decode_reserve: 1.0,
                eos_token_ids: tok.eos_token_ids().to_vec(),
            },
        },
    )
    .expect("engine config")
}

fn start_fake(lm: HashLm, num_pages: usize) -> ServerHandle {
    start_fake_with_key(lm, num_pages, None)
}

fn start_fake_with_key(lm: HashLm, num_pages: usize, api_key: Option<&str>) -> ServerHandle {
    let tok = tokenizer();
    let engine = fake_engine(lm, &tok, num_pages);
    let chat = ModelChatConfig::load(&fixture(MODEL)).expect("chat config");
    let listener = TcpListener::bind("127.0.0.1:0").expect("bind 127.0.0.1");
    server::start(
        engine,
        tok,
        chat,
        ServerConfig {
            model_name: MODEL.to_owned(),
            model_aliases: vec!["alias/with-slash".to_owned()],
            defaults: SamplingDefaults::openai(),
            shutdown_timeout: Duration::from_secs(5),
            api_key: api_key.map(str::to_owned),
            stats_interval: None,
            public_metrics: false,
            limits: ServerLimits::defaults(),
            parsers: server::OutputParsers { reasoning: None, tool_calls: None },
        },
        listener,
    )
    .expect("start server")
}

/// The chat prompt ids of `messages`, rendered as the server does.
fn chat_prompt_ids(tok: &Tokenizer, messages: &Json) -> Vec<u32> {
    let chat = ModelChatConfig::load(&fixture(MODEL)).unwrap();
    let template = ChatTemplate::new(chat.chat_template.as_deref().unwrap()).unwrap();
    let text =
        template.render(messages.as_array().unwrap(), &RenderOptions::new(true, chat.special_tokens.clone())).unwrap();
    tok.encode(&text, false).unwrap()
}

/// Offline greedy generation of `prompt_ids` with a fresh engine.
fn offline(lm: &HashLm, tok: &Tokenizer, prompt_ids: Vec<u32>, max_tokens: usize) -> (String, usize, String) {
    let mut engine = fake_engine(lm.clone(), tok, 256);
    let out = engine
        .generate(vec![GenerateRequest { prompt_ids, params: SamplingParams::greedy(max_tokens) }])
        .unwrap()
        .remove(0);
    (tok.decode(&out.output_ids, true).unwrap(), out.output_ids.len(), out.finish_reason.to_string())
}

#[test]
fn fake_model_chat_and_completions_match_offline_generation() {
    let tok = tokenizer();
    let lm = fake_lm(&tok, 512);
    let server = start_fake(lm.clone(), 256);
    let addr = server.addr();
    let messages =
        json!([{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Name a prime number."}]);
    let prompt_ids = chat_prompt_ids(&tok, &messages);
    let (want, want_tokens, want_reason) = offline(&lm, &tok, prompt_ids.clone(), 40);

    let body = json!({"model": MODEL, "messages": messages, "max_tokens": 40, "temperature": 0});
    let r = post_json(addr, "/v1/chat/completions", &body);
    assert_eq!(r.status, 200, "{}", r.text());
    let v = r.json();
    assert_eq!(v["object"], "chat.completion");
    assert_eq!(v["choices"][0]["message"]["content"], want.as_str());
    assert_eq!(v["choices"][0]["finish_reason"], want_reason.as_str());
    assert_eq!(v["usage"]["prompt_tokens"], prompt_ids.len());
    assert_eq!(v["usage"]["completion_tokens"], want_tokens);
    assert_eq!(v["usage"]["total_tokens"], prompt_ids.len() + want_tokens);

    let mut body = body.clone();
    body["stream"] = json!(true);
    body["stream_options"] = json!({"include_usage": true});
    let s = SseStream::open(addr, "/v1/chat/completions", &body).unwrap();
    assert_eq!(s.status, 200);
    let payloads = s.collect().unwrap();
    let sum = summarize(&payloads);
    assert!(sum.done && sum.errors.is_empty());
    assert_eq!(sum.text, want);
    assert_eq!(sum.finish_reason.as_deref(), Some(want_reason.as_str()));
    let usage = sum.usage.expect("usage chunk");
    assert_eq!(usage["completion_tokens"], want_tokens);
    // The usage chunk is the last before [DONE], with empty choices.
    let last: Json = serde_json::from_str(&payloads[payloads.len() - 2]).unwrap();
    assert_eq!(last["choices"], json!([]));
    // The first chunk carries the role.
    let first: Json = serde_json::from_str(&payloads[0]).unwrap();
    assert_eq!(first["choices"][0]["delta"]["role"], "assistant");

    // Completions, from text and from token ids.
    let prompt = "The quick brown fox";
    let ids = tok.encode(prompt, true).unwrap();
    let (want, want_tokens, _) = offline(&lm, &tok, ids.clone(), 16);
    for p in [json!(prompt), json!(ids)] {
        let r = post_json(addr, "/v1/completions", &json!({"prompt": p, "temperature": 0}));
        assert_eq!(r.status, 200, "{}", r.text());
        let v = r.json();
        assert_eq!(v["object"], "text_completion");
        assert_eq!(v["choices"][0]["text"], want.as_str());
        assert_eq!(v["usage"]["completion_tokens"], want_tokens);
        let s =
            SseStream::open(addr, "/v1/completions", &json!({"prompt": p, "temperature": 0, "stream": true})).unwrap();
        let sum = summarize(&s.collect().unwrap());
        assert_eq!(sum.text, want);
        assert!(sum.usage.is_none(), "no usage without include_usage");
    }
    // Echo puts the prompt first.
    let r = post_json(addr, "/v1/completions", &json!({"prompt": prompt, "temperature": 0, "echo": true}));
    assert_eq!(r.json()["choices"][0]["text"], format!("{prompt}{want}"));
    server.shutdown().unwrap();
}

/// Offline generation of `prompt_ids` with `params` and a fresh engine: the
/// output ids and text.
fn offline_with(lm: &HashLm, tok: &Tokenizer, prompt_ids: Vec<u32>, params: SamplingParams) -> (Vec<u32>, String) {
    let mut engine = fake_engine(lm.clone(), tok, 256);
    let out = engine.generate(vec![GenerateRequest { prompt_ids, params }]).unwrap().remove(0);
    let text = tok.decode(&out.output_ids, true).unwrap();
    (out.output_ids, text)
}

#[test]
fn choices_logprobs_and_penalties_match_offline_generation() {
    let tok = tokenizer();
    let mut lm = fake_lm(&tok, 512);
    lm.banned = tok.eos_token_ids().to_vec();
    let server = start_fake(lm.clone(), 256);
    let addr = server.addr();
    let messages = json!([{"role": "user", "content": "Tell me a story."}]);
    let prompt_ids = chat_prompt_ids(&tok, &messages);
    let len = prompt_ids.len();

    // n = 3 sampled choices: choice j draws with seed + j.
    let body = json!({"messages": messages, "max_tokens": 12, "temperature": 0.9, "seed": 5, "n": 3});
    let v = post_json(addr, "/v1/chat/completions", &body).json();
    let choices = v["choices"].as_array().expect("choices");
    assert_eq!(choices.len(), 3, "{v}");
    let mut texts = Vec::new();
    for (j, c) in choices.iter().enumerate() {
        let (_, want) = offline_with(&lm, &tok, prompt_ids.clone(), SamplingParams::random(12, 0.9, 5 + j as u64));
        assert_eq!(c["index"], j);
        assert_eq!(c["message"]["content"], want.as_str(), "choice {j}");
        texts.push(want);
    }
    assert!(texts[0] != texts[1] || texts[1] != texts[2], "the choices are all alike: {texts:?}");
    assert_eq!(v["usage"]["prompt_tokens"], len, "the prompt counts once");
    assert_eq!(v["usage"]["completion_tokens"], 36);

    // The same as a stream: chunks tagged by index add up to the same texts.
    let mut stream_body = body.clone();
    stream_body["stream"] = json!(true);
    stream_body["stream_options"] = json!({"include_usage": true});
    let payloads = SseStream::open(addr, "/v1/chat/completions", &stream_body).unwrap().collect().unwrap();
    let mut streamed = vec![String::new(); 3];
    let mut finished = 0;
    for p in payloads.iter().filter(|p| *p != "[DONE]") {
        let chunk: Json = serde_json::from_str(p).unwrap();
        for c in chunk["choices"].as_array().unwrap() {
            let i = c["index"].as_u64().unwrap() as usize;
            streamed[i].push_str(c["delta"]["content"].as_str().unwrap_or(""));
            finished += usize::from(c["finish_reason"].is_string());
        }
    }
    assert_eq!(streamed, texts);
    assert_eq!(finished, 3);
    assert_eq!(summarize(&payloads).usage.expect("usage")["completion_tokens"], 36);

    // Log probabilities: the raw model distribution at every greedy step.
    let body = json!({"messages": messages, "max_tokens": 6, "temperature": 0, "logprobs": true, "top_logprobs": 2});
    let v = post_json(addr, "/v1/chat/completions", &body).json();
    let (ids, _) = offline_with(&lm, &tok, prompt_ids.clone(), SamplingParams::greedy(6));
    let content = v["choices"][0]["logprobs"]["content"].as_array().expect("logprobs.content").clone();
    assert_eq!(content.len(), ids.len());
    let mut history = prompt_ids.clone();
    for (k, (entry, &id)) in content.iter().zip(&ids).enumerate() {
        let pos = history.len() - 1;
        let want = token_logprobs(&lm.logits(history[pos], pos as u32), id, 2);
        let text = |t: u32| tok.decode(&[t], false).unwrap();
        assert_eq!(entry["token"], text(id).as_str(), "step {k}");
        assert!((entry["logprob"].as_f64().unwrap() - f64::from(want.logprob)).abs() < 1e-6, "step {k}: {entry}");
        assert_eq!(entry["bytes"], json!(text(id).as_bytes()));
        let top = entry["top_logprobs"].as_array().unwrap();
        assert_eq!(top.len(), 2);
        for (got, (t, lp)) in top.iter().zip(&want.top) {
            assert_eq!(got["token"], text(*t).as_str());
            assert!((got["logprob"].as_f64().unwrap() - f64::from(*lp)).abs() < 1e-6);
        }
        history.push(id);
    }
    // Streamed, every token's entry arrives once.
    let mut stream_body = body.clone();
    stream_body["stream"] = json!(true);
    let payloads = SseStream::open(addr, "/v1/chat/completions", &stream_body).unwrap().collect().unwrap();
    let streamed: Vec<Json> = payloads
        .iter()
        .filter(|p| *p != "[DONE]")
        .flat_map(|p| {
            let chunk: Json = serde_json::from_str(p).unwrap();
            chunk["choices"][0]["logprobs"]["content"].as_array().cloned().unwrap_or_default()
        })
        .collect();
    assert_eq!(streamed, content);
    // Without `logprobs` there are none.
    let v = post_json(addr, "/v1/chat/completions", &json!({"messages": messages, "max_tokens": 2})).json();
    assert!(v["choices"][0]["logprobs"].is_null());

    // Penalties reach the sampler.
    let penalties = Penalties { repetition: 1.3, frequency: 1.0, presence: 0.5 };
    let (_, want) =
        offline_with(&lm, &tok, prompt_ids.clone(), SamplingParams { penalties, ..SamplingParams::greedy(20) });
    let (_, plain) = offline_with(&lm, &tok, prompt_ids.clone(), SamplingParams::greedy(20));
    assert_ne!(want, plain, "the penalties change nothing on this prompt");
    let body = json!({"messages": messages, "max_tokens": 20, "temperature": 0,
        "repetition_penalty": 1.3, "frequency_penalty": 1.0, "presence_penalty": 0.5});
    assert_eq!(
        post_json(addr, "/v1/chat/completions", &body).json()["choices"][0]["message"]["content"],
        want.as_str()
    );

    // Completions of a batch of prompts, n = 2 each: choice 2p + j, with echo
    // and per-token offsets counted from the echoed prompt.
    let prompts = ["The quick brown fox", "Once upon"];
    let body = json!({"prompt": prompts, "n": 2, "max_tokens": 5, "temperature": 0, "echo": true, "logprobs": 1});
    let v = post_json(addr, "/v1/completions", &body).json();
    let choices = v["choices"].as_array().expect("choices");
    assert_eq!(choices.len(), 4, "{v}");
    let mut prompt_tokens = 0;
    for (p, prompt) in prompts.iter().enumerate() {
        let ids = tok.encode(prompt, true).unwrap();
        prompt_tokens += ids.len();
        let (_, want) = offline_with(&lm, &tok, ids, SamplingParams::greedy(5));
        for j in 0..2 {
            let c = &choices[2 * p + j];
            assert_eq!(c["index"], 2 * p + j);
            assert_eq!(c["text"], format!("{prompt}{want}"));
            let lp = &c["logprobs"];
            assert_eq!(lp["tokens"].as_array().unwrap().len(), 5);
            assert_eq!(lp["text_offset"][0], prompt.chars().count());
            assert_eq!(lp["top_logprobs"][0].as_object().unwrap().len(), 1);
        }
    }
    assert_eq!(v["usage"]["prompt_tokens"], prompt_tokens);
    assert_eq!(v["usage"]["completion_tokens"], 20);

    // Out of range.
    for (body, param) in [
        (json!({"messages": messages, "n": 0}), "n"),
        (json!({"messages": messages, "n": 129}), "n"),
        (json!({"messages": messages, "top_logprobs": 2}), "top_logprobs"),
        (json!({"messages": messages, "logprobs": true, "top_logprobs": 21}), "top_logprobs"),
        (json!({"messages": messages, "logprobs": 3}), "logprobs"),
        (json!({"messages": messages, "frequency_penalty": -2.5}), "frequency_penalty"),
        (json!({"messages": messages, "presence_penalty": "high"}), "presence_penalty"),
        (json!({"messages": messages, "repetition_penalty": 0}), "repetition_penalty"),
    ] {
        let r = post_json(addr, "/v1/chat/completions", &body);
        assert_eq!(r.status, 400, "{body}: {}", r.text());
        assert_eq!(r.json()["error"]["param"], param, "{body}");
    }
    for (body, param) in [
        (json!({"prompt": ["a", 5]}), "prompt.1"),
        (json!({"prompt": ["a", []]}), "prompt.1"),
        (json!({"prompt": "a", "logprobs": 21}), "logprobs"),
        (json!({"prompt": ["a", "b", "c"], "n": 50}), "n"),
    ] {
        let r = post_json(addr, "/v1/completions", &body);
        assert_eq!(r.status, 400, "{body}: {}", r.text());
        assert_eq!(r.json()["error"]["param"], param, "{body}");
    }
    server.shutdown().unwrap();
}

#[test]
fn an_api_key_guards_every_route_but_health() {
    let tok = tokenizer();
    let server = start_fake_with_key(fake_lm(&tok, 512), 64, Some("sekrit"));
    let addr = server.addr();
    let body = json!({"prompt": "hi", "max_tokens": 2});
    let body = body.to_string();
    let send = |method: &str, path: &str, headers: &[(&str, &str)], body: Option<&str>| {
        request_with_headers(addr, method, path, headers, body.map(str::as_bytes)).unwrap()
    };
    for headers in [vec![], vec![("Authorization", "Bearer wrong")], vec![("Authorization", "sekrit")]] {
        let r = send("POST", "/v1/completions", &headers, Some(&body));
        assert_eq!(r.status, 401, "{headers:?}: {}", r.text());
        assert_eq!(r.json()["error"]["code"], "invalid_api_key");
    }
    assert_eq!(send("GET", "/v1/models", &[], None).status, 401);
    let auth = [("Authorization", "Bearer sekrit")];
    let r = send("POST", "/v1/completions", &auth, Some(&body));
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(send("GET", "/v1/models", &auth, None).status, 200);
    // Only health stays open; the scheme is case-insensitive.
    assert_eq!(get(addr, "/health").status, 200);
    for (method, path, body) in [
        ("GET", "/metrics", None),
        ("POST", "/tokenize", Some(r#"{"prompt": "hi"}"#)),
        ("POST", "/detokenize", Some(r#"{"tokens": [1]}"#)),
        ("POST", "/flush_cache", None),
        ("GET", "/version", None),
        ("GET", "/no-such-route", None),
    ] {
        assert_eq!(send(method, path, &[], body).status, 401, "{method} {path}");
        let lower = [("Authorization", "bearer sekrit")];
        let want = if path == "/no-such-route" { 404 } else { 200 };
        assert_eq!(send(method, path, &lower, body).status, want, "{method} {path} with the key");
    }
    // State-changing routes are POST only.
    assert_eq!(send("GET", "/flush_cache", &auth, None).status, 405);
    server.shutdown().unwrap();
}

#[test]
fn stop_strings_end_requests_early() {
    let tok = tokenizer();
    let mut lm = fake_lm(&tok, 512);
    lm.banned = tok.eos_token_ids().to_vec();
    let server = start_fake(lm.clone(), 256);
    let prompt = "Once upon a time";
    let ids = tok.encode(prompt, true).unwrap();
    let (full, full_tokens, _) = offline(&lm, &tok, ids.clone(), 60);
    let chars: Vec<char> = full.chars().collect();
    assert!(chars.len() > 20, "the fake model's text is long enough: {full:?}");
    let stop: String = chars[10..13].iter().collect();
    let cut = &full[..full.find(&stop).unwrap()];
    for stream in [false, true] {
        let body = json!({"prompt": prompt, "max_tokens": 60, "temperature": 0, "stop": [stop], "stream": stream,
                          "stream_options": if stream { json!({"include_usage": true}) } else { Json::Null }});
        let (text, reason, usage) = if stream {
            let sum = summarize(&SseStream::open(server.addr(), "/v1/completions", &body).unwrap().collect().unwrap());
            (sum.text, sum.finish_reason.unwrap(), sum.usage.unwrap())
        } else {
            let v = post_json(server.addr(), "/v1/completions", &body).json();
            (
                v["choices"][0]["text"].as_str().unwrap().to_owned(),
                v["choices"][0]["finish_reason"].as_str().unwrap().to_owned(),
                v["usage"].clone(),
            )
        };
        assert_eq!(text, cut, "stream={stream}");
        assert_eq!(reason, "stop");
        let n = usage["completion_tokens"].as_u64().unwrap() as usize;
        assert!(n < full_tokens, "the request ended early ({n} of {full_tokens} tokens)");
    }
    // max_tokens ends with `length`.
    let v = post_json(server.addr(), "/v1/completions", &json!({"prompt": prompt, "max_tokens": 3, "temperature": 0}))
        .json();
    assert_eq!(v["choices"][0]["finish_reason"], "length");
    assert_eq!(v["usage"]["completion_tokens"], 3);
    server.shutdown().unwrap();
}

/// One bad request and what the server must answer.
struct Bad {
    method: &'static str,
    path: &'static str,
    body: Option<String>,
    status: u16,
    /// The `param` of the error (None: must be null).
    param: Option<&'static str>,
}

fn bad(path: &'static str, body: Json, status: u16, param: Option<&'static str>) -> Bad {
    Bad { method: "POST", path, body: Some(body.to_string()), status, param }
}

/// Sends every bad request of the spec and checks status and error shape;
/// the server must keep serving after each one.
fn check_bad_requests(addr: std::net::SocketAddr, model: &str, max_context_len: usize) {
    let chat = "/v1/chat/completions";
    let cmpl = "/v1/completions";
    let msgs = json!([{"role": "user", "content": "hi"}]);
    let with = |extra: Json| {
        let mut b = json!({"model": model, "messages": msgs});
        for (k, v) in extra.as_object().unwrap() {
            b[k] = v.clone();
        }
        b
    };
    let long_prompt = "word ".repeat(max_context_len * 2);
    let cases = vec![
        Bad { method: "POST", path: chat, body: Some("{not json".into()), status: 400, param: None },
        Bad { method: "POST", path: chat, body: Some("[1, 2]".into()), status: 400, param: None },
        Bad { method: "POST", path: chat, body: Some(String::new()), status: 400, param: None },
        bad(chat, json!({"model": model}), 400, Some("messages")),
        bad(chat, json!({"model": model, "messages": []}), 400, Some("messages")),
        bad(chat, json!({"model": model, "messages": "hi"}), 400, Some("messages")),
        bad(chat, json!({"model": model, "messages": [{"content": "x"}]}), 400, Some("messages.0.role")),
        bad(
            chat,
            json!({"model": model, "messages": [{"role": "user", "content": 5}]}),
            400,
            Some("messages.0.content"),
        ),
        bad(
            chat,
            json!({"model": model, "messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}]}),
            400,
            Some("messages.0.content.0.type"),
        ),
        bad(chat, with(json!({"temperature": -0.5})), 400, Some("temperature")),
        bad(chat, with(json!({"temperature": "hot"})), 400, Some("temperature")),
        bad(chat, with(json!({"top_p": 0})), 400, Some("top_p")),
        bad(chat, with(json!({"top_p": 1.5})), 400, Some("top_p")),
        bad(chat, with(json!({"top_k": -2})), 400, Some("top_k")),
        bad(chat, with(json!({"min_p": 2})), 400, Some("min_p")),
        bad(chat, with(json!({"max_tokens": 0})), 400, Some("max_tokens")),
        bad(chat, with(json!({"max_tokens": -3})), 400, Some("max_tokens")),
        bad(chat, with(json!({"max_tokens": 1.5})), 400, Some("max_tokens")),
        bad(chat, with(json!({"max_completion_tokens": 0})), 400, Some("max_completion_tokens")),
        bad(chat, with(json!({"max_tokens": max_context_len + 1})), 400, Some("max_tokens")),
        bad(chat, with(json!({"n": 0})), 400, Some("n")),
        bad(chat, with(json!({"logprobs": 2})), 400, Some("logprobs")),
        bad(chat, with(json!({"top_logprobs": 2})), 400, Some("top_logprobs")),
        bad(chat, with(json!({"prompt_logprobs": 1})), 400, Some("prompt_logprobs")),
        bad(chat, with(json!({"stop": 3})), 400, Some("stop")),
        bad(chat, with(json!({"stop": [""]})), 400, Some("stop.0")),
        bad(chat, with(json!({"seed": "x"})), 400, Some("seed")),
        bad(chat, with(json!({"stream": "yes"})), 400, Some("stream")),
        bad(chat, with(json!({"stream_options": {"include_usage": true}})), 400, Some("stream_options")),
        bad(chat, with(json!({"stream": true, "stream_options": {"bogus": true}})), 400, Some("stream_options.bogus")),
        bad(chat, with(json!({"frequency_penalty": 2.5})), 400, Some("frequency_penalty")),
        bad(
            chat,
            with(json!({"tools": [{"type": "function", "function": {"name": "f g"}}]})),
            400,
            Some("tools.0.function.name"),
        ),
        bad(chat, with(json!({"tool_choice": "required"})), 400, Some("tool_choice")),
        bad(chat, with(json!({"response_format": {"type": "xml"}})), 400, Some("response_format.type")),
        bad(
            chat,
            with(json!({"response_format": {"type": "json_schema", "json_schema": {"schema": {"$ref": "#/nowhere"}}}})),
            400,
            Some("response_format"),
        ),
        bad(chat, with(json!({"frobnicate": 1})), 400, Some("frobnicate")),
        bad(chat, with(json!({"chat_template_kwargs": {"messages": []}})), 400, Some("chat_template_kwargs.messages")),
        bad(
            chat,
            with(json!({"add_generation_prompt": true, "continue_final_message": true})),
            400,
            Some("continue_final_message"),
        ),
        bad(chat, with(json!({"model": "no-such-model"})), 404, Some("model")),
        bad(
            chat,
            json!({"model": model, "messages": [{"role": "user", "content": long_prompt}]}),
            400,
            Some("messages"),
        ),
        bad(cmpl, json!({"model": model}), 400, Some("prompt")),
        bad(cmpl, json!({"model": model, "prompt": 7}), 400, Some("prompt")),
        bad(cmpl, json!({"model": model, "prompt": ["a", {"b": 1}]}), 400, Some("prompt.1")),
        bad(cmpl, json!({"model": model, "prompt": [1, -2]}), 400, Some("prompt.1")),
        bad(cmpl, json!({"model": model, "prompt": [1, 99999999]}), 400, Some("prompt")),
        bad(cmpl, json!({"model": model, "prompt": "x", "echo": "yes"}), 400, Some("echo")),
        bad(cmpl, json!({"model": model, "prompt": "x", "logprobs": 50}), 400, Some("logprobs")),
        bad(cmpl, json!({"model": model, "prompt": "x", "best_of": 3}), 400, Some("best_of")),
        bad(cmpl, json!({"model": model, "prompt": "x", "suffix": "y"}), 400, Some("suffix")),
        bad(
            cmpl,
            json!({"model": model, "prompt": "x", "max_completion_tokens": 4}),
            400,
            Some("max_completion_tokens"),
        ),
        bad(cmpl, json!({"model": model, "prompt": long_prompt}), 400, Some("prompt")),
        bad(cmpl, json!({"model": "gpt-4", "prompt": "x"}), 404, Some("model")),
        bad("/tokenize", json!({}), 400, Some("prompt")),
        bad("/tokenize", json!({"prompt": "a", "messages": msgs}), 400, Some("messages")),
        bad("/detokenize", json!({"tokens": [1, "x"]}), 400, Some("tokens.1")),
        bad("/detokenize", json!({"tokens": [99999999]}), 400, Some("tokens.0")),
        Bad { method: "GET", path: "/v1/nothing", body: None, status: 404, param: None },
        Bad { method: "POST", path: "/v1/embeddings", body: Some("{}".into()), status: 404, param: None },
        Bad { method: "GET", path: chat, body: None, status: 405, param: None },
        Bad { method: "DELETE", path: "/v1/models", body: None, status: 405, param: None },
        Bad { method: "GET", path: "/v1/models/other", body: None, status: 404, param: Some("model") },
    ];
    for case in &cases {
        let r = request(addr, case.method, case.path, case.body.as_deref().map(str::as_bytes))
            .unwrap_or_else(|e| panic!("{} {}: {e}", case.method, case.path));
        let what = format!("{} {} {:?} -> {} {}", case.method, case.path, case.body, r.status, r.text());
        assert_eq!(r.status, case.status, "{what}");
        let v = r.json();
        let e = &v["error"];
        assert!(e["message"].as_str().is_some_and(|m| !m.is_empty()), "{what}");
        assert!(e["type"].as_str().is_some(), "{what}");
        assert!(e.get("code").is_some() && e.get("param").is_some(), "{what}");
        match case.param {
            Some(p) => assert_eq!(e["param"], p, "{what}"),
            None => assert!(e["param"].is_null(), "{what}"),
        }
        // Still serving.
        assert_eq!(get(addr, "/health").status, 200, "after {what}");
    }
    // And still generating.
    let r = post_json(addr, chat, &with(json!({"max_tokens": 2})));
    assert_eq!(r.status, 200, "{}", r.text());
}

#[test]
fn fake_model_bad_requests_get_openai_errors() {
    let tok = tokenizer();
    let server = start_fake(fake_lm(&tok, 256), 128);
    check_bad_requests(server.addr(), MODEL, 256);
    // 4xx are counted.
    let m = get(server.addr(), "/metrics").text();
    assert!(metric(&m, "minisgl_requests_rejected_total") >= 40.0);
    server.shutdown().unwrap();
}

#[test]
fn default_max_tokens_fits_the_kv_pool() {
    // Context 1024, but a pool of 16 pages of 4 tokens: a chat request
    // without max_tokens is shrunk to fit, not refused.
    let tok = tokenizer();
    let mut lm = fake_lm(&tok, 1024);
    lm.banned = tok.eos_token_ids().to_vec();
    let server = start_fake(lm, 16);
    let body = json!({"messages": [{"role": "user", "content": "hi"}], "temperature": 0});
    let r = post_json(server.addr(), "/v1/chat/completions", &body);
    assert_eq!(r.status, 200, "{}", r.text());
    let v = r.json();
    assert_eq!(v["choices"][0]["finish_reason"], "length");
    let total = v["usage"]["total_tokens"].as_u64().unwrap();
    assert_eq!(total, 16 * 4 + 1, "prompt + outputs fill the pool (the last output needs no slot)");
    // An explicit max_tokens beyond the pool is refused.
    let mut body = body;
    body["max_tokens"] = json!(200);
    let r = post_json(server.addr(), "/v1/chat/completions", &body);
    assert_eq!(r.status, 400);
    assert_eq!(r.json()["error"]["code"], "context_length_exceeded");
    server.shutdown().unwrap();
}

#[test]
fn tokenize_detokenize_models_and_health() {
    let tok = tokenizer();
    let server = start_fake(fake_lm(&tok, 300), 64);
    let addr = server.addr();
    let r = post_json(addr, "/tokenize", &json!({"prompt": "hello world"}));
    assert_eq!(r.status, 200, "{}", r.text());
    let v = r.json();
    let ids: Vec<u32> = serde_json::from_value(v["tokens"].clone()).unwrap();
    assert_eq!(ids, tok.encode("hello world", true).unwrap());
    assert_eq!(v["count"], ids.len());
    assert_eq!(v["max_model_len"], 300);
    assert_eq!(v["prompt"], "hello world");
    let r = post_json(addr, "/detokenize", &json!({"tokens": ids}));
    assert_eq!(r.json()["prompt"], "hello world");

    let messages = json!([{"role": "user", "content": "hi"}]);
    let v = post_json(addr, "/tokenize", &json!({"messages": messages, "add_generation_prompt": true})).json();
    assert_eq!(v["prompt"], "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n");
    let ids: Vec<u32> = serde_json::from_value(v["tokens"].clone()).unwrap();
    assert_eq!(ids, chat_prompt_ids(&tok, &messages));
    let v = post_json(addr, "/tokenize", &json!({"messages": messages, "add_generation_prompt": false})).json();
    assert_eq!(v["prompt"], "<|im_start|>user\nhi<|im_end|>\n");
    // continue_final_message ends inside the last message.
    let v = post_json(
        addr,
        "/tokenize",
        &json!({"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "Hel"}],
                "add_generation_prompt": false, "continue_final_message": true}),
    )
    .json();
    assert_eq!(v["prompt"], "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\nHel");

    let v = get(addr, "/v1/models").json();
    assert_eq!(v["object"], "list");
    assert_eq!(v["data"][0]["id"], MODEL);
    assert_eq!(v["data"][0]["max_model_len"], 300);
    assert_eq!(get(addr, &format!("/v1/models/{MODEL}")).json()["id"], MODEL);
    assert_eq!(get(addr, "/health").status, 200);
    let m = get(addr, "/metrics");
    assert!(m.header("content-type").unwrap().starts_with("text/plain"));
    assert_eq!(metric(&m.text(), "minisgl_kv_pages_total"), 64.0);
    server.shutdown().unwrap();
}

#[test]
fn a_failing_model_fails_its_requests_and_keeps_serving() {
    let tok = tokenizer();
    let mut lm = fake_lm(&tok, 256);
    lm.fail_on = Some(7);
    let server = start_fake(lm, 64);
    let addr = server.addr();
    let r = post_json(addr, "/v1/completions", &json!({"prompt": [5, 7, 9], "max_tokens": 4}));
    assert_eq!(r.status, 500, "{}", r.text());
    assert_eq!(r.json()["error"]["type"], "server_error");
    let s =
        SseStream::open(addr, "/v1/completions", &json!({"prompt": [5, 7], "max_tokens": 4, "stream": true})).unwrap();
    let sum = summarize(&s.collect().unwrap());
    assert!(sum.done && sum.errors.len() == 1, "{:?}", sum.errors);
    // Other requests still work, and nothing leaked.
    let r = post_json(addr, "/v1/completions", &json!({"prompt": [5, 6], "max_tokens": 4, "temperature": 0}));
    assert_eq!(r.status, 200, "{}", r.text());
    let m = get(addr, "/metrics").text();
    assert_eq!(metric(&m, "minisgl_requests_total{finish_reason=\"error\"}"), 2.0);
    // The engine thread publishes its load after routing the step's tokens,
    // so the response can come first: wait for it.
    assert!(
        wait_until(Duration::from_secs(5), || metric(&get(addr, "/metrics").text(), "minisgl_kv_pages_used") == 0.0),
        "KV pages still in use"
    );
    server.shutdown().unwrap();
}

#[test]
fn an_engine_panic_stops_the_server_with_an_error() {
    let tok = tokenizer();
    let mut lm = fake_lm(&tok, 256);
    lm.panic_on = Some(7);
    let server = start_fake(lm, 64);
    let addr = server.addr();
    let r = post_json(addr, "/v1/completions", &json!({"prompt": [5, 7], "max_tokens": 4}));
    assert!(r.status >= 500, "{} {}", r.status, r.text());
    // The server notices and stops on its own.
    assert!(wait_until(Duration::from_secs(30), || request(addr, "GET", "/health", None).is_err()));
    assert!(matches!(server.shutdown(), Err(server::ServerError::EnginePanicked)));
}

// ---------------------------------------------------------------------------
// `minisgl serve` child processes over the fixture models (CPU).

use engine::frontend::cli::common::{load_model, EngineArgs, LoadedModel, ModelArgs};
use std::process::Command;

const SERVE_READY: Duration = Duration::from_secs(120);

fn load(name: &str) -> LoadedModel {
    load_model(
        &ModelArgs {
            model: fixture(name),
            device: "cpu".into(),
            dtype: "auto".into(),
            load_format: "auto".into(),
            attn: "paged".into(),
            moe: "fused".into(),
            chat_template: None,
        },
        &EngineArgs {
            page_size: 16,
            num_pages: Some(1024),
            mem_fraction: 0.85,
            max_prefill_length: 8192,
            max_running_requests: 256,
            cache: "radix".into(),
            max_model_len: None,
            cuda_graph_max_bs: 256,
            disable_cuda_graph: false,
            disable_overlap: false,
            decode_reserve: 1.0,
        },
    )
    .unwrap_or_else(|e| panic!("load {name}: {e:#}"))
}

/// What the engine generates offline for a prompt.
#[derive(Clone, Debug)]
struct Expected {
    text: String,
    prompt_tokens: usize,
    completion_tokens: usize,
    finish_reason: String,
}

fn offline_greedy(m: &mut LoadedModel, prompt_ids: Vec<u32>, max_tokens: usize) -> Expected {
    let prompt_tokens = prompt_ids.len();
    let out = m
        .engine
        .generate(vec![GenerateRequest { prompt_ids, params: SamplingParams::greedy(max_tokens) }])
        .expect("offline generation")
        .remove(0);
    Expected {
        text: m.tokenizer.decode(&out.output_ids, true).unwrap(),
        prompt_tokens,
        completion_tokens: out.output_ids.len(),
        finish_reason: out.finish_reason.to_string(),
    }
}

/// The chat prompt ids of `messages` with the model's own template.
fn model_chat_ids(m: &LoadedModel, messages: &Json) -> Vec<u32> {
    let template = ChatTemplate::new(m.chat.chat_template.as_deref().expect("a chat template")).unwrap();
    let text = template
        .render(messages.as_array().unwrap(), &RenderOptions::new(true, m.chat.special_tokens.clone()))
        .unwrap();
    m.tokenizer.encode(&text, false).unwrap()
}

#[test]
fn openai_client_matches_offline_generation() {
    require_openai_package();
    for name in ["qwen3-tiny", "llama-tiny"] {
        let mut m = load(name);
        let mut cases = Vec::new();
        for (messages, max_tokens) in [
            (
                json!([{"role": "system", "content": "You are terse."}, {"role": "user", "content": "Name a prime number."}]),
                24,
            ),
            (json!([{"role": "user", "content": "Write a haiku about the sea."}]), 40),
            (
                json!([{"role": "user", "content": "hi"}, {"role": "assistant", "content": "Hello!"}, {"role": "user", "content": "Count to five."}]),
                7,
            ),
        ] {
            let ids = model_chat_ids(&m, &messages);
            let e = offline_greedy(&mut m, ids, max_tokens);
            cases.push(json!({"kind": "chat", "messages": messages, "max_tokens": max_tokens, "text": e.text,
                "prompt_tokens": e.prompt_tokens, "completion_tokens": e.completion_tokens, "finish_reason": e.finish_reason}));
        }
        for (prompt, max_tokens) in [("def fibonacci(n):\n    ", 20), ("The capital of France is", 12), ("x", 30)] {
            let ids = m.tokenizer.encode(prompt, true).unwrap();
            let e = offline_greedy(&mut m, ids, max_tokens);
            cases.push(json!({"kind": "completion", "prompt": prompt, "max_tokens": max_tokens, "text": e.text,
                "prompt_tokens": e.prompt_tokens, "completion_tokens": e.completion_tokens, "finish_reason": e.finish_reason}));
        }
        drop(m);

        let server = ServeProcess::start(&fixture(name), &["--num-pages", "1024"], SERVE_READY);
        let dir = tempfile::tempdir().unwrap();
        let spec_path = dir.path().join("cases.json");
        let spec = json!({"base_url": format!("http://{}/v1", server.addr), "model": name, "cases": cases});
        std::fs::write(&spec_path, serde_json::to_string_pretty(&spec).unwrap()).unwrap();
        let out = python()
            .arg(repo_root().join("tests/clients/openai_client.py"))
            .arg(&spec_path)
            .output()
            .expect("run the openai client");
        assert!(
            out.status.success(),
            "{name}: the openai client failed ({}):\n{}\n{}\nserver stderr:\n{}",
            out.status,
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr),
            server.stderr_text()
        );
        server.assert_no_panic();
    }
}

#[test]
fn serve_bad_requests_get_openai_errors() {
    let server = ServeProcess::start(&fixture(MODEL), &["--num-pages", "256"], SERVE_READY);
    check_bad_requests(server.addr, MODEL, 1024);
    server.assert_no_panic();
}

#[test]
fn concurrent_streams_with_disconnects_free_every_page() {
    const CLIENTS: usize = 64;
    const MAX_TOKENS: usize = 32;
    let texts = [
        "def fibonacci(n):\n    ",
        "import os\nimport sys\n",
        "x",
        "for i in range(10):",
        "The capital of France is",
        "print('hello world')",
        "a = [1, 2, 3]",
        "class Reader:\n    def __init__(self, path):\n",
    ];
    let mut m = load(MODEL);
    let chats: Vec<Json> = texts.iter().map(|t| json!([{"role": "user", "content": t}])).collect();
    let expect_chat: Vec<Expected> = chats
        .iter()
        .map(|msgs| {
            let ids = model_chat_ids(&m, msgs);
            offline_greedy(&mut m, ids, MAX_TOKENS)
        })
        .collect();
    let expect_cmpl: Vec<Expected> = texts
        .iter()
        .map(|t| {
            let ids = m.tokenizer.encode(t, true).unwrap();
            offline_greedy(&mut m, ids, MAX_TOKENS)
        })
        .collect();
    drop(m);

    let server = ServeProcess::start(&fixture(MODEL), &["--num-pages", "2048"], SERVE_READY);
    let addr = server.addr;
    let results: Vec<Result<(), String>> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..CLIENTS)
            .map(|i| {
                let (chats, texts, expect_chat, expect_cmpl) = (&chats, &texts, &expect_chat, &expect_cmpl);
                s.spawn(move || -> Result<(), String> {
                    let k = i % texts.len();
                    let chat = i < CLIENTS / 2;
                    // One client in eight goes away after a few chunks of a long
                    // generation (ignore_eos keeps it running until then).
                    let leaves = k == 3;
                    let max_tokens = if leaves { 900 } else { MAX_TOKENS };
                    let (path, mut body) = if chat {
                        ("/v1/chat/completions", json!({"model": MODEL, "messages": chats[k]}))
                    } else {
                        ("/v1/completions", json!({"model": MODEL, "prompt": texts[k]}))
                    };
                    body["max_tokens"] = json!(max_tokens);
                    body["temperature"] = json!(0);
                    body["stream"] = json!(true);
                    body["stream_options"] = json!({"include_usage": true});
                    if leaves {
                        body["ignore_eos"] = json!(true);
                    }
                    let mut stream = SseStream::open(addr, path, &body).map_err(|e| format!("client {i}: {e}"))?;
                    if stream.status != 200 {
                        return Err(format!("client {i}: status {}", stream.status));
                    }
                    if leaves {
                        for _ in 0..4 {
                            stream.next_data().map_err(|e| format!("client {i}: {e}"))?;
                        }
                        stream.disconnect();
                        return Ok(());
                    }
                    let sum = summarize(&stream.collect().map_err(|e| format!("client {i}: {e}"))?);
                    let want = if chat { &expect_chat[k] } else { &expect_cmpl[k] };
                    let usage = sum.usage.clone().unwrap_or_default();
                    if !sum.done || !sum.errors.is_empty() {
                        return Err(format!("client {i}: stream did not end cleanly: {:?}", sum.errors));
                    }
                    if sum.text != want.text
                        || sum.finish_reason.as_deref() != Some(want.finish_reason.as_str())
                        || usage["completion_tokens"] != want.completion_tokens
                        || usage["prompt_tokens"] != want.prompt_tokens
                    {
                        return Err(format!(
                            "client {i}: got {:?} ({:?}, {usage}), want {:?} ({}, {} tokens)",
                            sum.text, sum.finish_reason, want.text, want.finish_reason, want.completion_tokens
                        ));
                    }
                    Ok(())
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap_or_else(|_| Err("client panicked".into()))).collect()
    });
    let errors: Vec<&String> = results.iter().filter_map(|r| r.as_ref().err()).collect();
    assert!(
        errors.is_empty(),
        "{} clients failed:\n{errors:#?}\nserver stderr:\n{}",
        errors.len(),
        server.stderr_text()
    );

    // The 8 clients that left are aborted, nothing runs, no page is held.
    let metrics = || get(addr, "/metrics").text();
    let settled = wait_until(Duration::from_secs(60), || {
        let m = metrics();
        metric(&m, "minisgl_num_requests_running") == 0.0
            && metric(&m, "minisgl_num_requests_waiting") == 0.0
            && metric(&m, "minisgl_kv_pages_used") == 0.0
            && metric(&m, "minisgl_requests_total{finish_reason=\"abort\"}") == 8.0
    });
    let m = metrics();
    assert!(settled, "the server did not settle:\n{m}");
    assert_eq!(metric(&m, "minisgl_requests_total{finish_reason=\"error\"}"), 0.0);
    let done = metric(&m, "minisgl_requests_total{finish_reason=\"stop\"}")
        + metric(&m, "minisgl_requests_total{finish_reason=\"length\"}");
    assert_eq!(done, (CLIENTS - 8) as f64);
    let total = metric(&m, "minisgl_kv_pages_total");
    assert_eq!(
        metric(&m, "minisgl_kv_pages_free") + metric(&m, "minisgl_kv_pages_evictable"),
        total,
        "every page is free or an unused prefix-cache page"
    );
    // Dropping the prefix cache gives the whole pool back.
    let r = request(addr, "POST", "/flush_cache", None).unwrap();
    assert_eq!(r.status, 200, "{}", r.text());
    assert!(wait_until(Duration::from_secs(10), || metric(&metrics(), "minisgl_kv_pages_free") == total));
    assert!(metric(&m, "minisgl_time_to_first_token_seconds_count") >= CLIENTS as f64 - 8.0);
    assert!(metric(&m, "minisgl_inter_token_latency_seconds_count") > 0.0);
    server.assert_no_panic();
}

#[test]
fn a_non_streaming_client_that_leaves_is_aborted() {
    let server = ServeProcess::start(&fixture(MODEL), &["--num-pages", "256"], SERVE_READY);
    let addr = server.addr;
    let body = json!({"prompt": "x", "max_tokens": 1000, "temperature": 0, "ignore_eos": true}).to_string();
    let mut stream = std::net::TcpStream::connect(addr).unwrap();
    use std::io::Write as _;
    write!(
        stream,
        "POST /v1/completions HTTP/1.1\r\nHost: {addr}\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    )
    .unwrap();
    stream.flush().unwrap();
    // Wait until it runs, then leave.
    assert!(wait_until(Duration::from_secs(30), || {
        metric(&get(addr, "/metrics").text(), "minisgl_num_requests_running") == 1.0
    }));
    stream.shutdown(std::net::Shutdown::Both).unwrap();
    drop(stream);
    let aborted = wait_until(Duration::from_secs(20), || {
        let m = get(addr, "/metrics").text();
        metric(&m, "minisgl_requests_total{finish_reason=\"abort\"}") == 1.0
            && metric(&m, "minisgl_kv_pages_used") == 0.0
    });
    assert!(aborted, "not aborted:\n{}", get(addr, "/metrics").text());
    let m = get(addr, "/metrics").text();
    let generated = metric(&m, "minisgl_generation_tokens_total");
    assert!(generated < 1000.0);
    // Every step is timed and sized (issue 13): at least one per generated token,
    // one row each here.
    let steps = metric(&m, "minisgl_step_time_seconds_count");
    assert!(steps >= generated && steps > 0.0, "{steps} steps for {generated} tokens");
    assert_eq!(metric(&m, "minisgl_step_batch_size_count"), steps);
    assert_eq!(metric(&m, "minisgl_step_batch_size_bucket{le=\"1\"}"), steps, "one request: one row per step");
    server.assert_no_panic();
}

#[test]
fn sigterm_finishes_streams_in_flight_then_exits_zero() {
    let mut server = ServeProcess::start(&fixture(MODEL), &["--num-pages", "256"], SERVE_READY);
    let addr = server.addr;
    let body = json!({"prompt": "x", "max_tokens": 600, "temperature": 0, "ignore_eos": true, "stream": true});
    let mut stream = SseStream::open(addr, "/v1/completions", &body).unwrap();
    let mut payloads = Vec::new();
    for _ in 0..3 {
        payloads.push(stream.next_data().unwrap().expect("a chunk"));
    }
    Command::new("kill").args(["-TERM", &server.child.id().to_string()]).status().expect("kill -TERM");
    // New connections are refused while the stream drains.
    let refused = wait_until(Duration::from_secs(5), || request(addr, "GET", "/health", None).is_err());
    payloads.extend(stream.collect().unwrap());
    let sum = summarize(&payloads);
    assert!(refused, "still accepting connections after SIGTERM");
    assert!(sum.done && sum.errors.is_empty(), "{:?}", sum.errors);
    assert_eq!(sum.finish_reason.as_deref(), Some("length"));
    let status = server.wait(Duration::from_secs(60));
    assert!(status.success(), "exit status {status}:\n{}", server.stderr_text());
    server.assert_no_panic();
}

#[test]
fn shutdown_timeout_aborts_streams_cleanly() {
    let mut server =
        ServeProcess::start(&fixture(MODEL), &["--num-pages", "256", "--shutdown-timeout", "0"], SERVE_READY);
    let body = json!({"prompt": "x", "max_tokens": 1000, "temperature": 0, "ignore_eos": true, "stream": true});
    let mut stream = SseStream::open(server.addr, "/v1/completions", &body).unwrap();
    for _ in 0..3 {
        stream.next_data().unwrap().expect("a chunk");
    }
    let status = server.terminate(Duration::from_secs(60));
    let sum = summarize(&stream.collect().unwrap());
    assert!(sum.done, "the stream ends with [DONE]");
    assert_eq!(sum.errors.len(), 1, "one error event");
    assert_eq!(sum.errors[0]["error"]["code"], "server_shutting_down");
    assert!(status.success(), "exit status {status}:\n{}", server.stderr_text());
    server.assert_no_panic();
}

#[test]
fn a_prompt_too_long_names_the_prompt_and_an_unknown_role_is_refused() {
    let tok = tokenizer();
    let server = start_fake(fake_lm(&tok, 64), 64);
    let addr = server.addr();
    let long = "hello ".repeat(100);
    // The prompt alone is past the context: the prompt is what to shorten,
    // whatever max_tokens says.
    for body in [
        json!({"messages": [{"role": "user", "content": long}], "max_tokens": 4}),
        json!({"messages": [{"role": "user", "content": long}]}),
    ] {
        let r = post_json(addr, "/v1/chat/completions", &body);
        assert_eq!(r.status, 400, "{}", r.text());
        assert_eq!(r.json()["error"]["code"], "context_length_exceeded");
        assert_eq!(r.json()["error"]["param"], "messages", "{}", r.text());
    }
    let r = post_json(addr, "/v1/completions", &json!({"prompt": long, "max_tokens": 4}));
    assert_eq!(r.json()["error"]["param"], "prompt", "{}", r.text());
    // A prompt that fits, with a max_tokens that does not: max_tokens it is.
    let r = post_json(addr, "/v1/completions", &json!({"prompt": "hello", "max_tokens": 200}));
    assert_eq!(r.json()["error"]["param"], "max_tokens", "{}", r.text());
    // An unknown role would be rendered silently by many templates.
    let r = post_json(addr, "/v1/chat/completions", &json!({"messages": [{"role": "wizard", "content": "hi"}]}));
    assert_eq!(r.status, 400, "{}", r.text());
    assert_eq!(r.json()["error"]["param"], "messages.0.role");
    assert!(r.json()["error"]["message"].as_str().unwrap().contains("wizard"));
    // GET / is the chat page, not a 404.
    let page = get(addr, "/");
    assert_eq!(page.status, 200);
    assert!(page.text().contains("<title>minisgl chat</title>"));
    server.shutdown().unwrap();
}
