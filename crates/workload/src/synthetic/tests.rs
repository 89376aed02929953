//! Tests of the synthetic shared-prefix workload.

use super::*;

fn small() -> SyntheticConfig {
    SyntheticConfig {
        prefixes: 8,
        prefix_tokens: 64,
        suffix_tokens: 16,
        zipf_s: 1.0,
        max_tokens: 32,
    }
}

#[test]
fn zipf_probabilities_follow_the_power_law() {
    let z = Zipf::new(5, 1.0).unwrap();
    let h: f64 = (1..=5).map(|k| 1.0 / k as f64).sum();
    for k in 0..5 {
        let want = 1.0 / ((k + 1) as f64 * h);
        assert!((z.probability(k) - want).abs() < 1e-12, "rank {k}");
    }
    assert_eq!(z.probability(5), 0.0);
    let total: f64 = (0..5).map(|k| z.probability(k)).sum();
    assert!((total - 1.0).abs() < 1e-12);
    let u = Zipf::new(4, 0.0).unwrap();
    assert!((0..4).all(|k| (u.probability(k) - 0.25).abs() < 1e-12));
    assert!(Zipf::new(0, 1.0).is_err());
    assert!(Zipf::new(3, -1.0).is_err());
    assert!(Zipf::new(3, f64::NAN).is_err());
}

#[test]
fn zipf_samples_match_their_probabilities() {
    let z = Zipf::new(10, 1.2).unwrap();
    let mut rng = ChaCha8Rng::seed_from_u64(7);
    let n = 200_000;
    let mut counts = [0usize; 10];
    for _ in 0..n {
        counts[z.sample(&mut rng)] += 1;
    }
    for (k, &c) in counts.iter().enumerate() {
        let p = z.probability(k);
        let sd = (n as f64 * p * (1.0 - p)).sqrt();
        let diff = (c as f64 - n as f64 * p).abs();
        assert!(diff < 5.0 * sd, "rank {k}: {c} vs {}", n as f64 * p);
    }
    assert!(counts.windows(2).all(|w| w[0] > w[1]), "{counts:?}");
}

#[test]
fn a_larger_exponent_concentrates_popularity() {
    let top_share = |s: f64| {
        let mut g = Synthetic::new(
            SyntheticConfig {
                zipf_s: s,
                ..small()
            },
            3,
        )
        .unwrap();
        (0..4_000).filter(|_| g.next_request().prefix == 0).count()
    };
    let (flat, mild, steep) = (top_share(0.0), top_share(1.0), top_share(2.0));
    assert!(flat < mild && mild < steep, "{flat} {mild} {steep}");
    // Uniform over 8 prefixes: about 500 of 4000.
    assert!((400..600).contains(&flat), "{flat}");
}

#[test]
fn requests_are_prefix_then_unique_suffix() {
    let mut g = Synthetic::new(small(), 11).unwrap();
    let reqs: Vec<SyntheticRequest> = (0..50).map(|_| g.next_request()).collect();
    for (i, r) in reqs.iter().enumerate() {
        assert_eq!(r.id, RequestId(i as u64));
        assert_eq!(r.max_tokens, 32);
        let t = r.prompt.materialize();
        assert_eq!(t.len(), 80);
        assert_eq!(&t[..64], g.prefix(r.prefix).unwrap());
    }
    let mut suffixes: Vec<Vec<u32>> = reqs
        .iter()
        .map(|r| r.prompt.materialize()[64..].to_vec())
        .collect();
    suffixes.sort();
    suffixes.dedup();
    assert_eq!(suffixes.len(), 50);
    assert_ne!(g.prefix(0), g.prefix(1));
    assert!(g.prefix(8).is_none());
}

#[test]
fn same_seed_same_requests_different_seed_differs() {
    let take = |seed| {
        let mut g = Synthetic::new(small(), seed).unwrap();
        (0..30).map(|_| g.next_request()).collect::<Vec<_>>()
    };
    assert_eq!(take(1), take(1));
    assert_ne!(take(1), take(2));
}

#[test]
fn open_loop_has_poisson_arrivals_and_the_closed_loop_requests() {
    let rate = 20.0;
    let n = 20_000;
    let timed: Vec<(Time, SyntheticRequest)> = Synthetic::new(small(), 5)
        .unwrap()
        .open_loop(rate)
        .unwrap()
        .take(n)
        .collect();
    assert!(timed.windows(2).all(|w| w[0].0 <= w[1].0));
    let gaps: Vec<f64> = timed
        .windows(2)
        .map(|w| w[1].0.as_secs_f64() - w[0].0.as_secs_f64())
        .collect();
    let mean = gaps.iter().sum::<f64>() / gaps.len() as f64;
    assert!((mean - 1.0 / rate).abs() < 0.05 / rate, "mean gap {mean}");
    // Exponential gaps: about e^-1 of them are longer than the mean.
    let longer = gaps.iter().filter(|&&g| g > 1.0 / rate).count() as f64 / gaps.len() as f64;
    assert!((longer - (-1.0f64).exp()).abs() < 0.02, "{longer}");
    let mut closed = Synthetic::new(small(), 5).unwrap();
    for (_, r) in timed.iter().take(100) {
        assert_eq!(*r, closed.next_request());
    }
    let again: Vec<Time> = Synthetic::new(small(), 5)
        .unwrap()
        .open_loop(rate)
        .unwrap()
        .take(100)
        .map(|(t, _)| t)
        .collect();
    assert!(again.iter().zip(&timed).all(|(a, (b, _))| a == b));
}

#[test]
fn configs_and_rates_are_validated() {
    assert!(SyntheticConfig::default().validate().is_ok());
    let bad = [
        SyntheticConfig {
            prefixes: 0,
            ..small()
        },
        SyntheticConfig {
            prefix_tokens: 0,
            suffix_tokens: 0,
            ..small()
        },
        SyntheticConfig {
            zipf_s: f64::NAN,
            ..small()
        },
        SyntheticConfig {
            zipf_s: -0.5,
            ..small()
        },
        SyntheticConfig {
            max_tokens: 0,
            ..small()
        },
        SyntheticConfig {
            prefixes: 1_000,
            prefix_tokens: 1_000_000,
            ..small()
        },
    ];
    for c in bad {
        assert!(
            matches!(Synthetic::new(c.clone(), 0), Err(SyntheticError::Config(_))),
            "{c:?}"
        );
    }
    for rate in [0.0, -1.0, f64::INFINITY, f64::NAN] {
        assert!(Synthetic::new(small(), 0).unwrap().open_loop(rate).is_err());
    }
}
