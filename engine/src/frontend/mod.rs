//! The front ends: how text reaches the serving core and comes back.
//!
//! | module | what |
//! | --- | --- |
//! | [`server`] | the OpenAI-compatible HTTP server (`minisgl serve`) |
//! | [`shell`] | the interactive chat loop (`minisgl shell`) |
//! | [`cli`] | the `minisgl` command line, one module per subcommand |
//!
//! Each stands on `crate::text` (tokenizers, chat templates, detokenization) and
//! `crate::core` (the engine); no front end imports another, except that the
//! command line starts the server and the shell.

pub mod cli;
pub mod server;
pub mod shell;
