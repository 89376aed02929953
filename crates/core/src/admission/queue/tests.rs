//! Tests of the admission queue: budgets, order, fairness, shedding, deadlines.

use super::*;
use crate::flow::{ClassConfig, FlowConfig, TenantConfig};
use crate::types::WorkerId;
use proptest::prelude::*;

fn cfg(requests: usize, tokens: u64, wait: f64) -> AdmissionConfig {
    AdmissionConfig {
        max_queued_requests: requests,
        max_queued_tokens: tokens,
        max_queue_wait_secs: wait,
        ..AdmissionConfig::default()
    }
}

fn t(ms: u64) -> Time {
    Time::from_millis(ms)
}

fn ask(eligible: Eligible, tokens: u64) -> Ask {
    Ask {
        eligible,
        tokens,
        cost: tokens,
        ..Ask::default()
    }
}

fn push<T: std::fmt::Debug>(q: &mut AdmissionQueue<T>, c: &AdmissionConfig, a: Ask, item: T) {
    let (_, shed) = q.push(c, t(0), a, item).unwrap();
    assert!(shed.is_empty());
}

/// Flows of three classes (bands 2, 1, 0; `interactive` with a 1 s objective) and tenants
/// `a`, `b`, `c` (weights 1, 1, 2).
fn flows() -> Flows {
    let class = |name: &str, band, ttft_secs| ClassConfig {
        name: name.into(),
        band,
        ttft_secs,
        ..ClassConfig::default()
    };
    let tenant = |name: &str, weight| TenantConfig {
        name: name.into(),
        weight,
        ..TenantConfig::default()
    };
    FlowConfig {
        classes: vec![
            class("interactive", 2, Some(1.0)),
            class("standard", 1, None),
            class("batch", 0, None),
        ],
        default_class: Some("standard".into()),
        tenants: vec![tenant("a", 1.0), tenant("b", 1.0), tenant("c", 2.0)],
    }
    .compile()
}

/// Every request the pass tries, in order, letting each go.
fn order<T: Copy>(q: &mut AdmissionQueue<T>) -> Vec<T> {
    let mut out = Vec::new();
    let mut d = q.drain();
    while let Some(e) = d.next() {
        out.push(e.item);
    }
    out
}

#[test]
fn budgets_refuse_and_give_the_request_back() {
    let c = cfg(2, 100, 1.0);
    let mut q = AdmissionQueue::default();
    push(&mut q, &c, ask(Eligible::Any, 60), "a");
    assert_eq!(
        q.push(&c, t(0), ask(Eligible::Any, 41), "b").unwrap_err(),
        (RejectReason::QueueFull, "b")
    );
    push(&mut q, &c, ask(Eligible::Any, 40), "c");
    assert_eq!(
        q.push(&c, t(0), ask(Eligible::Any, 0), "d").unwrap_err(),
        (RejectReason::QueueFull, "d")
    );
    assert_eq!(
        q.state(),
        QueueState {
            requests: 2,
            tokens: 100
        }
    );
}

#[test]
fn a_pass_goes_in_order_and_stops_a_kind_at_its_first_waiter() {
    let c = cfg(10, 1_000, 1.0);
    let mut q = AdmissionQueue::default();
    let x = Eligible::Except(WorkerId(7));
    let any = Eligible::Any;
    for (name, ex) in [("a", &any), ("b", &x), ("c", &any), ("d", &x), ("e", &any)] {
        push(&mut q, &c, ask(ex.clone(), 10), name);
    }
    let mut tried = Vec::new();
    let mut d = q.drain();
    while let Some(e) = d.next() {
        tried.push(e.item);
        // `a` must wait: `c` and `e` (same kind) are not tried; `b` goes, `d` waits.
        match e.item {
            "a" | "d" => d.wait(e),
            _ => {}
        }
    }
    assert_eq!(tried, ["a", "b", "d"]);
    let left: Vec<_> = q.entries.iter().map(|e| e.item).collect();
    assert_eq!(left, ["a", "c", "d", "e"]);
    assert_eq!(q.state().tokens, 40);
    // Arrivals that could take a waiting request's worker queue behind it.
    assert!(q.holds(&any, 0) && q.holds(&x, 0) && q.holds(&Eligible::Except(WorkerId(1)), 0));
    assert!(
        q.holds(&Eligible::only([WorkerId(7)]), 0),
        "the Any waiters could use 7"
    );
    assert!(!q.holds(&any, 1), "a higher band does not wait behind them");
    let mut subset = AdmissionQueue::default();
    push(
        &mut subset,
        &c,
        ask(Eligible::only([WorkerId(2)]), 10),
        "b-only",
    );
    assert!(
        subset.holds(&any, 0),
        "an arrival for any worker waits behind a subset's"
    );
    assert!(
        !subset.holds(&Eligible::only([WorkerId(3)]), 0),
        "disjoint subsets do not"
    );
    assert!(!subset.holds(&Eligible::only([]), 0));
}

