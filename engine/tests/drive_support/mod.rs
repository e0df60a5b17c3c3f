//! Driving an engine to the end of a batch of requests and collecting what each
//! request streamed (tokens and log probabilities), shared by the tests that
//! compare sampling paths (device_path, gpu_extras).

use std::collections::HashMap;
use std::time::Instant;

use engine::core::engine::{Engine, GenerateRequest, ModelRunner};
use engine::core::req::ReqId;
use engine::core::sampling::logprobs::TokenLogprobs;

/// Every request's streamed tokens and log probabilities, in request order.
pub type Outputs = Vec<(Vec<u32>, Vec<TokenLogprobs>)>;

/// Runs `requests` to the end on `engine` (overlap on or off, the prefix cache
/// flushed first) and checks that the pool is whole again: the outputs and the
/// wall time in seconds.
pub fn run<R: ModelRunner>(engine: &mut Engine<R>, requests: &[GenerateRequest], overlap: bool) -> (Outputs, f64) {
    engine.set_overlap(overlap).unwrap();
    engine.flush_cache();
    let started = Instant::now();
    let ids: Vec<ReqId> = requests.iter().map(|r| engine.add_request(r.clone()).unwrap()).collect();
    let mut got: HashMap<ReqId, (Vec<u32>, Vec<TokenLogprobs>)> = HashMap::new();
    while engine.has_work() {
        for event in engine.step().unwrap() {
            let entry = got.entry(event.id).or_default();
            entry.0.push(event.token);
            entry.1.extend(event.logprobs);
        }
    }
    let elapsed = started.elapsed().as_secs_f64();
    engine.check_integrity();
    assert_eq!(engine.stats().used_pages, 0);
    (ids.iter().map(|id| got.remove(id).unwrap_or_default()).collect(), elapsed)
}

/// Whether two requests' tokens differ where both have tokens (requests of
/// different `max_tokens` differ in length whatever they sampled).
pub fn tokens_differ(a: &[u32], b: &[u32]) -> bool {
    a.iter().zip(b).any(|(x, y)| x != y)
}
