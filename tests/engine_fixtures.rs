//! The engine over real models (the tiny fixtures, CPU reference path): batching,
//! prefix caching, chunked prefill, queueing and sampling must not change what a
//! request generates, and every KV page comes back.

use std::path::{Path, PathBuf};

use engine::core::engine::GenerateRequest;
use engine::core::req::SamplingParams;
use engine::frontend::cli::common::{load_model, EngineArgs, LoadedModel, ModelArgs};

fn fixture(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures").join(name)
}

fn engine_args(num_pages: usize, page_size: usize, max_prefill: usize, cache: &str) -> EngineArgs {
    EngineArgs {
        page_size,
        num_pages: Some(num_pages),
        mem_fraction: 0.85,
        max_prefill_length: max_prefill,
        max_running_requests: 64,
        cache: cache.into(),
        max_model_len: None,
        cuda_graph_max_bs: 256,
        disable_cuda_graph: false,
        disable_overlap: false,
        decode_reserve: 1.0,
    }
}

fn load(name: &str, engine: EngineArgs) -> LoadedModel {
    let model = ModelArgs {
        model: fixture(name),
        device: "cpu".into(),
        dtype: "auto".into(),
        load_format: "auto".into(),
        attn: "paged".into(),
        moe: "fused".into(),
        chat_template: None,
    };
    load_model(&model, &engine).unwrap()
}

/// 16 prompts of different lengths, some sharing prefixes.
fn prompts(m: &LoadedModel) -> Vec<Vec<u32>> {
    let texts = [
        "def fibonacci(n):\n    ",
        "import os\nimport sys\n",
        "x",
        "class Reader:\n    def __init__(self, path):\n        self.path = path\n",
        "for i in range(10):",
        "return None",
        "def fibonacci(n):\n    if n < 2:",
        "import os\nimport sys\nimport json\n",
        "# comment",
        "while True:\n    pass",
        "print('hello world')",
        "a = [1, 2, 3]",
        "def f(x): return x * 2",
        "try:\n    open(path)\nexcept OSError:",
        "y = x + 1",
        "from typing import List",
    ];
    texts.iter().map(|t| m.tokenizer.encode(t, false).unwrap()).collect()
}

fn greedy(prompt: &[u32], n: usize) -> GenerateRequest {
    let mut params = SamplingParams::greedy(n);
    params.ignore_eos = true;
    GenerateRequest { prompt_ids: prompt.to_vec(), params }
}

fn assert_all_pages_free(m: &mut LoadedModel) {
    m.engine.check_integrity();
    m.engine.flush_cache();
    let stats = m.engine.stats();
    assert_eq!(stats.free_pages, stats.num_pages, "pages leaked: {stats:?}");
}

#[test]
fn batched_chunked_and_cached_generation_equal_one_at_a_time() {
    for name in ["llama-tiny", "qwen3-tiny"] {
        // Reference: each prompt alone, naive cache, no chunking.
        let mut alone = load(name, engine_args(512, 4, 8192, "naive"));
        let ps = prompts(&alone);
        let expected: Vec<Vec<u32>> =
            ps.iter().map(|p| alone.engine.generate(vec![greedy(p, 12)]).unwrap()[0].output_ids.clone()).collect();
        assert_all_pages_free(&mut alone);

        // All 16 together, radix cache, prefill chunks of 8 tokens.
        let mut together = load(name, engine_args(512, 4, 8, "radix"));
        let outs = together.engine.generate(ps.iter().map(|p| greedy(p, 12)).collect()).unwrap();
        for (i, (o, e)) in outs.iter().zip(&expected).enumerate() {
            assert_eq!(&o.output_ids, e, "{name}: prompt {i} differs when batched with chunked prefill");
        }
        assert_all_pages_free(&mut together);

        // A pool too small for all of them at once: requests queue, outputs equal.
        let mut small = load(name, engine_args(40, 4, 8192, "naive"));
        let outs = small.engine.generate(ps.iter().map(|p| greedy(p, 12)).collect()).unwrap();
        for (i, (o, e)) in outs.iter().zip(&expected).enumerate() {
            assert_eq!(&o.output_ids, e, "{name}: prompt {i} differs with a small pool");
        }
        assert_all_pages_free(&mut small);
    }
}

#[test]
fn a_shared_prefix_is_served_from_the_radix_cache() {
    let mut m = load("qwen2-tiny", engine_args(256, 4, 8192, "radix"));
    let base =
        m.tokenizer.encode("import os\nimport sys\n\nclass Reader:\n    def __init__(self, path):\n", false).unwrap();
    let mut longer = base.clone();
    longer.extend(m.tokenizer.encode("        self.path = path\n", false).unwrap());
    let first = m.engine.generate(vec![greedy(&base, 8)]).unwrap().remove(0);
    assert_eq!(first.cached_tokens, 0);
    let hits_before = m.engine.stats().cache_hit_tokens;
    let second = m.engine.generate(vec![greedy(&longer, 8)]).unwrap().remove(0);
    assert!(second.cached_tokens >= 4 && m.engine.stats().cache_hit_tokens > hits_before, "no reuse: {second:?}");
    // Same output as without any cache.
    let mut fresh = load("qwen2-tiny", engine_args(256, 4, 8192, "naive"));
    let expected = fresh.engine.generate(vec![greedy(&longer, 8)]).unwrap().remove(0);
    assert_eq!(second.output_ids, expected.output_ids);
    assert_eq!(expected.cached_tokens, 0);
    // The identical prompt again reuses all its full pages.
    let third = m.engine.generate(vec![greedy(&longer, 8)]).unwrap().remove(0);
    assert_eq!(third.output_ids, expected.output_ids);
    assert!(third.cached_tokens >= longer.len() / 4 * 4 - 4, "{third:?}");
    assert_all_pages_free(&mut m);
}

#[test]
fn sampling_is_reproducible_and_top_k_1_is_greedy() {
    let mut m = load("mistral-tiny", engine_args(256, 4, 8192, "radix"));
    let ps = prompts(&m);
    let seeded = |seed: u64, top_k: Option<usize>| {
        let mut p = SamplingParams::random(10, 0.9, seed);
        p.top_k = top_k;
        p.ignore_eos = true;
        p
    };
    let run = |m: &mut LoadedModel, params: &dyn Fn(usize) -> SamplingParams| -> Vec<Vec<u32>> {
        let reqs = ps
            .iter()
            .take(6)
            .enumerate()
            .map(|(i, p)| GenerateRequest { prompt_ids: p.clone(), params: params(i) })
            .collect();
        m.engine.generate(reqs).unwrap().into_iter().map(|o| o.output_ids).collect()
    };
    let a = run(&mut m, &|i| seeded(7 + i as u64, None));
    let b = run(&mut m, &|i| seeded(7 + i as u64, None));
    assert_eq!(a, b, "the same seeds must give the same tokens");
    let c = run(&mut m, &|i| seeded(1000 + i as u64, None));
    assert_ne!(a, c, "different seeds gave identical samples for every prompt");
    let top1 = run(&mut m, &|i| seeded(3 + i as u64, Some(1)));
    let greedy_out = run(&mut m, &|_| {
        let mut p = SamplingParams::greedy(10);
        p.ignore_eos = true;
        p
    });
    assert_eq!(top1, greedy_out, "top_k = 1 must equal greedy");
    assert_all_pages_free(&mut m);
}
