//! The attention backend registry (`--attn`) and its implementations.
//!
//! The trait is [`AttnBackend`] in `ctx`; this module names the implementations
//! ([`AttnBackendKind`], a closed set), parses `--attn` ([`AttnBackendSpec`]: one
//! name, or a `prefill,decode` pair as mini-sglang accepts), and builds them from
//! [`ATTN_BACKENDS`], the one table to extend when a backend is added.
//!
//! | name | what |
//! | --- | --- |
//! | `paged` | `ops::store_kv` + `ops::paged_attention`: any page size, CPU and CUDA; on CUDA the decode kernel for batches it holds, else the tile kernel |
//! | `tile` | the same with the FlashAttention-2 tile kernel for every batch (CUDA) |
//! | `decode` | the same with the decode kernel (CUDA; a batch with more than 8 query rows per kv head is an error: use it as `--attn paged,decode`) |

use std::fmt;
use std::str::FromStr;

use kernel_runtime::ops::{self, AttnKernel};
use kernel_runtime::Tensor;

use crate::ctx::{AttnBackend, AttnInputs, AttnPlan, ForwardBatch, ForwardCtx};
use crate::error::{ModelError, Result};

/// The attention implementations.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum AttnBackendKind {
    /// The kernel-runtime paged attention op (CPU reference and CUDA), each batch
    /// on the CUDA kernel that suits it.
    Paged,
    /// The paged attention op on the tile kernel only.
    Tile,
    /// The paged attention op on the decode kernel only.
    Decode,
}

/// A constructor of one backend.
pub type AttnBackendCtor = fn() -> Result<Box<dyn AttnBackend>>;

/// Every backend: kind, `--attn` name, constructor.
pub const ATTN_BACKENDS: &[(AttnBackendKind, &str, AttnBackendCtor)] = &[
    (AttnBackendKind::Paged, "paged", || Ok(Box::new(PagedAttnBackend { kernel: AttnKernel::Auto, name: "paged" }))),
    (AttnBackendKind::Tile, "tile", || Ok(Box::new(PagedAttnBackend { kernel: AttnKernel::Tile, name: "tile" }))),
    (AttnBackendKind::Decode, "decode", || {
        Ok(Box::new(PagedAttnBackend { kernel: AttnKernel::Decode, name: "decode" }))
    }),
];

fn supported() -> String {
    ATTN_BACKENDS.iter().map(|b| b.1).collect::<Vec<_>>().join(", ")
}

impl AttnBackendKind {
    /// The `--attn` name.
    pub fn name(self) -> &'static str {
        ATTN_BACKENDS.iter().find(|b| b.0 == self).map_or("?", |b| b.1)
    }

    /// Builds the backend.
    pub fn create(self) -> Result<Box<dyn AttnBackend>> {
        let ctor =
            ATTN_BACKENDS.iter().find(|b| b.0 == self).map(|b| b.2).ok_or_else(|| {
                ModelError::UnsupportedAttnBackend { name: format!("{self:?}"), supported: supported() }
            })?;
        ctor()
    }
}

impl FromStr for AttnBackendKind {
    type Err = ModelError;

    fn from_str(s: &str) -> Result<AttnBackendKind> {
        let name = s.trim();
        ATTN_BACKENDS
            .iter()
            .find(|b| b.1.eq_ignore_ascii_case(name))
            .map(|b| b.0)
            .ok_or_else(|| ModelError::UnsupportedAttnBackend { name: name.to_owned(), supported: supported() })
    }
}

impl fmt::Display for AttnBackendKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// The backends of prefill and decode steps (`--attn paged` or `--attn a,b`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AttnBackendSpec {
    pub prefill: AttnBackendKind,
    pub decode: AttnBackendKind,
}

impl AttnBackendSpec {
    /// One backend for both phases.
    pub fn single(kind: AttnBackendKind) -> AttnBackendSpec {
        AttnBackendSpec { prefill: kind, decode: kind }
    }

    /// Builds the backend: the one named, or a pair choosing by phase.
    pub fn create(&self) -> Result<Box<dyn AttnBackend>> {
        if self.prefill == self.decode {
            self.prefill.create()
        } else {
            Ok(Box::new(HybridAttnBackend { prefill: self.prefill.create()?, decode: self.decode.create()? }))
        }
    }
}

impl FromStr for AttnBackendSpec {
    type Err = ModelError;

