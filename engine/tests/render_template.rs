//! `minisgl render-template`: the fixtures' templates against the renderings
//! transformers produced (`reference.json`), variables, and templates that
//! raise or do not compile.

use std::path::{Path, PathBuf};
use std::process::Command;

use serde_json::{json, Value as Json};

fn fixture(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/fixtures").join(name)
}

struct Output {
    code: Option<i32>,
    stdout: String,
    stderr: String,
}

fn render(args: &[&std::ffi::OsStr]) -> Output {
    let out = Command::new(env!("CARGO_BIN_EXE_minisgl"))
        .arg("render-template")
        .args(args)
        .output()
        .expect("run minisgl render-template");
    Output {
        code: out.status.code(),
        stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
    }
}

fn os(s: &str) -> &std::ffi::OsStr {
    std::ffi::OsStr::new(s)
}

fn reference_chat(model: &str) -> (Json, String) {
    let text = std::fs::read_to_string(fixture(model).join("reference.json")).unwrap();
    let reference: Json = serde_json::from_str(&text).unwrap();
    (reference["chat"]["messages"].clone(), reference["chat"]["rendered"].as_str().unwrap().to_owned())
}

#[test]
fn fixture_templates_match_transformers() {
    let dir = tempfile::tempdir().unwrap();
    for model in ["qwen3-tiny", "qwen2-tiny", "llama-tiny", "mistral-tiny", "qwen3-moe-tiny"] {
        let (messages, want) = reference_chat(model);
        let list = dir.path().join(format!("{model}.json"));
        std::fs::write(&list, messages.to_string()).unwrap();
        let object = dir.path().join(format!("{model}-object.json"));
        std::fs::write(&object, json!({"messages": messages}).to_string()).unwrap();

        // The model folder, and each file the template can come from.
        let mut sources = vec![fixture(model)];
        for file in ["chat_template.jinja", "tokenizer_config.json"] {
            let path = fixture(model).join(file);
            let has_template = std::fs::read_to_string(&path)
                .is_ok_and(|t| file.ends_with(".jinja") || t.contains("\"chat_template\""));
            if has_template {
                sources.push(path);
            }
        }
        for source in &sources {
            for messages in [&list, &object] {
                let out = render(&[
                    os("--template"),
                    source.as_os_str(),
                    os("--messages"),
                    messages.as_os_str(),
                    os("--add-generation-prompt"),
                ]);
                assert_eq!(out.code, Some(0), "{}: {}", source.display(), out.stderr);
                assert_eq!(out.stdout, want, "{}", source.display());
            }
        }
        // Without the generation prompt, the assistant header is absent.
        let out = render(&[os("--template"), fixture(model).as_os_str(), os("--messages"), list.as_os_str()]);
        assert_eq!(out.code, Some(0), "{}", out.stderr);
        assert!(want.starts_with(&out.stdout) && out.stdout.len() < want.len(), "{model}: {:?}", out.stdout);
    }
}

#[test]
fn variables_are_json_or_strings() {
    let dir = tempfile::tempdir().unwrap();
    let template = dir.path().join("t.jinja");
    std::fs::write(
        &template,
        "{{ bos_token }}{{ greeting }}{% for m in messages %}[{{ m.role }}:{{ m.content }}]{% endfor %}{{ n + 1 }}{% if flag %}!{% endif %}{% if add_generation_prompt %}>{% endif %}",
    )
    .unwrap();
    let messages = dir.path().join("m.json");
    std::fs::write(&messages, r#"{"messages": [{"role": "user", "content": "hi"}], "greeting": "hey "}"#).unwrap();
    let out = render(&[
        os("--template"),
        template.as_os_str(),
        os("--messages"),
        messages.as_os_str(),
        os("--var"),
        os("bos_token=<s>"),
        os("--var"),
        os("n=41"),
        os("--var"),
        os("flag=true"),
        os("--add-generation-prompt"),
    ]);
    assert_eq!(out.code, Some(0), "{}", out.stderr);
    assert_eq!(out.stdout, "<s>hey [user:hi]42!>");
    // --var wins over the messages file; a value that is not JSON is a string.
    let out = render(&[
        os("--template"),
        template.as_os_str(),
        os("--messages"),
        messages.as_os_str(),
        os("--var"),
        os("greeting=yo {"),
        os("--var"),
        os("n=1"),
    ]);
    assert_eq!(out.stdout, "yo {[user:hi]2", "{}", out.stderr);
    let out = render(&[
        os("--template"),
        template.as_os_str(),
        os("--messages"),
        messages.as_os_str(),
        os("--var"),
        os("novalue"),
    ]);
    assert_eq!(out.code, Some(1));
    assert!(out.stderr.contains("KEY=VALUE"), "{}", out.stderr);
}

#[test]
fn template_errors_exit_with_status_1() {
    let dir = tempfile::tempdir().unwrap();
    let messages = dir.path().join("m.json");
    std::fs::write(&messages, r#"[{"role": "system", "content": "s"}, {"role": "user", "content": "u"}]"#).unwrap();
    let raises = dir.path().join("raises.jinja");
    std::fs::write(
        &raises,
        "{% for m in messages %}{% if m.role == 'system' %}{{ raise_exception('System role not supported') }}{% endif %}{{ m.content }}{% endfor %}",
    )
    .unwrap();
    let out = render(&[os("--template"), raises.as_os_str(), os("--messages"), messages.as_os_str()]);
    assert_eq!(out.code, Some(1));
    assert_eq!(out.stdout, "");
    assert!(out.stderr.contains("System role not supported"), "{}", out.stderr);

    let broken = dir.path().join("broken.jinja");
    std::fs::write(&broken, "{% for m in messages %}{{ m.content }}").unwrap();
    let out = render(&[os("--template"), broken.as_os_str(), os("--messages"), messages.as_os_str()]);
    assert_eq!(out.code, Some(1));
    assert!(out.stderr.contains("does not compile"), "{}", out.stderr);

    // Missing and malformed files name the file.
    let missing = dir.path().join("missing.json");
    let out = render(&[os("--template"), raises.as_os_str(), os("--messages"), missing.as_os_str()]);
    assert_eq!(out.code, Some(1));
    assert!(out.stderr.contains("missing.json"), "{}", out.stderr);
    let bad = dir.path().join("bad.json");
    std::fs::write(&bad, "{\"messages\": [").unwrap();
    let out = render(&[os("--template"), raises.as_os_str(), os("--messages"), bad.as_os_str()]);
    assert_eq!(out.code, Some(1));
    assert!(out.stderr.contains("bad.json"), "{}", out.stderr);
    // A folder without a template.
    let empty = tempfile::tempdir().unwrap();
    let out = render(&[os("--template"), empty.path().as_os_str(), os("--messages"), messages.as_os_str()]);
    assert_eq!(out.code, Some(1));
    assert!(out.stderr.contains("no chat template"), "{}", out.stderr);
}
