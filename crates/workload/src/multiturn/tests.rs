//! Tests of the multi-turn workload.

use super::*;

fn answer(len: usize, tag: u32) -> Vec<u32> {
    (0..len as u32)
        .map(|i| 1_000_000 + tag * 10_000 + i)
        .collect()
}

/// Runs `n` conversations to completion, one at a time, answering each turn with a fixed
/// answer; returns every turn.
fn run(w: &mut MultiTurn, n: usize) -> Vec<TurnRequest> {
    let mut out = Vec::new();
    for _ in 0..n {
        let (id, mut req) = w.start();
        loop {
            out.push(req.clone());
            match w.follow_up(id, &answer(830, req.turn)) {
                Some(next) => req = next,
                None => break,
            }
        }
    }
    out
}

#[test]
fn defaults_are_valid_and_bad_configs_are_refused() {
    assert!(MultiTurnConfig::default().validate().is_ok());
    let bad = [
        MultiTurnConfig {
            starters: 0,
            ..Default::default()
        },
        MultiTurnConfig {
            min_turns: 6,
            ..Default::default()
        },
        MultiTurnConfig {
            min_turns: 0,
            ..Default::default()
        },
        MultiTurnConfig {
            starter_min_tokens: 5_000,
            ..Default::default()
        },
        MultiTurnConfig {
            max_tokens: 0,
            ..Default::default()
        },
        MultiTurnConfig {
            max_tokens_spread: 830,
            ..Default::default()
        },
        MultiTurnConfig {
            max_live: 0,
            ..Default::default()
        },
        MultiTurnConfig {
            starters: 1_000_000,
            ..Default::default()
        },
    ];
    for c in bad {
        assert!(
            matches!(MultiTurn::new(c.clone(), 1), Err(MultiTurnError::Config(_))),
            "{c:?}"
        );
    }
    let parsed: MultiTurnConfig = serde_json::from_str(r#"{"max_turns": 7}"#).unwrap();
    assert_eq!(parsed.max_turns, 7);
    assert_eq!(parsed.min_turns, 3);
    assert!(serde_json::from_str::<MultiTurnConfig>(r#"{"turns": 7}"#).is_err());
}

#[test]
fn built_in_starters_have_the_configured_lengths() {
    let w = MultiTurn::new(MultiTurnConfig::default(), 3).unwrap();
    assert_eq!(w.starters().len(), 10);
    for s in w.starters() {
        assert!((3_500..=4_000).contains(&s.len()), "{}", s.len());
    }
    let mut lens: Vec<usize> = w.starters().iter().map(Vec::len).collect();
    lens.dedup();
    assert!(lens.len() > 1, "starter lengths vary");
    assert_ne!(w.starters()[0][..64], w.starters()[1][..64]);
}

#[test]
fn history_grows_by_answer_and_question_and_conversations_end_in_3_to_5_turns() {
    let mut w = MultiTurn::new(MultiTurnConfig::default(), 42).unwrap();
    let turns = run(&mut w, 60);
    let mut per_conv: BTreeMap<ConversationId, Vec<&TurnRequest>> = BTreeMap::new();
    for t in &turns {
        per_conv.entry(t.conversation).or_default().push(t);
    }
    assert_eq!(per_conv.len(), 60);
    let mut counts = [0usize; 6];
    for conv in per_conv.values() {
        let n = conv.len();
        assert!((3..=5).contains(&n), "{n} turns");
        counts[n] += 1;
        assert_eq!(conv[0].turns as usize, n);
        assert!(conv.last().unwrap().is_last());
        let starter = &w.starters()[conv[0].starter];
        let first = conv[0].prompt.materialize();
        assert_eq!(first[..starter.len()], starter[..]);
        let q = first.len() - starter.len();
        assert!((20..=60).contains(&q), "question of {q} tokens");
        for pair in conv.windows(2) {
            let (a, b) = (pair[0].prompt.materialize(), pair[1].prompt.materialize());
            assert_eq!(pair[1].turn, pair[0].turn + 1);
            assert_eq!(b[..a.len()], a[..], "the whole history is resent");
            assert_eq!(b[a.len()..a.len() + 830], answer(830, pair[0].turn)[..]);
            let q = b.len() - a.len() - 830;
            assert!((20..=60).contains(&q), "question of {q} tokens");
            assert_ne!(b[a.len() + 830..], first[starter.len()..]);
        }
        assert!(conv.iter().all(|t| t.max_tokens == 830));
        assert!(conv.iter().all(|t| t.session == t.conversation.0));
    }
    assert!(
        counts[3] > 0 && counts[4] > 0 && counts[5] > 0,
        "{counts:?}"
    );
    // Every starter of the pool gets used over 60 conversations.
    let used: std::collections::BTreeSet<usize> = turns.iter().map(|t| t.starter).collect();
    assert!(used.len() >= 8, "{used:?}");
    assert_eq!(w.live(), 0, "finished conversations are dropped");
}

#[test]
fn same_seed_same_workload_different_seed_differs() {
    let a = run(
        &mut MultiTurn::new(MultiTurnConfig::default(), 9).unwrap(),
        20,
    );
    let b = run(
        &mut MultiTurn::new(MultiTurnConfig::default(), 9).unwrap(),
        20,
    );
    let c = run(
        &mut MultiTurn::new(MultiTurnConfig::default(), 10).unwrap(),
        20,
    );
    assert_eq!(a, b);
    assert_ne!(a, c);
    assert_ne!(a[0].prompt, c[0].prompt);
}

#[test]
fn conversations_do_not_depend_on_interleaving() {
    let cfg = MultiTurnConfig {
        max_tokens_spread: 100,
        ..Default::default()
    };
    // Sequential: conversation 0 to the end, then conversation 1.
    let mut seq = MultiTurn::new(cfg.clone(), 5).unwrap();
    let seq_turns = run(&mut seq, 2);
    // Interleaved: both started, then alternate.
    let mut w = MultiTurn::new(cfg, 5).unwrap();
    let (c0, r0) = w.start();
    let (c1, r1) = w.start();
    let mut got = vec![r0, r1];
    let mut open = vec![(c0, got[0].turn), (c1, got[1].turn)];
    while !open.is_empty() {
        let mut next_open = Vec::new();
        for (c, turn) in open.into_iter().rev() {
            if let Some(r) = w.follow_up(c, &answer(830, turn)) {
                next_open.push((c, r.turn));
                got.push(r);
            }
        }
        open = next_open;
    }
    got.sort_by_key(|t| (t.conversation, t.turn));
    assert_eq!(got, seq_turns);
    assert!(got.iter().any(|t| t.max_tokens != 830));
    assert!(got.iter().all(|t| (730..=930).contains(&t.max_tokens)));
}

#[test]
fn memory_is_bounded_by_max_live_and_end() {
    let cfg = MultiTurnConfig {
        max_live: 3,
        ..Default::default()
    };
    let mut w = MultiTurn::new(cfg, 1).unwrap();
    let ids: Vec<ConversationId> = (0..5).map(|_| w.start().0).collect();
    assert_eq!(w.live(), 3);
    assert_eq!(w.evicted(), 2);
    assert_eq!(w.started(), 5);
    // The two oldest were dropped.
    assert!(w.follow_up(ids[0], &[1]).is_none());
    assert!(w.follow_up(ids[4], &[1]).is_some());
    assert!(w.end(ids[3]));
    assert!(!w.end(ids[3]));
    assert!(w.follow_up(ids[3], &[1]).is_none());
    assert!(w.follow_up(ConversationId(99), &[1]).is_none());
}

#[test]
fn caller_starters_are_used_and_checked() {
    let starters = vec![vec![1, 2, 3], vec![4, 5, 6, 7]];
    let cfg = MultiTurnConfig {
        min_turns: 1,
        max_turns: 1,
        ..Default::default()
    };
    let mut w = MultiTurn::with_starters(cfg.clone(), starters.clone(), 0).unwrap();
    for _ in 0..10 {
        let (id, r) = w.start();
        assert!(r.is_last());
        let t = r.prompt.materialize();
        assert_eq!(t[..starters[r.starter].len()], starters[r.starter][..]);
        assert!(w.follow_up(id, &[9]).is_none());
    }
    assert_eq!(w.live(), 0, "one-turn conversations never stay open");
    assert_eq!(
        MultiTurn::with_starters(cfg.clone(), vec![], 0).unwrap_err(),
        MultiTurnError::NoStarters
    );
    assert_eq!(
        MultiTurn::with_starters(cfg, vec![vec![1], vec![]], 0).unwrap_err(),
        MultiTurnError::BadStarter {
            index: 1,
            tokens: 0
        }
    );
}
