//! Fuzzes TensorRT-LLM's HTTP KV event decoder and the puller behind it: any bytes give
//! events or an error, never a panic. `cargo +nightly fuzz run trtllm_http` (from the
//! repository root).
#![no_main]

use kvroute_protocol::kv_events::trtllm_http::{decode, Puller};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Ok(events) = decode(data) {
        let mut puller = Puller::new(4);
        // Twice: the second answer meets the state the first one left.
        puller.accept(events.clone());
        puller.accept(events);
    }
});
