//! llama.cpp tensor names to HuggingFace names, and the Q/K row permutation.
//!
//! llama.cpp's `convert_hf_to_gguf.py` renames every tensor (`gguf-py`'s
//! `tensor_mapping.py`) and, for LLaMA-architecture models only, reorders the
//! rows of `q_proj`/`k_proj` so that llama.cpp's interleaved ("normal") RoPE
//! computes what HF's rotate-half RoPE computes. Loading a GGUF into HF-layout
//! models therefore means renaming back ([`map_name`]) and un-permuting
//! ([`unpermute_qk_rows`]).
//!
//! Packed MoE tensors (`blk.N.ffn_{gate,up,down}_exps.weight`, ggml shape
//! `[in, out, E]`, i.e. `[E, out, in]` row-major) are exposed per expert under
//! HF's `model.layers.N.mlp.experts.E.{gate,up,down}_proj.weight` names; the
//! bytes of one expert are contiguous, so each expert is read on its own.

/// Global (non-layer) tensors: llama.cpp base name, HF base name.
const GLOBAL: &[(&str, &str)] =
    &[("token_embd", "model.embed_tokens"), ("output_norm", "model.norm"), ("output", "lm_head")];

/// Per-layer tensors: llama.cpp base name after `blk.N.`, HF name after
/// `model.layers.N.`.
const BLOCK: &[(&str, &str)] = &[
    ("attn_norm", "input_layernorm"),
    ("attn_q", "self_attn.q_proj"),
    ("attn_k", "self_attn.k_proj"),
    ("attn_v", "self_attn.v_proj"),
    ("attn_output", "self_attn.o_proj"),
    ("attn_q_norm", "self_attn.q_norm"),
    ("attn_k_norm", "self_attn.k_norm"),
    ("ffn_norm", "post_attention_layernorm"),
    ("ffn_gate", "mlp.gate_proj"),
    ("ffn_up", "mlp.up_proj"),
    ("ffn_down", "mlp.down_proj"),
    ("ffn_gate_inp", "mlp.gate"),
];

/// Packed expert tensors: llama.cpp base name after `blk.N.`, HF projection.
const EXPERTS: &[(&str, &str)] =
    &[("ffn_gate_exps", "gate_proj"), ("ffn_up_exps", "up_proj"), ("ffn_down_exps", "down_proj")];

/// What a llama.cpp tensor becomes on the HF side.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum MappedName {
    /// One GGUF tensor is one HF tensor of that name.
    Single(String),
    /// A packed `[E, out, in]` expert tensor of layer `layer`: expert `e` is
    /// the HF tensor [`expert_hf_name`]`(layer, e, proj)`.
    Experts { layer: usize, proj: &'static str },
}

/// Maps a llama.cpp tensor name to its HF counterpart; `None` for tensors HF
/// checkpoints do not have (e.g. `rope_freqs.weight`, which llama.cpp stores
/// for Llama 3.1 rope scaling instead of config keys).
pub fn map_name(gguf_name: &str) -> Option<MappedName> {
    let (base, suffix) = gguf_name.rsplit_once('.')?;
    if suffix != "weight" && suffix != "bias" {
        return None;
    }
    if let Some(rest) = base.strip_prefix("blk.") {
        let (layer, part) = rest.split_once('.')?;
        let layer: usize = layer.parse().ok()?;
        if let Some((_, hf)) = BLOCK.iter().find(|(g, _)| *g == part) {
            return Some(MappedName::Single(format!("model.layers.{layer}.{hf}.{suffix}")));
        }
        return EXPERTS
            .iter()
            .find(|(g, _)| *g == part && suffix == "weight")
            .map(|&(_, proj)| MappedName::Experts { layer, proj });
    }
    GLOBAL.iter().find(|(g, _)| *g == base).map(|(_, hf)| MappedName::Single(format!("{hf}.{suffix}")))
}

/// HF name of expert `expert`'s `proj` (`gate_proj`, `up_proj`, `down_proj`)
/// in layer `layer`.
pub fn expert_hf_name(layer: usize, expert: usize, proj: &str) -> String {
    format!("model.layers.{layer}.mlp.experts.{expert}.{proj}.weight")
}

/// Whether llama.cpp permuted this tensor's rows for RoPE: `q_proj`/`k_proj`
/// weights and biases of LLaMA-architecture files. Returns the head count to
/// use: `Some(true)` for Q (`n_head`), `Some(false)` for K (`n_head_kv`).
pub fn permuted_qk(gguf_name: &str) -> Option<bool> {
    let (base, suffix) = gguf_name.rsplit_once('.')?;
    if suffix != "weight" && suffix != "bias" {
        return None;
    }
    let part = base.strip_prefix("blk.")?.split_once('.')?.1;
    match part {
        "attn_q" => Some(true),
        "attn_k" => Some(false),
        _ => None,
    }
}

/// The rows of a Q or K projection cannot be split into heads of two halves.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("cannot split {rows} rows ({len} values) into {num_heads} heads of two rotary halves")]
pub struct PermuteError {
    pub rows: usize,
    pub len: usize,
    pub num_heads: usize,
}

/// Checks the geometry and returns (rows per half-head, values per row).
fn geometry(data: &[f32], rows: usize, num_heads: usize) -> Result<(usize, usize), PermuteError> {
    let err = PermuteError { rows, len: data.len(), num_heads };
    if rows == 0 || num_heads == 0 || !rows.is_multiple_of(2 * num_heads) || !data.len().is_multiple_of(rows) {
        return Err(err);
    }
    Ok((rows / num_heads / 2, data.len() / rows))
}

