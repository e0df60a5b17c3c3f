//! The `minisgl` command line: see `engine::cli` for the subcommands.
#![forbid(unsafe_code)]

fn main() -> std::process::ExitCode {
    engine::cli::main()
}
