//! The reference method's defaults and the objectives every report measures.

use super::*;
use clap::Parser;
use kvroute_workload::prompt::Prompt;

#[derive(Parser)]
struct Cli {
    #[command(flatten)]
    sim: SimulateArgs,
}

/// `kvroute simulate` options parsed from `extra` (also the other tests' of `simulate`).
pub(super) fn args(extra: &[&str]) -> SimulateArgs {
    Cli::parse_from(std::iter::once("simulate").chain(extra.iter().copied())).sim
}

fn shaped(a: &SimulateArgs, load: &Load) -> (Option<f64>, f64, f64) {
    let r = a.with_reference_run().with_reference_window(load);
    (r.duration_secs, r.ramp(), r.warmup())
}

#[test]
fn a_bench_follows_the_reference_method_unless_told_otherwise() {
    // Nothing given: 60 s ramp, 120 s warm-up, measured to 420 s.
    assert_eq!(
        shaped(&args(&[]), &Load::MultiTurn),
        (Some(420.0), 60.0, 120.0)
    );
    // A shorter run keeps the proportions.
    let (d, ramp, warm) = shaped(&args(&["--duration-secs", "70"]), &Load::Synthetic);
    assert_eq!(d, Some(70.0));
    assert!((ramp - 10.0).abs() < 1e-9 && (warm - 20.0).abs() < 1e-9);
    // What is given stays.
    assert_eq!(
        shaped(
            &args(&["--ramp-secs", "0", "--warmup-secs", "5"]),
            &Load::MultiTurn
        ),
        (Some(420.0), 0.0, 5.0)
    );
    // A run ended by --limit alone has no length to take a share of.
    assert_eq!(
        shaped(&args(&["--limit", "100"]), &Load::MultiTurn),
        (None, 0.0, 0.0)
    );
    // A trace: its own schedule, measured from two sevenths of its span, at most 120 s.
    let trace = |secs: u64| {
        Load::Trace(vec![TraceRequest {
            arrival: kvroute_core::Time(std::time::Duration::from_secs(secs)),
            prompt: Prompt::Tokens(vec![1]),
            max_tokens: 1,
        }])
    };
    let a = args(&["--workload", "mooncake:t.jsonl"]);
    assert_eq!(shaped(&a, &trace(3_541)), (None, 0.0, 120.0));
    assert_eq!(shaped(&a, &trace(70)), (None, 0.0, 20.0));
    // `simulate` itself keeps zeros.
    assert_eq!((args(&[]).ramp(), args(&[]).warmup()), (0.0, 0.0));
}

#[test]
fn every_run_measures_goodput_against_the_objectives_goodput_routes_for() {
    let d = GoodputConfig::default();
    let slo = args(&[]).slo();
    assert_eq!(slo.ttft_ms, Some(d.ttft_secs * 1e3));
    assert_eq!(slo.tpot_ms, Some(d.tpot_secs * 1e3));
    let a = args(&["--slo-ttft-ms", "2000"]);
    assert_eq!(a.slo().ttft_ms, Some(2000.0));
    assert_eq!(a.slo().tpot_ms, Some(d.tpot_secs * 1e3));
    assert_eq!(a.objectives().ttft_secs, 2.0);
    let p = Profile::builtin("tiny").unwrap();
    let cfg = sim_config(&a, &p, Fleet::aggregated(2), PolicyKind::Goodput, 0).unwrap();
    assert_eq!(cfg.router.policy.goodput.ttft_secs, 2.0);
    assert_eq!(cfg.slo, Some(a.slo()));
}