#[test]
fn deadlines_expire_at_the_configured_wait_and_removal_is_once() {
    let c = cfg(10, 1_000, 2.0);
    let mut q = AdmissionQueue::default();
    let (a, _) = q.push(&c, t(1_000), ask(Eligible::Any, 5), "a").unwrap();
    let (b, _) = q.push(&c, t(1_500), ask(Eligible::Any, 5), "b").unwrap();
    assert_eq!(q.next_deadline(), Some(t(3_000)));
    assert!(q.expire(t(2_999)).is_empty());
    let gone: Vec<_> = q.expire(t(3_000)).into_iter().map(|e| e.item).collect();
    assert_eq!(gone, ["a"]);
    assert!(q.remove(a).is_none(), "already expired");
    assert_eq!(q.remove(b).map(|e| e.item), Some("b"));
    assert!(q.remove(b).is_none());
    assert!(q.is_empty() && q.state() == QueueState::default());
}

#[test]
fn bands_go_strictly_first_and_an_objective_is_a_deadline() {
    let f = flows();
    let c = cfg(10, 1_000, 30.0);
    let mut q = AdmissionQueue::new(f.clone());
    let a = Some("a");
    for (name, class) in [("b1", "batch"), ("s1", "standard"), ("i1", "interactive")] {
        let a = Ask {
            flow: f.flow_of(a, Some(class)),
            objective: f
                .class(f.class_ix(Some(class)))
                .ttft_secs
                .map(Duration::from_secs_f64),
            ..ask(Eligible::Any, 10)
        };
        q.push(&c, t(0), a, name).unwrap();
    }
    assert_eq!(q.next_deadline(), Some(t(1_000)));
    let gone = q.expire(t(1_000));
    assert_eq!(gone.len(), 1);
    assert_eq!(
        (gone[0].item, gone[0].expiry),
        ("i1", RejectReason::Deadline)
    );
    let (_, _) = q
        .push(
            &c,
            t(0),
            Ask {
                flow: f.flow_of(a, Some("interactive")),
                ..ask(Eligible::Any, 10)
            },
            "i2",
        )
        .unwrap();
    assert_eq!(order(&mut q), ["i2", "s1", "b1"]);
}

