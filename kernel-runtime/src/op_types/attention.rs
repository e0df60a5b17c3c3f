//! The argument types of paged attention ([`crate::ops::paged_attention`]): the
//! batch layout both implementations read, and the CUDA kernel choice.

use crate::tensor::Tensor;

/// The batch layout attention needs, as device (or host) tensors built by the
/// engine for one forward step.
#[derive(Debug, Clone)]
pub struct PagedAttnMeta<'a> {
    /// `[b + 1]` int32: new (query) tokens of sequence i are rows
    /// `q_indptr[i]..q_indptr[i + 1]` of q.
    pub q_indptr: &'a Tensor,
    /// `[b]` int32: tokens of sequence i in the cache after this step's store
    /// (cached prefix + new tokens).
    pub kv_lens: &'a Tensor,
    /// `[b, max_pages]` int32: page numbers of sequence i, in order.
    pub block_table: &'a Tensor,
    /// Host copies: query tokens and kv length of each sequence (for planning and
    /// the CPU path).
    pub q_lens_host: &'a [usize],
    pub kv_lens_host: &'a [usize],
    /// A fixed split count for the CUDA decode kernel, for steps captured in a
    /// CUDA graph: the launch must not depend on the lengths, which change at
    /// every replay, so each sequence is cut on the device into at most this many
    /// equal chunks. `None`: planned from `kv_lens_host` (eager steps).
    pub decode_splits: Option<usize>,
}

/// Which CUDA kernel computes paged attention (the CPU path ignores the choice).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum AttnKernel {
    /// The decode kernel where the batch fits it, the prefill kernel for batches of
    /// long query runs, else the tile kernel.
    #[default]
    Auto,
    /// The FlashAttention-2 tile kernel (attention.cu), for every batch.
    Tile,
    /// The decode kernel (decode_attention.cu); a batch it cannot hold is an error.
    Decode,
    /// The prefill kernel (prefill_attention.cu: long query runs, bf16/f16, head
    /// dims 64, 128, 256), for every batch; another dtype or head dim is an error.
    Prefill,
}

/// How the CUDA decode kernel cuts a batch's keys into splits (eager steps; a
/// graph's fixed split count is planned by `ops::decode_graph_splits`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum DecodePlanKind {
    /// One chunk size for the batch, aiming for a number of waves of blocks
    /// (`split_waves`), no split once the unsplit blocks make `unsplit_waves`.
    #[default]
    Waves,
    /// The split size that a cost model of waves, per-block overhead and the
    /// merge finds fastest, every sequence cut into equal splits of at most that
    /// many keys (long sequences get more splits, short ones none).
    Keys,
}

/// Who merges the splits of a split decode launch.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum SplitMerge {
    /// The combine launch (the default, see `DecodeTuning::default`).
    #[default]
    Never,
    /// The last block of each (sequence, kv head), in the decode launch.
    Always,
    /// The last block when the launch's busy blocks fit one wave (a small batch
    /// of long contexts: the combine launch would be a large part of the
    /// latency), else the combine launch.
    Auto,
}

