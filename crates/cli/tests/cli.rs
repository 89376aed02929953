//! The `kvroute` binary as a user runs it.

use std::process::Command;

fn kvroute(args: &[&str]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_kvroute"))
        .args(args)
        .output()
        .expect("run kvroute")
}

#[test]
fn hash_prints_full_blocks_only() {
    let out = kvroute(&["hash", "--tokens", "1,2,3,4,5,6,7,8,9", "--block-size", "4"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["tokens"], 9);
    assert_eq!(v["local"].as_array().unwrap().len(), 2);
    assert_eq!(
        v["sequence"][0], v["local"][0],
        "the first sequence hash is the local one"
    );
    assert_ne!(v["sequence"][1], v["local"][1]);
}

#[test]
fn bad_input_is_a_clear_error() {
    let out = kvroute(&["hash", "--tokens", "1,2", "--block-size", "0"]);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("block size must be between 1"), "{err}");
    assert!(!err.contains("panicked"));
    let out = kvroute(&["hash", "--tokens", "1,x"]);
    assert_eq!(out.status.code(), Some(2), "clap usage error");
}
