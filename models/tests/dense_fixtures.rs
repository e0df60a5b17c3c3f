//! The dense models (LLaMA, Qwen2, Qwen3, Mistral) on the CPU in f32 against the
//! transformers float64 references of tests/fixtures: prefill logits at every
//! position, teacher-forced decode through the paged cache, free-running greedy
//! generation, chunked prefill, and several sequences in one batch.
//!
//! Acceptance: relative L2 error <= 1e-4 for every block of logits, and the
//! greedy ids exactly.

mod common;

use common::{cases, load, load_public, rel_l2};
use models::generate::{greedy, GreedyOptions};
use models::{CausalLm, ForwardBatch, KvCache, LogitRows, SeqStep};

const TOL: f64 = 1e-4;
/// Pages of 4 tokens, so that prompts and decode steps cross pages.
const PAGE: usize = 4;

fn forward(model: &dyn CausalLm, kv: &KvCache, seqs: &[SeqStep<'_>], rows: LogitRows) -> Vec<f32> {
    let batch = ForwardBatch::new(seqs, PAGE, rows, model.device()).unwrap();
    let logits = model.forward(&batch, kv).unwrap();
    assert_eq!(logits.shape(), [batch.num_logit_rows(), model.vocab_size()]);
    logits.to_f32_vec().unwrap()
}

/// Pages `first..first + n`, in reverse so that logical and physical order differ.
fn pages(first: u32, n: usize) -> Vec<u32> {
    (first..first + n as u32).rev().collect()
}

fn check_prefill_and_decode(name: &str) {
    let model = load(name);
    let v = model.vocab_size();
    for (i, case) in cases(name).iter().enumerate() {
        let (l, n) = (case.input_ids.len(), case.greedy_ids.len());
        let table = pages(3, (l + n).div_ceil(PAGE));
        let kv = model.new_kv_cache(table.len() + 5, PAGE).unwrap();

        // (a) Prefill: logits at every prompt position.
        let seq = SeqStep { new_tokens: &case.input_ids, cached_len: 0, pages: &table };
        let got = forward(&*model, &kv, &[seq], LogitRows::All);
        let err = rel_l2(&got, &case.logits);
        assert!(err <= TOL, "{name} case {i}: prefill logits rel L2 {err:e}");
        // The last prompt position chose the first greedy token.
        let err = rel_l2(&got[(l - 1) * v..], &case.greedy_logits[..v]);
        assert!(err <= TOL, "{name} case {i}: last prefill row vs greedy_logits[0]: {err:e}");

        // (b) Teacher-forced decode: feed the reference ids one step at a time.
        for step in 0..n - 1 {
            let token = [case.greedy_ids[step]];
            let seq = SeqStep { new_tokens: &token, cached_len: l + step, pages: &table };
            let got = forward(&*model, &kv, &[seq], LogitRows::LastOfEachSequence);
            let want = &case.greedy_logits[(step + 1) * v..(step + 2) * v];
            let err = rel_l2(&got, want);
            assert!(err <= TOL, "{name} case {i}: decode step {step} rel L2 {err:e}");
        }
    }
}

fn check_greedy(name: &str) {
    let model = load(name);
    for (i, case) in cases(name).iter().enumerate() {
        let options = GreedyOptions { max_new_tokens: case.greedy_ids.len(), page_size: PAGE, stop_at_eos: false };
        let got = greedy(&*model, &case.input_ids, &options).unwrap();
        assert_eq!(got, case.greedy_ids, "{name} case {i}: greedy ids");
    }
}

fn check_chunked_prefill(name: &str) {
    let model = load(name);
    let v = model.vocab_size();
    for (i, case) in cases(name).iter().enumerate().filter(|(_, c)| c.input_ids.len() > 1) {
        let l = case.input_ids.len();
        // Split inside a page so that the second chunk starts mid-page.
        let split = l / 2 + 1;
        let table = pages(0, l.div_ceil(PAGE));
        let kv = model.new_kv_cache(table.len(), PAGE).unwrap();
        let first = SeqStep { new_tokens: &case.input_ids[..split], cached_len: 0, pages: &table };
        let mut got = forward(&*model, &kv, &[first], LogitRows::All);
        let second = SeqStep { new_tokens: &case.input_ids[split..], cached_len: split, pages: &table };
        got.extend(forward(&*model, &kv, &[second], LogitRows::All));
        assert_eq!(got.len(), l * v);
        let err = rel_l2(&got, &case.logits);
        assert!(err <= TOL, "{name} case {i}: chunked prefill (split at {split}) rel L2 {err:e}");
    }
}

/// Every case's prompt in one batch, then one batched decode step.
fn check_batched(name: &str) {
    let model = load(name);
    let v = model.vocab_size();
    let cases = cases(name);
    let tables: Vec<Vec<u32>> = {
        let mut next = 0;
        cases
            .iter()
            .map(|c| {
                let n = (c.input_ids.len() + 1).div_ceil(PAGE);
                next += n as u32;
                pages(next - n as u32, n)
            })
            .collect()
    };
    let kv = model.new_kv_cache(tables.iter().map(Vec::len).sum(), PAGE).unwrap();
    let seqs: Vec<SeqStep<'_>> =
        cases.iter().zip(&tables).map(|(c, t)| SeqStep { new_tokens: &c.input_ids, cached_len: 0, pages: t }).collect();
    let got = forward(&*model, &kv, &seqs, LogitRows::LastOfEachSequence);
    for (i, c) in cases.iter().enumerate() {
        let err = rel_l2(&got[i * v..(i + 1) * v], &c.greedy_logits[..v]);
        assert!(err <= TOL, "{name} case {i}: batched prefill rel L2 {err:e}");
    }
    let tokens: Vec<[u32; 1]> = cases.iter().map(|c| [c.greedy_ids[0]]).collect();
    let seqs: Vec<SeqStep<'_>> = cases
        .iter()
        .zip(&tables)
        .zip(&tokens)
        .map(|((c, t), tok)| SeqStep { new_tokens: tok, cached_len: c.input_ids.len(), pages: t })
        .collect();
    let got = forward(&*model, &kv, &seqs, LogitRows::LastOfEachSequence);
    for (i, c) in cases.iter().enumerate() {
        let err = rel_l2(&got[i * v..(i + 1) * v], &c.greedy_logits[v..2 * v]);
        assert!(err <= TOL, "{name} case {i}: batched decode rel L2 {err:e}");
    }
}

/// `load_model` (f32 `inv_freq`, see `common::load`) at position 0, where rope
/// is the identity whatever the frequencies.
fn check_public_loader(name: &str) {
    let model = load_public(name);
    let v = model.vocab_size();
    for (i, case) in cases(name).iter().enumerate() {
        let table = [0];
        let kv = model.new_kv_cache(1, PAGE).unwrap();
        let seq = SeqStep { new_tokens: &case.input_ids[..1], cached_len: 0, pages: &table };
        let got = forward(&*model, &kv, &[seq], LogitRows::All);
        let err = rel_l2(&got, &case.logits[..v]);
        assert!(err <= TOL, "{name} case {i}: load_model, position 0: rel L2 {err:e}");
    }
}

macro_rules! fixture_tests {
    ($($module:ident: $name:expr;)*) => {$(
        mod $module {
            #[test]
            fn prefill_and_teacher_forced_decode() {
                super::check_prefill_and_decode($name);
            }
            #[test]
            fn greedy_generation() {
                super::check_greedy($name);
            }
            #[test]
            fn chunked_prefill() {
                super::check_chunked_prefill($name);
            }
            #[test]
            fn batched_sequences() {
                super::check_batched($name);
            }
            #[test]
            fn public_loader() {
                super::check_public_loader($name);
            }
        }
    )*};
}

fixture_tests! {
    llama: "llama-tiny";
    qwen2: "qwen2-tiny";
    qwen3: "qwen3-tiny";
    mistral: "mistral-tiny";
}
