use super::*;
use proptest::prelude::*;

/// A real vLLM 0.32.0 engine's `/metrics` (`scripts/vllm/record_metrics.py`).
fn vllm_metrics() -> String {
    let path = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../cli/tests/fixtures/vllm-0.32.0-metrics.txt"
    );
    std::fs::read_to_string(path).unwrap()
}

#[test]
fn every_sample_of_a_real_vllm_text_is_read() {
    let text = vllm_metrics();
    let lines = text
        .lines()
        .filter(|l| !l.starts_with('#') && !l.trim().is_empty())
        .count();
    assert!(lines > 400, "{lines}");
    assert_eq!(samples(&text).count(), lines);
    // The cache's size in the labels of an info gauge.
    let cache = samples(&text)
        .find(|s| s.name == "vllm:cache_config_info")
        .unwrap();
    assert_eq!(cache.label("num_gpu_blocks").as_deref(), Some("2048"));
    assert_eq!(cache.label("block_size").as_deref(), Some("32"));
    assert_eq!(cache.label("engine").as_deref(), Some("0"));
    assert_eq!(cache.label("num_cpu_blocks").as_deref(), Some("None"));
    assert_eq!(
        cache.label("kv_cache_dtype_skip_layers").as_deref(),
        Some("[]")
    );
    assert_eq!(cache.labels().count(), 37);
    // Gauges with colons in their names, by name or by series.
    assert_eq!(first_value(&text, "vllm:num_requests_running"), Some(0.0));
    assert_eq!(
        series_value(
            &text,
            "vllm:num_requests_waiting{model_name=\"tiny-llama\",engine=\"0\"}"
        ),
        Some(0.0)
    );
    assert_eq!(series_value(&text, "vllm:num_requests_waiting"), None);
    // A histogram: buckets up to le="+Inf", which holds every observation.
    let name = "vllm:time_to_first_token_seconds";
    let buckets: Vec<(f64, f64)> = samples(&text)
        .filter(|s| s.name == format!("{name}_bucket"))
        .map(|s| (go_float(&s.label("le").unwrap()).unwrap(), s.value))
        .collect();
    assert!(buckets.len() > 10, "{buckets:?}");
    assert!(buckets
        .windows(2)
        .all(|w| w[0].0 < w[1].0 && w[0].1 <= w[1].1));
    assert_eq!(buckets.last().unwrap().0, f64::INFINITY);
    let count = first_value(&text, &format!("{name}_count")).unwrap();
    assert_eq!(buckets.last().unwrap().1, count);
    assert_eq!(count, 3.0);
    assert!(first_value(&text, &format!("{name}_sum")).unwrap() > 0.0);
}

#[test]
fn label_values_are_unescaped_and_may_hold_braces_and_commas() {
    let line = r#"vllm:num_requests_running{engine="0",model_name="a \"b\" }, c=\"d\\e\nf"} 3.0"#;
    let s = parse_line(line).unwrap();
    assert_eq!(s.name, "vllm:num_requests_running");
    assert_eq!(s.value, 3.0);
    assert_eq!(
        s.label("model_name").as_deref(),
        Some("a \"b\" }, c=\"d\\e\nf")
    );
    assert!(matches!(s.label("engine"), Some(Cow::Borrowed("0"))));
    assert_eq!(s.label("c"), None);
    let labels: Vec<_> = s.labels().map(|(n, _)| n).collect();
    assert_eq!(labels, ["engine", "model_name"]);
    // Blanks around the labels, a trailing comma, no labels at all.
    let s = parse_line("  x { a = \"1\" , b=\"2\", } 4 ").unwrap();
    assert_eq!((s.name, s.value), ("x", 4.0));
    assert_eq!(s.labels().count(), 2);
    assert_eq!(s.label("b").as_deref(), Some("2"));
    assert_eq!(parse_line("x{} 5").unwrap().labels().count(), 0);
}

#[test]
fn values_are_go_floats_and_a_timestamp_may_follow() {
    for (text, want) in [
        ("a 1", 1.0),
        ("a -2.5", -2.5),
        ("a 1.6e+05", 160_000.0),
        ("a +Inf", f64::INFINITY),
        ("a -Inf", f64::NEG_INFINITY),
        ("a 1 1697174393576", 1.0),
        ("a\t7\r", 7.0),
    ] {
        assert_eq!(parse_line(text).map(|s| s.value), Some(want), "{text}");
    }
    assert!(parse_line("a NaN").unwrap().value.is_nan());
    for bad in ["a", "a ", "a None", "a 1 x", "a 1 2 3", "a 1.5.5", "a 0x10"] {
        assert_eq!(parse_line(bad), None, "{bad}");
    }
}

#[test]
fn a_bad_line_costs_only_itself() {
    // Each of these made a crates.io parser refuse the whole text.
    let text = "# HELP a x\n# TYPE a gauge\na 1\n\
        vllm:cache_config_info{num_gpu_blocks=\"5\n\
        b{x=\"1\"} 2\nb{x=\"1\",y=\"2\"} 3\n\
        c{x=\"bad \\q escape\"} 4\n\
        d{1x=\"v\"} 5\n9e 6\n{x=\"1\"} 7\n\
        e{x=\"1\"y=\"2\"} 8\ne{x=1} 9\n\
        a{x=\"1\"} 10\r\nlast{cut=\"";
    let read: Vec<(&str, f64)> = samples(text).map(|s| (s.name, s.value)).collect();
    assert_eq!(read, [("a", 1.0), ("b", 2.0), ("b", 3.0), ("a", 10.0)]);
    assert_eq!(samples("").count(), 0);
    assert_eq!(samples("\n\n# EOF\n").count(), 0);
}

#[test]
fn series_are_found_by_name_and_whole_label_set() {
    let text = "a 1.5\nab 2\na{l=\"v\"} 3\nm{x=\"1\",y=\"2\"} 4\nm{x=\"1\"} 5\n";
    assert_eq!(series_value(text, "a"), Some(1.5));
    assert_eq!(series_value(text, "ab"), Some(2.0));
    assert_eq!(series_value(text, "a{l=\"v\"}"), Some(3.0));
    assert_eq!(series_value(text, "m{y=\"2\",x=\"1\"}"), Some(4.0));
    assert_eq!(series_value(text, "m{x=\"1\"}"), Some(5.0));
    assert_eq!(series_value(text, "m"), None);
    assert_eq!(series_value(text, "m{x=\"2\"}"), None);
    assert_eq!(series_value(text, "m{x=\"1\""), None);
    assert_eq!(series_value(text, "b"), None);
    // The first sample of a name, any labels; a longer name is another metric.
    assert_eq!(first_value(text, "m"), Some(4.0));
    assert_eq!(first_value(text, "a"), Some(1.5));
    assert_eq!(first_value("ab 2\n", "a"), None);
}

proptest! {
    #[test]
    fn any_line_is_read_without_panicking(line in "\\PC{0,80}") {
        if let Some(s) = parse_line(&line) {
            for (_, v) in s.labels() {
                let _ = v.len();
            }
        }
    }

    #[test]
    fn written_label_values_read_back(value in "\\PC{0,40}", n in -1e9f64..1e9) {
        let escaped = value.replace('\\', "\\\\").replace('"', "\\\"").replace('\n', "\\n");
        let line = format!("m:x{{a=\"{escaped}\",b=\"}}\"}} {n}");
        let s = parse_line(&line).unwrap();
        prop_assert_eq!(s.label("a"), Some(Cow::Borrowed(value.as_str())));
        prop_assert_eq!(s.label("b"), Some(Cow::Borrowed("}")));
        prop_assert_eq!(s.value, n);
    }
}
