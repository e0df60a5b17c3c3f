//! Tensor-parallel models on the CPU, every rank a thread of this process over
//! the TCP collectives: at `--tp 2` and `--tp 4` every fixture gives the
//! transformers reference logits (prefill, teacher-forced decode) within 1e-4
//! relative L2 and the reference greedy ids, exactly as at `--tp 1`; and each
//! rank reads only its slice of the safetensors file.
//!
//! (The same numerics through real worker processes and the rendezvous are
//! tested in engine/tests/tp_processes.rs.)

mod common;

use std::sync::Arc;
use std::time::Duration;

use common::{cases, cpu_f32, fixture, rel_l2};
use kernel_runtime::{DType, Device};
use models::registry::model_loader;
use models::tp::TcpCollective;
use models::{AttnBackendKind, CausalLm, ForwardBatch, LoadFormat, LogitRows, ModelConfig, MoeBackendKind, SeqStep};
use models::{TpGroup, Weights};

const TOL: f64 = 1e-4;
const PAGE: usize = 4;
const ALL: [&str; 5] = ["llama-tiny", "qwen2-tiny", "qwen3-tiny", "mistral-tiny", "qwen3-moe-tiny"];

/// Loads rank `group.shard()` of fixture `name` as its references were computed
/// (see `common::load`), returning the model and the bytes it read.
fn load_rank(name: &str, group: TpGroup) -> (Box<dyn CausalLm>, u64) {
    let dir = fixture(name);
    let mut config = ModelConfig::from_folder(&dir).unwrap();
    config.rope.inv_freq_dtype = config.torch_dtype.unwrap();
    let weights = Weights::safetensors(&dir, DType::F32, Device::Cpu).unwrap().with_tp(group);
    let attn = AttnBackendKind::Paged.create().unwrap();
    let model = model_loader(&config.architecture).unwrap()(&config, &weights, attn, MoeBackendKind::Fused)
        .unwrap_or_else(|e| panic!("loading {name}: {e}"));
    (model, weights.bytes_read())
}

fn forward(model: &dyn CausalLm, kv: &models::KvCache, seq: SeqStep<'_>, rows: LogitRows) -> Vec<f32> {
    let batch = ForwardBatch::new(&[seq], PAGE, rows, model.device()).unwrap();
    model.forward(&batch, kv).unwrap().to_f32_vec().unwrap()
}

/// What one rank computed: per case, the prefill logits and each teacher-forced
/// decode step's logits.
type RankLogits = Vec<(Vec<f32>, Vec<Vec<f32>>)>;

/// Runs every case on one rank (all ranks run the same steps).
fn run_rank(name: &str, group: TpGroup) -> (RankLogits, u64) {
    let (model, bytes) = load_rank(name, group);
    let mut out = Vec::new();
    for case in cases(name) {
        let (l, n) = (case.input_ids.len(), case.greedy_ids.len());
        let table: Vec<u32> = (0..(l + n).div_ceil(PAGE) as u32).rev().collect();
        let kv = model.new_kv_cache(table.len(), PAGE).unwrap();
        let prefill = forward(
            &*model,
            &kv,
            SeqStep { new_tokens: &case.input_ids, cached_len: 0, pages: &table },
            LogitRows::All,
        );
        let decode = (0..n - 1)
            .map(|step| {
                let token = [case.greedy_ids[step]];
                let seq = SeqStep { new_tokens: &token, cached_len: l + step, pages: &table };
                forward(&*model, &kv, seq, LogitRows::LastOfEachSequence)
            })
            .collect();
        out.push((prefill, decode));
    }
    (out, bytes)
}

/// Every rank of a `tp`-way group, each on a thread: their logits and bytes read.
fn run_group(name: &'static str, tp: usize) -> Vec<(RankLogits, u64)> {
    let group = TcpCollective::local_group(tp, Duration::from_secs(60)).unwrap();
    let handles: Vec<_> = group
        .into_iter()
        .map(|c| {
            let group = TpGroup::new(Arc::new(c)).unwrap();
            std::thread::spawn(move || run_rank(name, group))
        })
        .collect();
    handles.into_iter().map(|h| h.join().unwrap()).collect()
}