/// The run-time choices of the CUDA decode kernel and its plan: read once from
/// the environment ([`DecodeTuning::from_env`]; the defaults are the values
/// measured best so far), overridable for a process by `ops::set_decode_tuning`
/// so that one benchmark run sweeps them. Every choice gives deterministic bits
/// (the same run to run and between graph replay and eager launch); different
/// choices may round differently.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct DecodeTuning {
    /// [`DecodePlanKind::Waves`]: waves of blocks a split batch aims for
    /// (`MINISGL_DECODE_SPLIT_WAVES`, 8).
    pub split_waves: usize,
    /// Waves of unsplit blocks from which a batch is not split
    /// (`MINISGL_DECODE_UNSPLIT_WAVES`, 4); both plans.
    pub unsplit_waves: usize,
    /// Waves of blocks a CUDA graph's fixed-split plan aims for
    /// (`MINISGL_DECODE_GRAPH_SPLIT_WAVES`, 1: at batch 1 one wave was as fast
    /// as two at short contexts and 20% faster from 8192 keys, its splits
    /// twice as long; docs/PERF.md, tenth session, call 2).
    pub graph_split_waves: usize,
    /// The fewest keys a split holds (`MINISGL_DECODE_CHUNK_MIN`, 128; rounded
    /// up to a multiple of 64). It also caps a graph's split count (a split
    /// each `chunk_min` keys of the graph's longest context).
    pub chunk_min: usize,
    /// The fewest keys a split of a CUDA graph's fixed-split plan holds when the
    /// kernel cuts a sequence into its equal chunks at run time
    /// (`MINISGL_DECODE_GRAPH_CHUNK_MIN`, 64, one key tile; a multiple of 64):
    /// below it a short context takes fewer splits than the graph launches
    /// blocks for. 64 since the eighteenth session (128 before): a 512-key
    /// context runs as 8 one-tile splits instead of 4 two-tile ones, the
    /// Qwen3-0.6B bs=1 graphed step's replay 0.995-0.997 -> 0.934-0.935 ms and
    /// the 30B's 3.743-3.760 -> 3.646-3.655 (H100, two alternating rounds,
    /// docs/PERF.md); batches that fill the GPU unsplit do not reach it.
    pub graph_chunk_min: usize,
    /// The tensor-core block's pipeline stages (`MINISGL_DECODE_STAGES`, 0: the
    /// default of the head dimension, 4 at 64, 2 at 128 and 256, and at head dim
    /// 128 with the keys plan eager steps take 2 or 3 per batch,
    /// `gpu::decode_plan::eager_choice`); 2 to 4, fewer where the shared memory
    /// would not fit. Fewer stages, more resident blocks (bf16 head dim 128: 3
    /// stages 2 blocks an SM, 2 stages 3 blocks). 1: the three-warp block at 2
    /// stages, 4 blocks an SM (`gpu::decode_plan::THREE_WARP_STAGES`).
    pub stages: usize,
    /// The tensor-core block's pipeline stages in a CUDA graph's split plan
    /// (`MINISGL_DECODE_GRAPH_STAGES`, 0: as `stages`); 2 to 4. A graph splits
    /// only batches too small to fill the GPU, whose splits hold few keys: a
    /// deeper pipeline puts all of a warp's keys in flight at once.
    pub graph_stages: usize,
    /// The eager plan (`MINISGL_DECODE_PLAN`: `waves`, the default, or `keys`).
    pub plan: DecodePlanKind,
    /// The split merge (`MINISGL_DECODE_SPLIT_MERGE`: `0`, `1` or `auto`, the
    /// default).
    pub merge: SplitMerge,
    /// [`DecodePlanKind::Keys`]: the fixed cost of a block (its pipeline fill and
    /// merge), microseconds (`MINISGL_DECODE_BLOCK_US`, 1.0).
    pub block_us: f64,
    /// [`DecodePlanKind::Keys`]: the fixed cost of merging splits, microseconds
    /// (`MINISGL_DECODE_COMBINE_US`, 3.0).
    pub combine_us: f64,
    /// The cluster merge of the tensor-core block (`MINISGL_DECODE_CLUSTER`, 0:
    /// off, the default; 2 to 16, sm_90's largest cluster): the most splits a
    /// sequence is cut into, whose blocks then run as one thread-block cluster
    /// and merge their partials through distributed shared memory instead of
    /// the combine launch. Plans of the tensor-core block keep at most this many
    /// splits while it is on; a launch of more splits (a fixed count asked for
    /// directly) merges in the combine launch. Off: a batch-1 launch alone is
    /// faster with it, but graphed decode steps were slower (docs/PERF.md,
    /// twelfth session).
    pub cluster: usize,
}

impl Default for DecodeTuning {
    fn default() -> DecodeTuning {
        DecodeTuning {
            split_waves: 8,
            unsplit_waves: 4,
            graph_split_waves: 1,
            chunk_min: 128,
            graph_chunk_min: 64,
            stages: 0,
            graph_stages: 0,
            plan: DecodePlanKind::Keys,
            // Off: the merging instance's bits differed from the combine launch's,
            // so an eager step and its graph replay disagreed (docs/PERF.md, fifth
            // session, calls 3-4), and the merge saved nothing measurable.
            merge: SplitMerge::Never,
            block_us: 1.0,
            combine_us: 3.0,
            cluster: 0,
        }
    }
}

impl DecodeTuning {
    /// The defaults, with each variable that is set and parses replacing its
    /// field (an unparsable value keeps the default: a typo in a sweep must not
    /// stop a server).
    pub fn from_env() -> DecodeTuning {
        Self::from_vars(|name| std::env::var(name).ok())
    }

