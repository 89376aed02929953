//! Tests of flow control in the simulator: tenants' limits, bands, every request accounted.

use crate::sim::tests::small_chat;
use crate::{simulate, SimConfig, TenantLoad, Workload};
use kvroute_core::flow::{ClassConfig, FlowConfig, TenantConfig};
use kvroute_core::Time;
use kvroute_workload::{Status, Synthetic, SyntheticConfig, TraceRequest};

fn open_loop(rate: f64, seed: u64, secs: f64) -> Workload {
    let shape = SyntheticConfig {
        prefixes: 4,
        prefix_tokens: 32,
        suffix_tokens: 16,
        max_tokens: 8,
        ..SyntheticConfig::default()
    };
    Workload::Trace(
        Synthetic::new(shape, seed)
            .unwrap()
            .open_loop(rate)
            .unwrap()
            .take_while(|(t, _)| *t < Time::from_secs_f64(secs))
            .map(|(arrival, r)| TraceRequest {
                arrival,
                prompt: r.prompt,
                max_tokens: r.max_tokens,
            })
            .collect(),
    )
}

fn config() -> SimConfig {
    let mut cfg = SimConfig::for_profile("tiny", 2).unwrap();
    cfg.router.admission.flow = FlowConfig {
        classes: vec![
            ClassConfig {
                name: "high".into(),
                band: 1,
                ..ClassConfig::default()
            },
            ClassConfig {
                name: "low".into(),
                band: 0,
                ..ClassConfig::default()
            },
        ],
        default_class: Some("low".into()),
        tenants: vec![TenantConfig {
            name: "limited".into(),
            tokens_per_sec: Some(200.0),
            burst_tokens: Some(400),
            ..TenantConfig::default()
        }],
    };
    cfg
}

fn tenants() -> Workload {
    Workload::Tenants(vec![
        TenantLoad {
            tenant: "chat".into(),
            class: "high".into(),
            load: Workload::MultiTurn {
                gen: small_chat(3),
                concurrency: 2,
                requests: 30,
            },
        },
        TenantLoad {
            tenant: "limited".into(),
            class: "low".into(),
            load: open_loop(20.0, 5, 10.0),
        },
        TenantLoad {
            tenant: "other".into(),
            class: "nonsense".into(),
            load: open_loop(2.0, 7, 10.0),
        },
    ])
}

#[test]
fn every_tenants_requests_are_accounted_for_and_only_the_limited_one_is_refused_for_it() {
    let cfg = config();
    let r = simulate(&cfg, tenants()).unwrap();
    let names: Vec<&str> = r.tenants.iter().map(|t| t.tenant.as_str()).collect();
    assert_eq!(names, ["chat", "limited", "other"]);
    let sent: u64 = r.tenants.iter().map(|t| t.summary.sent).sum();
    assert_eq!(sent, r.summary.sent, "every request is some tenant's");
    for t in &r.tenants {
        let s = &t.summary;
        assert_eq!(
            s.sent,
            s.completed + s.failed + s.rejected,
            "{}: nothing lost",
            t.tenant
        );
        let limited = s
            .rejected_by_reason
            .get("tenant_limit")
            .copied()
            .unwrap_or(0);
        if t.tenant == "limited" {
            // 20 requests/s of ~56 tokens is ~1,100 tokens/s against a 200 tokens/s quota.
            assert!(limited > s.completed, "{t:?}");
        } else {
            assert_eq!(limited, 0, "{}", t.tenant);
        }
    }
    assert!(r
        .records
        .iter()
        .all(|rec| rec.finished.is_some() && !matches!(rec.status, Status::Failed(_))));
    // Deterministic.
    let again = simulate(&cfg, tenants()).unwrap();
    assert_eq!(
        serde_json::to_string(&r.records).unwrap(),
        serde_json::to_string(&again.records).unwrap()
    );
}

#[test]
fn a_tenants_load_names_each_tenant_once() {
    let twice = Workload::Tenants(vec![
        TenantLoad {
            tenant: "a".into(),
            class: String::new(),
            load: open_loop(1.0, 1, 1.0),
        },
        TenantLoad {
            tenant: "a".into(),
            class: String::new(),
            load: open_loop(1.0, 2, 1.0),
        },
    ]);
    let e = simulate(&config(), twice).unwrap_err().to_string();
    assert!(e.contains("two loads"), "{e}");
}

#[test]
fn classes_sum_their_tenants_requests_under_the_resolved_class() {
    let r = simulate(&config(), tenants()).unwrap();
    // `other` names no known class: its requests are the default class's (`low`), with
    // `limited`'s.
    let names: Vec<(&str, Vec<&str>)> = (r.classes.iter())
        .map(|c| {
            let t = c.tenants.iter().map(String::as_str).collect();
            (c.class.as_str(), t)
        })
        .collect();
    assert_eq!(
        names,
        [("high", vec!["chat"]), ("low", vec!["limited", "other"])]
    );
    let sent = |t: &str| {
        r.tenants
            .iter()
            .find(|x| x.tenant == t)
            .unwrap()
            .summary
            .sent
    };
    assert_eq!(r.classes[0].summary.sent, sent("chat"));
    assert_eq!(r.classes[1].summary.sent, sent("limited") + sent("other"));
}

#[test]
fn engines_scheduling_by_priority_serve_the_class_of_the_lower_value_first() {
    // Two tenants flooding engines that queue everything themselves (no admission in the
    // router): the high class's engine_priority 0, the low class's 10.
    let run = |priority_scheduling: bool| {
        let mut cfg = config();
        cfg.router.admission.mode = kvroute_core::AdmissionMode::None;
        cfg.router.admission.flow.tenants.clear();
        cfg.router.admission.flow.classes[0].engine_priority = Some(0);
        cfg.router.admission.flow.classes[1].engine_priority = Some(10);
        cfg.engine.priority_scheduling = priority_scheduling;
        let load = |tenant: &str, class: &str, seed| TenantLoad {
            tenant: tenant.into(),
            class: class.into(),
            load: open_loop(1500.0, seed, 1.0),
        };
        let r = simulate(
            &cfg,
            Workload::Tenants(vec![load("a", "high", 1), load("b", "low", 2)]),
        )
        .unwrap();
        let p50 = |i: usize| r.tenants[i].summary.ttft_ms.p50.unwrap();
        (p50(0), p50(1))
    };
    let (high, low) = run(true);
    assert!(
        high * 2.0 < low,
        "by priority: high {high} ms, low {low} ms"
    );
    let (high_fcfs, low_fcfs) = run(false);
    assert!(
        high * 2.0 < high_fcfs,
        "high {high} ms, first come first served {high_fcfs} ms"
    );
    assert!(low_fcfs < low * 2.0, "{low_fcfs} vs {low}");
}
