//! minisgl: the workspace root package (end-to-end tests and benchmarks live in tests/ and benches/).
#![forbid(unsafe_code)]
pub use engine;
pub use kernel_runtime;
pub use models;