/// Moves row blocks: `out[dst(h, a, b)] = data[src(h, a, b)]` over every head
/// `h`, rotary half `s` and pair index `i`.
fn shuffle(data: &[f32], rows: usize, num_heads: usize, to_hf: bool) -> Result<Vec<f32>, PermuteError> {
    let (half, row_len) = geometry(data, rows, num_heads)?;
    let mut out = vec![0f32; data.len()];
    for h in 0..num_heads {
        for s in 0..2 {
            for i in 0..half {
                // HF row (h, s, i) is llama.cpp row (h, i, s).
                let hf = h * 2 * half + s * half + i;
                let gg = h * 2 * half + i * 2 + s;
                let (src, dst) = if to_hf { (gg, hf) } else { (hf, gg) };
                out[dst * row_len..(dst + 1) * row_len].copy_from_slice(&data[src * row_len..(src + 1) * row_len]);
            }
        }
    }
    Ok(out)
}

/// llama.cpp's permutation (`LlamaModel.permute` in `convert_hf_to_gguf.py`):
/// `w.reshape(n_head, 2, rows / n_head / 2, ...).swapaxes(1, 2)`. `data` is
/// row-major with `rows` rows (a weight `[rows, in]` or a bias `[rows]`).
/// Only needed to test [`unpermute_qk_rows`] and to write GGUF files.
pub fn permute_qk_rows(data: &[f32], rows: usize, num_heads: usize) -> Result<Vec<f32>, PermuteError> {
    shuffle(data, rows, num_heads, false)
}

/// Inverse of [`permute_qk_rows`]: llama.cpp Q/K rows back to HF order. Use
/// `num_attention_heads` for Q and `num_key_value_heads` for K, as the
/// converter did.
pub fn unpermute_qk_rows(data: &[f32], rows: usize, num_heads: usize) -> Result<Vec<f32>, PermuteError> {
    shuffle(data, rows, num_heads, true)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_map_like_transformers() {
        let single = |s: &str| Some(MappedName::Single(s.to_owned()));
        assert_eq!(map_name("token_embd.weight"), single("model.embed_tokens.weight"));
        assert_eq!(map_name("output.weight"), single("lm_head.weight"));
        assert_eq!(map_name("output_norm.weight"), single("model.norm.weight"));
        assert_eq!(map_name("blk.12.attn_q.weight"), single("model.layers.12.self_attn.q_proj.weight"));
        assert_eq!(map_name("blk.0.attn_k.bias"), single("model.layers.0.self_attn.k_proj.bias"));
        assert_eq!(map_name("blk.3.attn_output.weight"), single("model.layers.3.self_attn.o_proj.weight"));
        assert_eq!(map_name("blk.3.attn_k_norm.weight"), single("model.layers.3.self_attn.k_norm.weight"));
        assert_eq!(map_name("blk.1.ffn_norm.weight"), single("model.layers.1.post_attention_layernorm.weight"));
        assert_eq!(map_name("blk.1.attn_norm.weight"), single("model.layers.1.input_layernorm.weight"));
        assert_eq!(map_name("blk.1.ffn_down.weight"), single("model.layers.1.mlp.down_proj.weight"));
        assert_eq!(map_name("blk.1.ffn_gate_inp.weight"), single("model.layers.1.mlp.gate.weight"));
        assert_eq!(map_name("blk.7.ffn_up_exps.weight"), Some(MappedName::Experts { layer: 7, proj: "up_proj" }));
        assert_eq!(map_name("rope_freqs.weight"), None);
        assert_eq!(map_name("blk.x.attn_q.weight"), None);
        assert_eq!(map_name("blk.0.attn_q.scale"), None);
        assert_eq!(expert_hf_name(7, 3, "up_proj"), "model.layers.7.mlp.experts.3.up_proj.weight");
        assert_eq!(permuted_qk("blk.2.attn_q.weight"), Some(true));
        assert_eq!(permuted_qk("blk.2.attn_k.bias"), Some(false));
        assert_eq!(permuted_qk("blk.2.attn_k_norm.weight"), None);
    }

    #[test]
    fn unpermute_inverts_permute() {
        for (heads, head_dim, cols) in [(1, 2, 1), (3, 8, 5), (4, 64, 3), (2, 16, 1)] {
            let rows = heads * head_dim;
            let w: Vec<f32> = (0..rows * cols).map(|x| x as f32).collect();
            let p = permute_qk_rows(&w, rows, heads).unwrap();
            if head_dim > 2 {
                assert_ne!(p, w, "permutation of {heads}x{head_dim} is not the identity");
            }
            assert_eq!(unpermute_qk_rows(&p, rows, heads).unwrap(), w);
        }
    }

    #[test]
    fn permute_matches_the_numpy_reshape() {
        // One head of dim 4: rows [0, 1, 2, 3] -> reshape(1, 2, 2).swapaxes(1, 2) -> [0, 2, 1, 3].
        assert_eq!(permute_qk_rows(&[0., 1., 2., 3.], 4, 1).unwrap(), vec![0., 2., 1., 3.]);
    }

    #[test]
    fn bad_geometry_is_an_error() {
        assert!(unpermute_qk_rows(&[0.; 12], 6, 2).is_err());
        assert!(unpermute_qk_rows(&[0.; 7], 4, 1).is_err());
        assert!(unpermute_qk_rows(&[], 0, 1).is_err());
    }
}
