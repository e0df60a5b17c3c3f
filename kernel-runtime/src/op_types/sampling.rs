//! [`SampleRow`], the sampling settings of one row, shared by `ops::sample`, its
//! CPU reference and its CUDA launcher.

/// The sampling settings of one row (see sampling.cu for the exact rules).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct SampleRow {
    /// 0 is greedy (argmax, first index on ties).
    pub temperature: f32,
    /// Keep the `top_k` most likely tokens; 0 keeps all.
    pub top_k: u32,
    /// Keep the smallest head of the ranking whose mass reaches `top_p`; 1 keeps all.
    pub top_p: f32,
    /// Drop tokens less likely than `min_p` times the most likely; 0 keeps all.
    pub min_p: f32,
    /// The uniform number of the draw, in `[0, 1)`.
    pub u: f32,
}

impl SampleRow {
    /// Greedy.
    pub fn greedy() -> SampleRow {
        SampleRow { temperature: 0.0, top_k: 0, top_p: 1.0, min_p: 0.0, u: 0.0 }
    }
}