#[test]
fn fleets_are_aggregated_split_or_every_split_of_the_plan() {
    let shapes = |extra: &[&str]| -> Vec<(usize, usize, usize, &'static str)> {
        fleets(&args(extra))
            .unwrap()
            .iter()
            .map(|f| (f.workers, f.prefill, f.decode, f.mode.as_str()))
            .collect()
    };
    assert_eq!(
        shapes(&["--workers", "2,4"]),
        [(2, 0, 0, "auto"), (4, 0, 0, "auto")]
    );
    assert_eq!(
        shapes(&[
            "--prefill-workers",
            "1",
            "--decode-workers",
            "2",
            "--disaggregation",
            "auto,always"
        ]),
        [(3, 1, 2, "auto"), (3, 1, 2, "always")]
    );
    assert_eq!(
        shapes(&["--plan-pd", "3"]),
        [(3, 0, 0, "auto"), (3, 1, 2, "auto"), (3, 2, 1, "auto")]
    );
    // The split's settings reach the simulator: roles, mode, the link.
    let a = args(&[
        "--prefill-workers",
        "1",
        "--decode-workers",
        "2",
        "--disaggregation",
        "always",
        "--link-gb-per-sec",
        "50",
        "--link-latency-ms",
        "1",
    ]);
    let p = Profile::builtin("h200-llama3-70b-fp8").unwrap();
    let cfg = sim_config(&a, &p, fleets(&a).unwrap()[0], PolicyKind::Goodput, 0).unwrap();
    assert_eq!(
        (cfg.workers, cfg.prefill_workers, cfg.decode_workers),
        (3, 1, 2)
    );
    let link = &cfg.router.disaggregation;
    assert_eq!(link.mode, kvroute_core::policy::DisaggregationMode::Always);
    assert_eq!(
        (link.link_bytes_per_sec, link.link_latency_secs),
        (50e9, 0.001)
    );
    // 80 layers x 8 KV heads x 128 x 2 (K and V) x 1 byte (FP8).
    assert_eq!(link.kv_bytes_per_token, 163_840.0);
}

#[test]
fn bad_fleets_are_refused_with_a_reason() {
    let err = |extra: &[&str]| match fleets(&args(extra)) {
        Ok(f) => panic!("{extra:?} accepted: {f:?}"),
        Err(e) => e.to_string(),
    };
    assert!(err(&["--plan-pd", "1"]).contains("2 to 64"));
    assert!(err(&["--prefill-workers", "0", "--decode-workers", "2"]).contains(">= 1"));
    let parse = |extra: &[&str]| {
        Cli::try_parse_from(std::iter::once("simulate").chain(extra.iter().copied())).is_err()
    };
    assert!(parse(&["--prefill-workers", "1"]), "needs --decode-workers");
    assert!(parse(&[
        "--prefill-workers",
        "1",
        "--decode-workers",
        "1",
        "--workers",
        "2"
    ]));
    assert!(parse(&["--plan-pd", "4", "--workers", "4"]));
    assert!(parse(&["--disaggregation", "sometimes"]));
    let a = args(&["--plan-pd", "2", "--link-gb-per-sec", "0"]);
    assert!(prepare(&a)
        .err()
        .unwrap()
        .to_string()
        .contains("--link-gb-per-sec"));
}

#[test]
fn the_plan_names_the_fleet_serving_the_most_goodput_at_each_load() {
    let fl = fleets(&args(&["--plan-pd", "2"])).unwrap();
    let cell =
        |f: usize, load: &str, g: Option<f64>| (fl[f], "goodput".to_string(), load.to_string(), g);
    let table = plan_table(&[
        cell(0, "c8", Some(1.5)),
        cell(1, "c8", Some(1.2)),
        cell(0, "c16", Some(2.0)),
        cell(1, "c16", Some(2.4)),
        cell(0, "c32", None),
        cell(1, "c32", None),
    ]);
    assert!(
        table.contains("| goodput | c8 | 1.500 | 1.200 | aggregated |"),
        "{table}"
    );
    assert!(
        table.contains("| goodput | c16 | 2.000 | 2.400 | 1P:1D auto |"),
        "{table}"
    );
    assert!(table.contains("| goodput | c32 | - | - | - |"), "{table}");
}
