//! Request bodies from arbitrary bytes, through the server's parsers and then
//! the engine's own validation (`Engine::add_request`), as a request travels:
//! every body is either refused with an `ApiError` / `EngineError` or queued,
//! and nothing panics. The first byte picks the endpoint.
#![no_main]

use std::sync::Mutex;

use engine::core::engine::{Engine, EngineConfig, GenerateRequest, ModelRunner, RunnerError};
use engine::core::kvcache::CacheKind;
use engine::core::req::PreparedBatch;
use engine::core::sampling::Logits;
use engine::core::scheduler::{SchedulePolicy, SchedulerConfig};
use engine::frontend::server::request::{self, Prompt, SamplingDefaults};
use libfuzzer_sys::fuzz_target;

/// A runner that is never stepped: validation needs only its sizes.
struct Sizes;

impl ModelRunner for Sizes {
    fn forward(&mut self, _batch: &PreparedBatch) -> Result<Logits, RunnerError> {
        Err("not stepped".into())
    }
    fn vocab_size(&self) -> usize {
        1000
    }
    fn max_context_len(&self) -> usize {
        512
    }
}

fn engine() -> Engine<Sizes> {
    let scheduler = SchedulerConfig {
        page_size: 4,
        num_pages: 64,
        max_prefill_length: 64,
        max_running_requests: 8,
        cache: CacheKind::Radix,
        policy: SchedulePolicy::Mixed,
        decode_reserve: 0.25,
        eos_token_ids: vec![0],
    };
    Engine::new(Sizes, EngineConfig { scheduler }).expect("a valid engine config")
}

static ENGINE: Mutex<Option<Engine<Sizes>>> = Mutex::new(None);

fuzz_target!(|data: &[u8]| {
    let Some((&which, body)) = data.split_first() else { return };
    let (sampling, prompts) = match which % 4 {
        0 => match request::parse_chat(body) {
            Ok(r) => (r.sampling, vec![vec![1, 2, 3]]),
            Err(_) => return,
        },
        1 => match request::parse_completion(body) {
            Ok(r) => {
                let ids = r
                    .prompts
                    .into_iter()
                    .map(|p| match p {
                        Prompt::Ids(ids) => ids,
                        Prompt::Text(t) => t.bytes().map(u32::from).collect(),
                    })
                    .collect();
                (r.sampling, ids)
            }
            Err(_) => return,
        },
        2 => {
            let _ = request::parse_tokenize(body);
            return;
        }
        _ => {
            let _ = request::parse_detokenize(body);
            return;
        }
    };
    let mut guard = ENGINE.lock().unwrap_or_else(|e| e.into_inner());
    let engine = guard.get_or_insert_with(engine);
    for prompt_ids in prompts {
        let params = sampling.to_params(&SamplingDefaults::openai(), 16);
        if let Ok(id) = engine.add_request(GenerateRequest { prompt_ids, params }) {
            engine.abort(id);
        }
    }
});
