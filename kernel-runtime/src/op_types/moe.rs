//! The MoE types the ops, the CPU reference and the CUDA launchers share: the
//! routing of a batch, its pairs sorted by expert, the sizes of the sorted
//! lists, and the tile plan of the CUDA path (see `crate::ops::moe` for the ops).

use crate::tensor::Tensor;

/// The row granule of the sorted pair list (every expert's run is padded to a
/// multiple of it): the `BLOCK_M` the align kernels are built for.
pub const MOE_BLOCK_M: usize = 16;

/// The routing of a batch: `topk_ids` `[t, k]` i32 (largest router logit first,
/// ties to the lower expert index) and `topk_weights` `[t, k]` f32.
#[derive(Debug, Clone)]
pub struct MoeRouting {
    pub topk_ids: Tensor,
    pub topk_weights: Tensor,
}

impl MoeRouting {
    /// Experts per token.
    pub fn top_k(&self) -> usize {
        self.topk_ids.dim(1)
    }

    /// Tokens.
    pub fn num_tokens(&self) -> usize {
        self.topk_ids.dim(0)
    }
}

/// The pairs of a batch sorted by expert, as `moe_align_block_size` lays them out
/// (stable: the pairs of one expert keep their order):
/// - `expert_offsets` `[E + 1]`: padded start of each expert's run, then the total;
/// - `sorted_ids` `[L]`: the pair at each position, `t * k` for padding (positions
///   past the padded total are unspecified);
/// - `block_experts` `[L / block_m]`: the expert of each `block_m` rows;
/// - `tiles` `[2 + max tiles]`: count, `tile_m`, then the first row of each GEMM
///   tile (each expert's run cut into pieces of at most `tile_m` rows).
#[derive(Debug, Clone)]
pub struct MoeAlignment {
    pub sorted_ids: Tensor,
    pub block_experts: Tensor,
    pub expert_offsets: Tensor,
    pub tiles: Tensor,
    pub block_m: usize,
    pub tile_m: usize,
}

/// Rows of the sorted list for `num_pairs` pairs over `num_experts` experts: every
/// non-empty expert's run rounded up to `block_m` (moe.cuh's `moe_sorted_rows`).
pub fn moe_sorted_rows(num_pairs: usize, num_experts: usize, block_m: usize) -> usize {
    let nonempty = num_pairs.min(num_experts);
    (num_pairs + nonempty * (block_m - 1)).div_ceil(block_m) * block_m
}

/// Entries of the tile list for `rows` sorted rows (count, tile_m, one start per
/// tile; moe.cuh's `moe_tile_entries`).
pub fn moe_tile_entries(rows: usize, num_pairs: usize, num_experts: usize, tile_m: usize) -> usize {
    2 + rows.div_ceil(tile_m) + num_pairs.min(num_experts)
}

/// How the CUDA path runs a batch: the `moe_gemm` tile of each GEMM (their row
/// counts must agree: one alignment serves both), whether the launches use
/// programmatic dependent launch, and whether the batch takes the decode kernels
/// instead (`moe_decode`: weight streams per (token, expert) pair, no sort; the
/// tiles are then unused).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MoePlan {
    pub gate_up_tile: usize,
    pub down_tile: usize,
    pub pdl: bool,
    pub decode: bool,
}
