//! Fuzzes the server-sent events parser (streams come from workers): any bytes, cut anywhere,
//! give the same events as in one piece, and never a panic.
#![no_main]

use kvroute_protocol::openai::SseParser;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Some((&cut, rest)) = data.split_first() else {
        return;
    };
    let whole = {
        let mut p = SseParser::new();
        let mut out = Vec::new();
        p.feed(rest, &mut out).and_then(|()| p.finish(&mut out)).map(|()| out)
    };
    let pieces = {
        let mut p = SseParser::new();
        let mut out = Vec::new();
        let at = usize::from(cut).min(rest.len());
        p.feed(&rest[..at], &mut out)
            .and_then(|()| p.feed(&rest[at..], &mut out))
            .and_then(|()| p.finish(&mut out))
            .map(|()| out)
    };
    assert_eq!(whole, pieces);
});
