//! The `minisgl` command line: see `engine::frontend::cli` for the subcommands.
#![forbid(unsafe_code)]

fn main() -> std::process::ExitCode {
    engine::frontend::cli::main()
}
