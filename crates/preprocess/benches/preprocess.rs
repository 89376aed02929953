//! Cost of turning a chat request into token ids with the shipped tokenizer: template
//! rendering and tokenizing, for a short and a long prompt.

use criterion::{BenchmarkId, Criterion};
use kvroute_preprocess::Preprocessor;

/// The allocator of the `kvroute` binary (it halves the cost of tokenizing new text).
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn messages(words: usize) -> Vec<serde_json::Value> {
    let content = "route me to the warm cache please ".repeat(words / 7 + 1);
    vec![
        serde_json::json!({"role": "system", "content": "You are a helpful assistant."}),
        serde_json::json!({"role": "user", "content": content}),
    ]
}

fn main() {
    let mut c = Criterion::default().configure_from_args();
    let pre = Preprocessor::builtin();
    bench_preprocess(&mut c, &pre);
    c.final_summary();
}

/// Rendering and encoding, of a short and a long prompt.
// A false positive of significant_drop_tightening: criterion's BenchmarkGroup is not a lock
// (its Drop only ends the group, which `finish()` does here).
#[allow(clippy::significant_drop_tightening)]
fn bench_preprocess(c: &mut Criterion, pre: &Preprocessor) {
    let mut g = c.benchmark_group("preprocess");
    for words in [30, 2000] {
        let m = messages(words);
        let text = pre.render_chat(&m, true).unwrap();
        g.bench_with_input(BenchmarkId::new("render", words), &m, |b, m| {
            b.iter(|| pre.render_chat(m, true).unwrap())
        });
        g.bench_with_input(BenchmarkId::new("encode", words), &text, |b, t| {
            b.iter(|| pre.encode(t).unwrap())
        });
        // A new user message every time (as a new conversation's first turn): the piece
        // cache cannot help with it. Rendered outside the timed part.
        let mut n = 0u64;
        g.bench_function(BenchmarkId::new("encode_new", words), |b| {
            b.iter_batched(
                || {
                    n += 1;
                    let mut m = messages(words);
                    m[1]["content"] = format!("{n} {}", m[1]["content"].as_str().unwrap()).into();
                    pre.render_chat(&m, true).unwrap()
                },
                |t| pre.encode(&t).unwrap(),
                criterion::BatchSize::SmallInput,
            )
        });
    }
    g.finish();
}
