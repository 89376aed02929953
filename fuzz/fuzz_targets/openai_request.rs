//! Fuzzes the OpenAI request reader (bodies come from any client): it must return a view or
//! an error with a 4xx status, never panic.
#![no_main]

use kvroute_protocol::openai::{parse_request, Endpoint};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    for endpoint in [Endpoint::Chat, Endpoint::Completions] {
        if let Err(e) = parse_request(endpoint, data, 4096) {
            assert!((400..500).contains(&e.status()));
        }
    }
});
