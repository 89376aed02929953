//! Running the `kvroute` binary from the CLI's integration tests.

use std::process::{Command, Output};

/// Runs `kvroute` with `args` and returns what it printed and how it ended.
pub fn kvroute(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_kvroute"))
        .args(args)
        .output()
        .expect("run kvroute")
}
