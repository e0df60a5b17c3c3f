//! Chat template conformance: every case of `tests/chat_templates/cases.json`
//! (49 real templates x 4 conversations x add_generation_prompt true/false,
//! rendered by transformers' `render_jinja_template`) must render to exactly
//! the same text, or fail where transformers failed; and the fixture model
//! folders' templates must render their `reference.json` chat exactly.

use std::path::{Path, PathBuf};

use engine::text::chat_template::{ChatTemplate, Clock, ModelChatConfig, RenderOptions, SpecialTokens};
use serde_json::Value;

fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

fn read_json(path: &Path) -> Value {
    let text = std::fs::read_to_string(path).unwrap_or_else(|e| panic!("read {}: {e}", path.display()));
    serde_json::from_str(&text).unwrap_or_else(|e| panic!("parse {}: {e}", path.display()))
}

/// The clock the generator pinned `strftime_now` to.
fn fixed_clock() -> Clock {
    let t = chrono::NaiveDate::from_ymd_opt(2026, 1, 15).and_then(|d| d.and_hms_opt(12, 0, 0)).unwrap();
    Clock::Fixed(t)
}

/// A readable account of where two renderings first differ.
fn diff(expected: &str, got: &str) -> String {
    let at = expected.chars().zip(got.chars()).take_while(|(a, b)| a == b).count();
    let byte = |s: &str| s.char_indices().nth(at).map_or(s.len(), |(i, _)| i);
    let (e, g) = (byte(expected), byte(got));
    let ctx_start = |s: &str, i: usize| s[..i].char_indices().rev().nth(60).map_or(0, |(j, _)| j);
    let tail = |s: &str, i: usize| s[i..].chars().take(80).collect::<String>();
    format!(
        "first difference at char {at}\n  common context: {:?}\n  expected next:  {:?}\n  got next:       {:?}\n--- expected ---\n{expected}\n--- got ---\n{got}\n----------------",
        &expected[ctx_start(expected, e)..e],
        tail(expected, e),
        tail(got, g),
    )
}

#[test]
fn transformers_conformance() {
    let cases = read_json(&repo_root().join("tests/chat_templates/cases.json"));
    let templates = cases["templates"].as_array().expect("templates array");
    let mut failures = Vec::new();
    let (mut total, mut passed) = (0usize, 0usize);
    for entry in templates {
        let name = entry["name"].as_str().expect("name");
        let source = entry["template"].as_str().expect("template");
        let special = SpecialTokens::from_tokenizer_config(&entry["special_tokens"]);
        let template = ChatTemplate::with_clock(source, fixed_clock());
        for case in entry["cases"].as_array().expect("cases") {
            total += 1;
            let label = format!(
                "{name} / {} / add_generation_prompt={}",
                case["conversation"].as_str().unwrap_or("?"),
                case["add_generation_prompt"]
            );
            let template = match &template {
                Ok(t) => t,
                Err(e) => {
                    failures.push(format!("{label}: template does not compile: {e}"));
                    continue;
                }
            };
            let mut opts = RenderOptions::new(case["add_generation_prompt"].as_bool().expect("agp"), special.clone());
            opts.extra.insert("date_string".into(), Value::from("26 Jul 2024"));
            let messages = case["messages"].as_array().expect("messages");
            let result = template.render(messages, &opts);
            match (case.get("rendered").and_then(Value::as_str), result) {
                (Some(expected), Ok(got)) if got == expected => passed += 1,
                (Some(expected), Ok(got)) => failures.push(format!("{label}: mismatch, {}", diff(expected, &got))),
                (Some(_), Err(e)) => failures.push(format!("{label}: expected text, got error: {e}")),
                (None, Err(_)) => passed += 1,
                (None, Ok(got)) => failures.push(format!(
                    "{label}: transformers raised {:?} but we rendered {got:?}",
                    case["error"].as_str().unwrap_or("?")
                )),
            }
        }
    }
    println!("chat template conformance: {passed}/{total} cases pass");
    assert!(failures.is_empty(), "{} of {total} cases fail:\n\n{}", failures.len(), failures.join("\n\n"));
    assert_eq!(total, 49 * 8, "cases.json should hold 49 templates x 8 cases");
}

#[test]
fn fixture_folders_render_their_reference_chat() {
    for name in ["llama-tiny", "qwen2-tiny", "qwen3-tiny", "qwen3-moe-tiny", "mistral-tiny"] {
        let dir = repo_root().join("tests/fixtures").join(name);
        let config = ModelChatConfig::load(&dir).unwrap_or_else(|e| panic!("{name}: {e}"));
        let source = config.chat_template.unwrap_or_else(|| panic!("{name}: no chat template"));
        let template = ChatTemplate::new(&source).unwrap_or_else(|e| panic!("{name}: {e}"));
        let reference = read_json(&dir.join("reference.json"));
        let messages = reference["chat"]["messages"].as_array().expect("chat.messages");
        let expected = reference["chat"]["rendered"].as_str().expect("chat.rendered");
        let got = template
            .render(messages, &RenderOptions::new(true, config.special_tokens))
            .unwrap_or_else(|e| panic!("{name}: {e}"));
        assert!(got == expected, "{name}: {}", diff(expected, &got));
    }
}