    /// `name` or `prefill_name,decode_name`.
    fn from_str(s: &str) -> Result<AttnBackendSpec> {
        match s.split_once(',') {
            None => Ok(AttnBackendSpec::single(s.parse()?)),
            Some((prefill, decode)) => Ok(AttnBackendSpec { prefill: prefill.parse()?, decode: decode.parse()? }),
        }
    }
}

impl fmt::Display for AttnBackendSpec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.prefill == self.decode {
            write!(f, "{}", self.prefill)
        } else {
            write!(f, "{},{}", self.prefill, self.decode)
        }
    }
}

/// `ops::store_kv` then `ops::paged_attention` over the batch's block table, on
/// the CUDA kernel `kernel` names.
#[derive(Debug)]
pub struct PagedAttnBackend {
    kernel: AttnKernel,
    name: &'static str,
}

impl AttnBackend for PagedAttnBackend {
    fn name(&self) -> &'static str {
        self.name
    }

    fn decode_graph_safe(&self) -> bool {
        self.kernel != AttnKernel::Tile
    }

    fn plan(&self, _batch: &ForwardBatch) -> Result<AttnPlan> {
        Ok(AttnPlan::default())
    }

    fn forward(&self, ctx: &ForwardCtx<'_>, inputs: AttnInputs<'_>) -> Result<Tensor> {
        let (k_cache, v_cache) = ctx.kv.layer(inputs.layer_idx)?;
        if !inputs.kv_stored {
            ops::store_kv(k_cache, v_cache, ctx.batch.out_loc(), inputs.k, inputs.v)?;
        }
        let out = Tensor::empty(inputs.q.shape(), inputs.q.dtype(), inputs.q.device())?;
        ops::paged_attention_with(&out, inputs.q, k_cache, v_cache, &ctx.batch.attn_meta(), inputs.scale, self.kernel)?;
        Ok(out)
    }

    /// `ops::rope_store_attention`: on CUDA the decode kernel can run the prologue
    /// in its launch (`MINISGL_DECODE_FUSED_ROPE`).
    fn forward_rope(&self, ctx: &ForwardCtx<'_>, inputs: AttnInputs<'_>, rope: &ops::RopeStore<'_>) -> Result<Tensor> {
        let out = Tensor::empty(inputs.q.shape(), inputs.q.dtype(), inputs.q.device())?;
        ops::rope_store_attention(&out, rope, &ctx.batch.attn_meta(), inputs.scale, self.kernel)?;
        Ok(out)
    }
}

/// One backend for prefill (and mixed) steps, another for pure decode steps.
#[derive(Debug)]
pub struct HybridAttnBackend {
    prefill: Box<dyn AttnBackend>,
    decode: Box<dyn AttnBackend>,
}

impl HybridAttnBackend {
    fn pick(&self, batch: &ForwardBatch) -> &dyn AttnBackend {
        if batch.is_decode() {
            &*self.decode
        } else {
            &*self.prefill
        }
    }
}

impl AttnBackend for HybridAttnBackend {
    fn name(&self) -> &'static str {
        "hybrid"
    }

    fn decode_graph_safe(&self) -> bool {
        self.decode.decode_graph_safe()
    }

    fn plan(&self, batch: &ForwardBatch) -> Result<AttnPlan> {
        self.pick(batch).plan(batch)
    }

    fn forward(&self, ctx: &ForwardCtx<'_>, inputs: AttnInputs<'_>) -> Result<Tensor> {
        self.pick(ctx.batch).forward(ctx, inputs)
    }

    fn forward_rope(&self, ctx: &ForwardCtx<'_>, inputs: AttnInputs<'_>, rope: &ops::RopeStore<'_>) -> Result<Tensor> {
        self.pick(ctx.batch).forward_rope(ctx, inputs, rope)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn specs_parse_and_unknown_names_list_the_supported() {
        assert_eq!("paged".parse::<AttnBackendSpec>().unwrap(), AttnBackendSpec::single(AttnBackendKind::Paged));
        assert_eq!("paged,paged".parse::<AttnBackendSpec>().unwrap().to_string(), "paged");
        let e = "fa,paged".parse::<AttnBackendSpec>().unwrap_err().to_string();
        assert!(e.contains("`fa`") && e.contains("supported: paged, tile, decode"), "{e}");
        assert_eq!(AttnBackendKind::Paged.create().unwrap().name(), "paged");
        let spec = "tile,decode".parse::<AttnBackendSpec>().unwrap();
        assert_eq!((spec.prefill, spec.decode), (AttnBackendKind::Tile, AttnBackendKind::Decode));
        assert_eq!(AttnBackendKind::Decode.create().unwrap().name(), "decode");
    }
}
