//! Log output of every command: `tracing` to stderr, filtered by `--log-level`
//! or, when that is not given, by `RUST_LOG` (the usual `tracing-subscriber`
//! directives, e.g. `RUST_LOG=engine=debug`), else at `info`.
//!
//! Records of the `log` crate (the model loader, the tokenizer and the kernel
//! runtime use it) go through the same subscriber, so one filter governs all.

use tracing_subscriber::EnvFilter;

/// Installs the subscriber. `level` is `--log-level`: a level (`error`,
/// `warn`, `info`, `debug`, `trace`) or any `RUST_LOG`-style directive list.
pub fn init(level: Option<&str>) -> anyhow::Result<()> {
    let filter = match level {
        Some(spec) => EnvFilter::try_new(spec).map_err(|e| anyhow::anyhow!("--log-level {spec}: {e}"))?,
        None => match std::env::var("RUST_LOG") {
            Ok(spec) if !spec.trim().is_empty() => {
                EnvFilter::try_new(&spec).map_err(|e| anyhow::anyhow!("RUST_LOG={spec}: {e}"))?
            }
            _ => EnvFilter::new("info"),
        },
    };
    let ansi = std::io::IsTerminal::is_terminal(&std::io::stderr());
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_target(false)
        .with_ansi(ansi)
        .try_init()
        .map_err(|e| anyhow::anyhow!("cannot install the logger: {e}"))
}