#[test]
fn within_a_band_tenants_share_by_weight_and_a_tenant_goes_earliest_due_first() {
    let f = flows();
    let c = cfg(1_000, 1 << 30, 30.0);
    let mut q = AdmissionQueue::new(f.clone());
    // Tenant a floods first: 40 requests; b sends 10, c (weight 2) 20, later.
    for i in 0..40 {
        q.push(
            &c,
            t(i),
            Ask {
                flow: f.flow_of(Some("a"), None),
                ..ask(Eligible::Any, 100)
            },
            ('a', i),
        )
        .unwrap();
    }
    for i in 0..10 {
        q.push(
            &c,
            t(100 + i),
            Ask {
                flow: f.flow_of(Some("b"), None),
                ..ask(Eligible::Any, 100)
            },
            ('b', i),
        )
        .unwrap();
    }
    for i in 0..20 {
        q.push(
            &c,
            t(200 + i),
            Ask {
                flow: f.flow_of(Some("c"), None),
                ..ask(Eligible::Any, 100)
            },
            ('c', i),
        )
        .unwrap();
    }
    let served = order(&mut q);
    // In the first 40 served, a and b get 10 each, c (twice the weight) 20.
    let first: Vec<char> = served[..40].iter().map(|(t, _)| *t).collect();
    let count = |x| first.iter().filter(|&&t| t == x).count();
    assert_eq!(
        (count('a'), count('b'), count('c')),
        (10, 10, 20),
        "{first:?}"
    );
    // Each tenant's own requests in arrival order (equal objectives).
    for tenant in ['a', 'b', 'c'] {
        let mine: Vec<u64> = served
            .iter()
            .filter(|(t, _)| *t == tenant)
            .map(|(_, i)| *i)
            .collect();
        assert!(mine.windows(2).all(|w| w[0] < w[1]), "{tenant}: {mine:?}");
    }
    // Within a tenant, a tighter objective goes first.
    let mut q = AdmissionQueue::new(f.clone());
    let flow = f.flow_of(Some("a"), None);
    let mk = |o: u64| Ask {
        flow,
        objective: Some(Duration::from_secs(o)),
        ..ask(Eligible::Any, 1)
    };
    q.push(&c, t(0), mk(20), "late").unwrap();
    q.push(&c, t(0), mk(5), "soon").unwrap();
    assert_eq!(order(&mut q), ["soon", "late"]);
}

#[test]
fn a_full_queue_sheds_the_lowest_band_for_a_higher_one() {
    let f = flows();
    let c = cfg(3, 1_000, 30.0);
    let mut q = AdmissionQueue::new(f.clone());
    let of = |class| Ask {
        flow: f.flow_of(None, Some(class)),
        ..ask(Eligible::Any, 10)
    };
    q.push(&c, t(0), of("batch"), "b1").unwrap();
    q.push(&c, t(1), of("batch"), "b2").unwrap();
    q.push(&c, t(2), of("standard"), "s1").unwrap();
    // A batch arrival finds no room and no lower band: refused.
    assert_eq!(
        q.push(&c, t(3), of("batch"), "b3").unwrap_err().0,
        RejectReason::QueueFull
    );
    // An interactive one displaces the latest batch request.
    let (_, shed) = q.push(&c, t(4), of("interactive"), "i1").unwrap();
    assert_eq!(shed.iter().map(|e| e.item).collect::<Vec<_>>(), ["b2"]);
    let (_, shed) = q.push(&c, t(5), of("standard"), "s2").unwrap();
    assert_eq!(shed.iter().map(|e| e.item).collect::<Vec<_>>(), ["b1"]);
    // Only equal or higher bands left for a standard arrival: refused.
    assert_eq!(
        q.push(&c, t(6), of("standard"), "s3").unwrap_err().0,
        RejectReason::QueueFull
    );
    assert_eq!(q.len(), 3);
}

proptest! {
    /// Whatever arrives and whatever a pass lets go: every request is either served once,
    /// still waiting, shed or refused; bands are served strictly in order; a tenant's
    /// requests of one class go in arrival order; the token count is the waiting prompts'.
    #[test]
    fn the_queue_loses_nothing_and_keeps_its_order(
        arrivals in prop::collection::vec((0u16..4, 0usize..3, 1u64..500), 1..120),
        capacity in 1usize..60,
        lets_go in prop::collection::vec(any::<bool>(), 1..40),
    ) {
        let f = flows();
        let classes = ["interactive", "standard", "batch"];
        let tenants = ["a", "b", "c", "d"];
        let c = cfg(capacity, 20_000, 30.0);
        let mut q = AdmissionQueue::new(f.clone());
        let (mut refused, mut shed) = (0usize, 0usize);
        for (i, (tenant, class, tokens)) in arrivals.iter().enumerate() {
            let flow = f.flow_of(Some(tenants[usize::from(*tenant)]), Some(classes[*class]));
            let a = Ask { flow, ..ask(Eligible::Any, *tokens) };
            match q.push(&c, t(i as u64), a, (i, flow)) {
                Ok((_, s)) => shed += s.len(),
                Err(_) => refused += 1,
            }
        }
        let waiting_tokens: u64 = q.entries.iter().map(|e| e.tokens).sum();
        prop_assert_eq!(q.state().tokens, waiting_tokens);
        let before = q.len();
        prop_assert_eq!(before + refused + shed, arrivals.len());
        let mut served: Vec<(usize, Flow)> = Vec::new();
        let mut d = q.drain();
        let mut k = 0;
        while let Some(e) = d.next() {
            let go = lets_go[k % lets_go.len()];
            k += 1;
            if go { served.push(e.item) } else { d.wait(e); }
        }
        drop(d);
        prop_assert_eq!(served.len() + q.len(), before);
        let bands: Vec<u8> = served.iter().map(|(_, f)| f.band).collect();
        // Once one waits, the kind (all Any) is blocked: what was served came before it, in
        // band order.
        prop_assert!(bands.windows(2).all(|w| w[0] >= w[1]), "{:?}", bands);
        for flow in served.iter().map(|(_, f)| *f) {
            let ids: Vec<usize> = served.iter().filter(|(_, g)| *g == flow).map(|(i, _)| *i).collect();
            prop_assert!(ids.windows(2).all(|w| w[0] < w[1]));
        }
    }
}

