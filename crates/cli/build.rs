//! Rebuilds the binary when the web UI (`ui/dist`, embedded by `ui.rs`) is built or rebuilt.
fn main() {
    let dist = std::path::Path::new("../../ui/dist");
    if dist.exists() {
        println!("cargo:rerun-if-changed=../../ui/dist");
    } else {
        // Not built yet: watch `ui/` so that building it brings it into the binary.
        println!("cargo:rerun-if-changed=../../ui");
    }
}
