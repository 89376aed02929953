//! The flow figures from gateway metrics texts as the `prometheus` crate writes them.

use super::*;

/// A gateway's metrics text with class `interactive`'s TTFT histogram at `counts` (for
/// `le` 0.1, 0.5, 1, +Inf) and `refused` refusals of tenant `flood`.
fn text(counts: [u64; 4], refused: u64) -> String {
    let les = ["0.1", "0.5", "1", "+Inf"];
    let mut t = String::from(
        "# HELP kvroute_class_time_to_first_token_seconds Time to first token by class.\n# TYPE kvroute_class_time_to_first_token_seconds histogram\n",
    );
    for (le, n) in les.iter().zip(counts) {
        t.push_str(&format!(
            "kvroute_class_time_to_first_token_seconds_bucket{{class=\"interactive\",le=\"{le}\"}} {n}\n"
        ));
    }
    t.push_str(&format!(
        "kvroute_class_time_to_first_token_seconds_sum{{class=\"interactive\"}} 1.5\nkvroute_class_time_to_first_token_seconds_count{{class=\"interactive\"}} {}\n",
        counts[3]
    ));
    t.push_str(&format!(
        "# TYPE kvroute_flow_refused_total counter\nkvroute_flow_refused_total{{class=\"standard\",reason=\"tenant_limit\",tenant=\"flood\"}} {refused}\nkvroute_queued_requests 0\n"
    ));
    t
}

/// `text`'s series as pool `model` of a gateway serving several models writes them.
fn pool(model: &str, counts: [u64; 4], refused: u64) -> String {
    text(counts, refused)
        .replace("{class=", &format!("{{model=\"{model}\",class="))
        .lines()
        .filter(|l| !l.starts_with('#') && !l.starts_with("kvroute_queued"))
        .map(|l| format!("{l}\n"))
        .collect()
}

#[test]
fn quantiles_interpolate_within_buckets() {
    let b = [(0.1, 0.0), (0.5, 10.0), (1.0, 20.0), (f64::INFINITY, 20.0)];
    assert_eq!(quantile(0.5, &b), Some(0.5));
    assert!((quantile(0.95, &b).unwrap() - 0.95).abs() < 1e-9);
    // Past the last finite bound: that bound.
    let b = [(0.1, 0.0), (1.0, 1.0), (f64::INFINITY, 10.0)];
    assert_eq!(quantile(0.95, &b), Some(1.0));
    assert_eq!(quantile(0.5, &[(1.0, 0.0), (f64::INFINITY, 0.0)]), None);
    assert_eq!(quantile(0.5, &[]), None);
}

#[test]
fn figures_cover_the_growth_over_the_window() {
    let t0 = Instant::now();
    let mut h = FlowHistory::default();
    let first = h.read(t0, &text([0, 4, 4, 4], 7), None);
    // The first reading has no window yet: no requests, no quantiles; the totals show.
    assert_eq!(first.classes[0].requests, 0.0);
    assert_eq!(first.classes[0].ttft_p95_ms, None);
    assert_eq!(
        first.refusals,
        [RefusalCard {
            tenant: "flood".into(),
            class: "standard".into(),
            reason: "tenant_limit".into(),
            total: 7.0,
            window: 0.0,
        }]
    );
    // Ten more requests, all between 0.5 s and 1 s; three more refusals.
    let f = h.read(
        t0 + Duration::from_secs(30),
        &text([0, 4, 14, 14], 10),
        None,
    );
    let c = &f.classes[0];
    assert_eq!((c.class.as_str(), c.requests), ("interactive", 10.0));
    assert_eq!(c.ttft_p50_ms, Some(750.0));
    assert!((c.ttft_p95_ms.unwrap() - 975.0).abs() < 1e-6);
    assert_eq!((f.refusals[0].total, f.refusals[0].window), (10.0, 3.0));
    // 70 s on, the base is the reading at 30 s: the first ten are out of the window.
    let f = h.read(
        t0 + Duration::from_secs(100),
        &text([2, 4, 14, 14], 10),
        None,
    );
    assert_eq!(f.classes[0].requests, 0.0, "{f:?}");
    assert_eq!(f.refusals[0].window, 0.0);
    // Ten minutes unread: no window until the next reading (not ten minutes as one).
    let f = h.read(
        t0 + Duration::from_secs(700),
        &text([2, 4, 40, 40], 30),
        None,
    );
    assert_eq!(
        (f.classes[0].requests, f.classes[0].ttft_p95_ms),
        (0.0, None)
    );
    assert_eq!(f.refusals[0].window, 0.0);
}

#[test]
fn a_restarted_gateway_counts_from_zero_and_garbage_is_skipped() {
    let t0 = Instant::now();
    let mut h = FlowHistory::default();
    h.read(t0, &text([0, 40, 40, 40], 50), None);
    let f = h.read(t0 + Duration::from_secs(5), &text([0, 2, 2, 2], 1), None);
    assert_eq!(f.classes[0].requests, 2.0);
    assert_eq!(f.refusals[0].window, 1.0);
    let f = h.read(
        t0 + Duration::from_secs(6),
        "kvroute_class_time_to_first_token_seconds_bucket{le=\"x\"} 1\nnot metrics at all\n\u{0}",
        None,
    );
    assert_eq!(f, FlowFigures::default());
}

#[test]
fn readings_are_bounded() {
    let t0 = Instant::now();
    let mut h = FlowHistory::default();
    for i in 0..1_000 {
        h.read(
            t0 + Duration::from_millis(10 * i),
            &text([0, 1, 1, 1], 1),
            None,
        );
    }
    assert!(h.readings.len() <= MAX_READINGS);
}

#[test]
fn several_pools_series_are_summed() {
    // A gateway serving two models: each pool's series labelled with its `model`.
    let both = format!(
        "{}{}",
        pool("a", [1, 2, 3, 4], 2),
        pool("b", [0, 1, 1, 1], 3)
    );
    let r = Reading::parse(&both, None);
    assert_eq!(
        r.ttft["interactive"],
        [(0.1, 1.0), (0.5, 3.0), (1.0, 4.0), (f64::INFINITY, 5.0)]
    );
    let key = (
        "flood".to_string(),
        "standard".to_string(),
        "tenant_limit".to_string(),
    );
    assert_eq!(r.refused[&key], 5.0);
}

#[test]
fn one_pools_series_are_read_alone() {
    let both = format!(
        "{}{}",
        pool("a", [1, 2, 3, 4], 2),
        pool("b", [0, 1, 1, 1], 3)
    );
    let r = Reading::parse(&both, Some("b"));
    assert_eq!(
        r.ttft["interactive"],
        [(0.1, 0.0), (0.5, 1.0), (1.0, 1.0), (f64::INFINITY, 1.0)]
    );
    // Another pool starts the window again: no growth against the other pool's counts.
    let mut h = FlowHistory::default();
    let t0 = Instant::now();
    h.read(t0, &both, Some("a"));
    let f = h.read(t0 + Duration::from_secs(5), &both, Some("b"));
    assert!(f.classes.iter().all(|c| c.requests == 0.0), "{f:?}");
}