#[test]
fn new_flows_keep_the_waiting_requests_and_the_tenants_state_by_name() {
    let f = flows();
    let c = cfg(10, 10_000, 30.0);
    let mut q = AdmissionQueue::new(f.clone());
    // Tenant a holds one request in flight (concurrency 1 in the new flows), and b's
    // batch request and a's standard one wait.
    let held = q.enter(f.flow_of(Some("a"), None), t(0), 10, 10).unwrap();
    for (name, tenant, class) in [("b-batch", "b", "batch"), ("a-std", "a", "standard")] {
        let a = Ask {
            flow: f.flow_of(Some(tenant), Some(class)),
            ..ask(Eligible::Any, 10)
        };
        q.push(&c, t(0), a, name).unwrap();
    }
    // Reordered tenants (a now limited to one in flight), `batch` raised above `standard`,
    // tenant c gone.
    let mut new = FlowConfig {
        classes: vec![
            ClassConfig {
                name: "batch".into(),
                band: 3,
                ..ClassConfig::default()
            },
            ClassConfig {
                name: "standard".into(),
                band: 1,
                ..ClassConfig::default()
            },
        ],
        default_class: Some("standard".into()),
        tenants: vec![
            TenantConfig {
                name: "b".into(),
                ..TenantConfig::default()
            },
            TenantConfig {
                name: "a".into(),
                max_concurrent: Some(1),
                ..TenantConfig::default()
            },
        ],
    };
    q.set_flows(new.compile());
    let nf = q.flows().clone();
    assert_eq!(nf.tenant_ix(Some("a")).0, 1);
    // a's request in flight counts against its new limit under its new index...
    let refused = q.enter(nf.flow_of(Some("a"), None), t(1), 10, 10);
    assert!(refused.is_err(), "a holds one in flight");
    // ...and, given back (a permit of the old flows), frees it.
    q.leave(held, Some(10));
    assert!(q.enter(nf.flow_of(Some("a"), None), t(2), 10, 10).is_ok());
    // The waiting ones in their classes' new bands: batch goes first now.
    assert_eq!(order(&mut q), ["b-batch", "a-std"]);
    // A flow resolved against the old flows, in the new ones.
    let of_old = f.flow_of(Some("b"), Some("batch"));
    let now = q.current(of_old, q.generation() - 1);
    assert_eq!(
        (now.tenant, now.class, now.band),
        (nf.tenant_ix(Some("b")), nf.class_ix(Some("batch")), 3)
    );
    assert_eq!(q.current(now, q.generation()), now);
    // A permit given out before more reloads than are remembered is dropped, not
    // counted against another tenant.
    let old = q.enter(nf.flow_of(Some("b"), None), t(3), 1, 1).unwrap();
    for _ in 0..=crate::flow::limits::MAX_REMAPS {
        new.tenants.reverse();
        q.set_flows(new.compile());
    }
    q.leave(old, Some(1));
}
