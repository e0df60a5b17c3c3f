//! The `minisgl` command line.
#![forbid(unsafe_code)]

fn main() {
    eprintln!("minisgl: no subcommands yet");
    std::process::exit(2);
}
