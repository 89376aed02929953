//! Cost of turning a chat request into token ids with the shipped tokenizer: template
//! rendering and tokenizing, for a short and a long prompt.

use criterion::{BenchmarkId, Criterion};
use kvroute_preprocess::Preprocessor;

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
    }
    g.finish();
    c.final_summary();
}
