//! Constrained decoding in the engine (issue 17), on the qwen3-tiny fixture: in a
//! batch where some requests carry a JSON-schema grammar, those requests produce
//! JSON that follows the schema and end by themselves, and the others generate
//! exactly what they generate in a batch with no grammar at all (on the CPU; on
//! the GPU, where batch composition may move a logit, they are only checked to
//! run). The same body runs on the CPU (always) and on the GPU with its CUDA
//! graphs (`gpu_*`, only with MINISGL_GPU_TESTS=1), where the masks go through
//! the `token_mask` kernel.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use engine::core::engine::GenerateRequest;
use engine::core::req::{FinishReason, ReqId, SamplingParams};
use engine::frontend::cli::common::{load_model, EngineArgs, LoadedModel, ModelArgs};
use engine::frontend::server::structured::{GrammarCompiler, GrammarSpec};
use serde_json::{json, Value as Json};

fn fixture(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures").join(name)
}

fn load(device: &str) -> LoadedModel {
    let model = ModelArgs {
        model: fixture("qwen3-tiny"),
        device: device.into(),
        dtype: "auto".into(),
        load_format: "auto".into(),
        attn: "paged".into(),
        moe: "fused".into(),
        chat_template: None,
    };
    let engine = EngineArgs {
        page_size: 16,
        num_pages: Some(512),
        mem_fraction: 0.85,
        max_prefill_length: 256,
        max_running_requests: 64,
        cache: "radix".into(),
        max_model_len: None,
        cuda_graph_max_bs: 16,
        disable_cuda_graph: false,
        disable_overlap: false,
        decode_reserve: 1.0,
    };
    load_model(&model, &engine).unwrap()
}

fn schema() -> Json {
    json!({
        "type": "object",
        "properties": {
            "name": {"type": "string", "maxLength": 8},
            "level": {"type": "integer", "minimum": 1, "maximum": 9},
            "kind": {"enum": ["cat", "dog"]},
        },
        "required": ["name", "level", "kind"],
        "additionalProperties": false,
    })
}

/// Runs `requests` (each with its grammar, if any) to completion; the outputs in
/// order.
fn run(m: &mut LoadedModel, requests: Vec<(GenerateRequest, bool)>) -> Vec<(Vec<u32>, FinishReason)> {
    let compiler = GrammarCompiler::new(&m.tokenizer, m.engine.runner().vocab_size());
    let num_grammars = requests.iter().filter(|(_, g)| *g).count();
    let mut grammars =
        compiler.compile(&GrammarSpec::JsonSchema(schema()), "schema", num_grammars.max(1)).unwrap().into_iter();
    let mut slots: HashMap<ReqId, usize> = HashMap::new();
    for (i, (req, constrained)) in requests.into_iter().enumerate() {
        let id = m.engine.add_request(req).unwrap();
        if constrained {
            assert!(m.engine.set_grammar(id, grammars.next().unwrap()));
        }
        slots.insert(id, i);
    }
    let mut out = vec![None; slots.len()];
    let mut steps = 0;
    while out.iter().any(Option::is_none) {
        steps += 1;
        assert!(steps < 10_000, "the engine does not finish");
        for f in m.engine.step().unwrap().into_iter().filter_map(|e| e.finished) {
            out[slots[&f.id]] = Some((f.output_ids, f.reason));
        }
    }
    out.into_iter().map(Option::unwrap).collect()
}

fn request(m: &LoadedModel, text: &str, seed: u64) -> GenerateRequest {
    let mut params = SamplingParams::random(48, 1.0, seed);
    params.penalties.frequency = 1.0;
    GenerateRequest { prompt_ids: m.tokenizer.encode(text, false).unwrap(), params }
}

fn check(device: &str) {
    let mut m = load(device);
    let texts = ["{\"name\":", "hello", "x", "a list of pets", "JSON please", "1 2 3", "{", "the end"];
    let batch: Vec<(GenerateRequest, bool)> =
        texts.iter().enumerate().map(|(i, t)| (request(&m, t, i as u64), i % 4 == 1)).collect();
    let plain: Vec<(GenerateRequest, bool)> = batch.iter().filter(|(_, g)| !g).cloned().collect();
    let mixed = run(&mut m, batch.clone());
    for ((_, constrained), (ids, reason)) in batch.iter().zip(&mixed) {
        if !constrained {
            continue;
        }
        let text = m.tokenizer.decode(ids, true).unwrap();
        assert_eq!(*reason, FinishReason::Stop, "{device}: the grammar did not end the output: {text:?}");
        let v: Json = serde_json::from_str(&text).unwrap_or_else(|e| panic!("{device}: {text:?} is not JSON: {e}"));
        let obj = v.as_object().unwrap();
        assert_eq!(obj.len(), 3, "{device}: {text}");
        assert!(obj["name"].as_str().is_some_and(|s| s.chars().count() <= 8), "{device}: {text}");
        assert!(obj["level"].as_i64().is_some_and(|l| (1..=9).contains(&l)), "{device}: {text}");
        assert!(["cat", "dog"].contains(&obj["kind"].as_str().unwrap_or("")), "{device}: {text}");
    }
    let alone = run(&mut m, plain);
    let unconstrained: Vec<_> = batch.iter().zip(&mixed).filter(|((_, g), _)| !g).map(|(_, o)| o.clone()).collect();
    if device == "cpu" {
        assert_eq!(unconstrained, alone, "requests without a grammar changed beside constrained ones");
    }
    m.engine.check_integrity();
}

#[test]
fn constrained_requests_follow_their_schema_and_the_others_do_not_change() {
    check("cpu");
}

#[test]
fn gpu_constrained_requests_follow_their_schema_through_the_token_mask_kernel() {
    if std::env::var("MINISGL_GPU_TESTS").as_deref() != Ok("1") {
        eprintln!("skipped: set MINISGL_GPU_TESTS=1 on a machine with a GPU");
        return;
    }
    check("cuda:0");
}
