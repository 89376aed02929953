//! Running the `kvroute` binary from the CLI's integration tests.

use std::process::{Command, Output};

/// Runs `kvroute` with `args` and returns what it printed and how it ended.
pub fn kvroute(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_kvroute"))
        .args(args)
        .output()
        .expect("run kvroute")
}

/// Runs `kvroute` and asserts it succeeded (showing its stderr when not).
pub fn kvroute_ok(args: &[&str]) -> Output {
    let out = kvroute(args);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    out
}
