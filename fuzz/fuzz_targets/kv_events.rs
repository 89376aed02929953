//! Fuzzes the vLLM KV event decoder: any bytes give events or an error, never a panic.
//! `cargo +nightly fuzz run kv_events` (from the repository root).
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let _ = kvroute_protocol::kv_events::decode_payload(data);
    // The same bytes as a whole message: the first 8 as the sequence, the rest as payload.
    if data.len() >= 8 {
        let _ = kvroute_protocol::kv_events::decode_message(&[b"kv", &data[..8], &data[8..]]);
    }
});