fn check_against_reference(name: &'static str, tp: usize) {
    let ranks = run_group(name, tp);
    let v = ModelConfig::from_folder(&fixture(name)).unwrap().vocab_size;
    for (rank, (logits, _)) in ranks.iter().enumerate() {
        // Every rank holds the same all-gathered logits.
        assert_eq!(logits, &ranks[0].0, "{name} tp {tp}: rank {rank} differs from rank 0");
    }
    for (i, (case, (prefill, decode))) in cases(name).iter().zip(&ranks[0].0).enumerate() {
        let err = rel_l2(prefill, &case.logits);
        assert!(err <= TOL, "{name} tp {tp} case {i}: prefill logits rel L2 {err:e}");
        for (step, got) in decode.iter().enumerate() {
            let want = &case.greedy_logits[(step + 1) * v..(step + 2) * v];
            let err = rel_l2(got, want);
            assert!(err <= TOL, "{name} tp {tp} case {i}: decode step {step} rel L2 {err:e}");
        }
        // Greedy ids: the argmax of each step's logits is the reference's next id.
        let l = case.input_ids.len();
        let mut ids = vec![common::argmax(&prefill[(l - 1) * v..l * v]) as u32];
        ids.extend(decode.iter().map(|row| common::argmax(row) as u32));
        assert_eq!(ids, case.greedy_ids, "{name} tp {tp} case {i}: greedy ids");
    }
}

#[test]
fn every_fixture_at_tp2_matches_the_reference() {
    for name in ALL {
        check_against_reference(name, 2);
    }
}

#[test]
fn every_fixture_at_tp4_matches_the_reference() {
    // 4 query heads each; the fixtures' 2 or 1 KV heads are replicated.
    for name in ALL {
        check_against_reference(name, 4);
    }
}

#[test]
fn each_rank_reads_only_its_slice() {
    for name in ["llama-tiny", "qwen3-moe-tiny"] {
        let (_, whole) = load_rank(name, TpGroup::single());
        let file = std::fs::metadata(fixture(name).join("model.safetensors")).unwrap().len();
        assert!(whole > file * 9 / 10 && whole <= file, "{name}: tp 1 read {whole} of {file} bytes");
        for tp in [2, 4] {
            let ranks = run_group(name, tp);
            // Norms and the MoE router are replicated, KV heads too when fewer than
            // ranks: allow them, but nothing near a whole copy.
            let limit = whole / tp as u64 + whole / 8;
            for (rank, (_, bytes)) in ranks.iter().enumerate() {
                assert!(*bytes <= limit, "{name} tp {tp}: rank {rank} read {bytes} bytes, at most {limit} expected");
                assert!(*bytes >= whole / tp as u64 / 2, "{name} tp {tp}: rank {rank} read only {bytes} bytes");
            }
            let total: u64 = ranks.iter().map(|(_, b)| b).sum();
            assert!(total >= whole, "{name} tp {tp}: the ranks read {total} bytes together, less than the model");
        }
    }
}

#[test]
fn dummy_shards_are_slices_of_the_unsplit_model() {
    // A dummy tp-2 group gives the logits of the dummy tp-1 model.
    let name = "llama-tiny";
    let options = cpu_f32(LoadFormat::Dummy);
    let reference = {
        let model = models::load_model(&fixture(name), &options).unwrap();
        let kv = model.new_kv_cache(4, PAGE).unwrap();
        let table = [0u32, 1, 2, 3];
        forward(&*model, &kv, SeqStep { new_tokens: &[1, 2, 3, 4, 5], cached_len: 0, pages: &table }, LogitRows::All)
    };
    let group = TcpCollective::local_group(2, Duration::from_secs(60)).unwrap();
    let handles: Vec<_> = group
        .into_iter()
        .map(|c| {
            std::thread::spawn(move || {
                let model = models::load_model_sharded(
                    &fixture(name),
                    &cpu_f32(LoadFormat::Dummy),
                    TpGroup::new(Arc::new(c)).unwrap(),
                )
                .unwrap();
                let kv = model.new_kv_cache(4, PAGE).unwrap();
                let table = [0u32, 1, 2, 3];
                let seq = SeqStep { new_tokens: &[1, 2, 3, 4, 5], cached_len: 0, pages: &table };
                forward(&*model, &kv, seq, LogitRows::All)
            })
        })
        .collect();
    for h in handles {
        let got = h.join().unwrap();
        let err = rel_l2(&got, &reference);
        assert!(err <= TOL, "dummy tp 2 vs tp 1: rel L2 {err:e}");
    }
}

#[test]
fn sizes_that_do_not_split_are_errors_naming_them() {
    // 4 query heads do not split over 3 ranks.
    let group = TcpCollective::local_group(3, Duration::from_secs(10)).unwrap();
    let err = models::load_model_sharded(
        &fixture("llama-tiny"),
        &cpu_f32(LoadFormat::Auto),
        TpGroup::new(Arc::new(group.into_iter().next().unwrap())).unwrap(),
    )
    .unwrap_err()
    .to_string();
    assert!(err.contains("num_attention_heads = 4") && err.contains("--tp 3"), "{err}");
}