    /// [`DecodeTuning::from_env`] over any variable source (tests).
    pub fn from_vars(var: impl Fn(&str) -> Option<String>) -> DecodeTuning {
        let d = DecodeTuning::default();
        let count = |name: &str, default: usize, lo: usize, hi: usize| {
            var(name).and_then(|v| v.trim().parse::<usize>().ok()).map_or(default, |v| v.clamp(lo, hi))
        };
        let micros = |name: &str, default: f64| {
            var(name)
                .and_then(|v| v.trim().parse::<f64>().ok())
                .filter(|v| v.is_finite() && *v >= 0.0)
                .unwrap_or(default)
        };
        let plan = match var("MINISGL_DECODE_PLAN").as_deref().map(str::trim) {
            Some("keys") => DecodePlanKind::Keys,
            Some("waves") => DecodePlanKind::Waves,
            _ => d.plan,
        };
        let merge = match var("MINISGL_DECODE_SPLIT_MERGE").as_deref().map(str::trim) {
            Some("0") => SplitMerge::Never,
            Some("1") => SplitMerge::Always,
            Some("auto") => SplitMerge::Auto,
            _ => d.merge,
        };
        let stages = count("MINISGL_DECODE_STAGES", d.stages, 0, 4);
        let graph_stages = count("MINISGL_DECODE_GRAPH_STAGES", d.graph_stages, 0, 4);
        DecodeTuning {
            split_waves: count("MINISGL_DECODE_SPLIT_WAVES", d.split_waves, 1, 64),
            unsplit_waves: count("MINISGL_DECODE_UNSPLIT_WAVES", d.unsplit_waves, 1, 64),
            graph_split_waves: count("MINISGL_DECODE_GRAPH_SPLIT_WAVES", d.graph_split_waves, 1, 64),
            chunk_min: count("MINISGL_DECODE_CHUNK_MIN", d.chunk_min, 64, 1 << 20).next_multiple_of(64),
            graph_chunk_min: count("MINISGL_DECODE_GRAPH_CHUNK_MIN", d.graph_chunk_min, 64, 1 << 20)
                .next_multiple_of(64),
            stages,
            graph_stages,
            plan,
            merge,
            block_us: micros("MINISGL_DECODE_BLOCK_US", d.block_us),
            combine_us: micros("MINISGL_DECODE_COMBINE_US", d.combine_us),
            cluster: match count("MINISGL_DECODE_CLUSTER", d.cluster, 0, 16) {
                1 => 0,
                c => c,
            },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn decode_tuning_reads_its_variables_and_keeps_defaults_on_bad_values() {
        assert_eq!(DecodeTuning::from_vars(|_| None), DecodeTuning::default());
        let vars = |name: &str| {
            match name {
                "MINISGL_DECODE_SPLIT_WAVES" => Some("3"),
                "MINISGL_DECODE_UNSPLIT_WAVES" => Some(" 2 "),
                "MINISGL_DECODE_CHUNK_MIN" => Some("200"),
                "MINISGL_DECODE_STAGES" => Some("2"),
                "MINISGL_DECODE_PLAN" => Some("keys"),
                "MINISGL_DECODE_SPLIT_MERGE" => Some("0"),
                "MINISGL_DECODE_BLOCK_US" => Some("0.5"),
                "MINISGL_DECODE_COMBINE_US" => Some("-1"),
                "MINISGL_DECODE_GRAPH_SPLIT_WAVES" => Some("x"),
                "MINISGL_DECODE_GRAPH_STAGES" => Some("3"),
                "MINISGL_DECODE_GRAPH_CHUNK_MIN" => Some("150"),
                _ => None,
            }
            .map(str::to_owned)
        };
        let t = DecodeTuning::from_vars(vars);
        assert_eq!((t.split_waves, t.unsplit_waves, t.chunk_min, t.stages), (3, 2, 256, 2));
        assert_eq!((t.plan, t.merge), (DecodePlanKind::Keys, SplitMerge::Never));
        assert_eq!((t.block_us, t.combine_us, t.graph_split_waves, t.graph_stages), (0.5, 3.0, 1, 3));
        assert_eq!(t.graph_chunk_min, 192);
        let t = DecodeTuning::from_vars(|n| (n == "MINISGL_DECODE_STAGES").then(|| "9".to_owned()));
        assert_eq!(t.stages, 4);
        assert_eq!(t.cluster, 0);
        // 1: the three-warp block (not a pipeline depth).
        let t = DecodeTuning::from_vars(|n| n.ends_with("STAGES").then(|| "1".to_owned()));
        assert_eq!((t.stages, t.graph_stages), (1, 1));
        let cluster =
            |v: &str| DecodeTuning::from_vars(|n| (n == "MINISGL_DECODE_CLUSTER").then(|| v.to_owned())).cluster;
        assert_eq!((cluster("0"), cluster("1"), cluster("8"), cluster("40"), cluster("on")), (0, 0, 8, 16, 0));
    }
}
