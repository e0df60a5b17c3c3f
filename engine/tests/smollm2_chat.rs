//! The demo model out of the box: SmolLM2-135M-Instruct from its GGUF file
//! (`minisgl pull smollm2`), served on the CPU, answers "What is the capital of
//! France?" through the official `openai` Python client, naming Paris.
//!
//! Needs `MINISGL_SMOLLM2_GGUF` (scripts/test.sh pulls the file and sets it);
//! without it the test prints a notice and passes.

mod server_support;

use std::time::Duration;

use server_support::*;

#[test]
fn smollm2_names_paris_through_the_openai_client() {
    let Ok(gguf) = std::env::var("MINISGL_SMOLLM2_GGUF") else {
        eprintln!("MINISGL_SMOLLM2_GGUF is not set (scripts/test.sh sets it): skipping");
        return;
    };
    require_openai_package();
    let mut server =
        ServeProcess::start(std::path::Path::new(&gguf), &["--num-pages", "256"], Duration::from_secs(120));
    let script = r#"
import sys, openai
c = openai.OpenAI(base_url=sys.argv[1], api_key="none")
model = c.models.list().data[0].id
r = c.chat.completions.create(model=model, temperature=0, max_tokens=48,
    messages=[{"role": "user", "content": "What is the capital of France?"}])
print(r.choices[0].message.content)
print("finish:", r.choices[0].finish_reason, "completion_tokens:", r.usage.completion_tokens)
"#;
    let out = python().args(["-c", script, &format!("http://{}/v1", server.addr)]).output().unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(out.status.success(), "client failed: {}\n{}", String::from_utf8_lossy(&out.stderr), server.stderr_text());
    eprintln!("SmolLM2 answered: {stdout}");
    assert!(stdout.contains("Paris"), "the answer does not name Paris: {stdout}");
    server.terminate(Duration::from_secs(30));
    server.assert_no_panic();
}
