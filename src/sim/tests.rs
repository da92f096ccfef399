//! Unit tests of the simulated node: no I/O, no clock.

use proptest::prelude::*;

use super::*;

const T0: u64 = 1_764_543_600_000_000; // µs
const MS: u64 = 1000;

fn b(s: &str) -> Vec<u8> {
    s.as_bytes().to_vec()
}

fn run(node: &mut SimNode, now: u64, req: Request) -> Reply {
    node.execute(now, &req).expect("node is up")
}

fn set(key: &str, token: &str, ttl_ms: u64) -> Request {
    Request::SetNxPxGet {
        key: b(key),
        token: b(token),
        ttl_ms,
    }
}

fn extend(keys: &[&str], token: &str, ttl_ms: u64) -> Request {
    Request::Extend {
        keys: keys.iter().map(|k| b(k)).collect(),
        token: b(token),
        ttl_ms,
    }
}

fn fenced(res: &[&str], token: &str) -> Request {
    Request::AcquireFenced {
        locks: res.iter().map(|r| b(&format!("L{r}"))).collect(),
        fences: res.iter().map(|r| b(&format!("F{r}"))).collect(),
        token: b(token),
        ttl_ms: 10_000,
    }
}

fn get(node: &mut SimNode, now: u64, key: &str) -> Reply {
    run(node, now, Request::Get(b(key)))
}

fn pttl(node: &mut SimNode, now: u64, key: &str) -> Reply {
    run(node, now, Request::Pttl(b(key)))
}

fn ints(v: &[i64]) -> Reply {
    Reply::Array(v.iter().map(|&i| Reply::Int(i)).collect())
}

/// A name-only join (as a first join: re-adds a token that is gone).
fn enqueue(waiter: &str, score: u64, wait_ms: u64) -> Request {
    join(waiter, &score.to_string(), wait_ms, b'n', true)
}

fn join(waiter: &str, ticket: &str, wait_ms: u64, kind: u8, first: bool) -> Request {
    Request::Enqueue {
        queue: b("Q"),
        leases: b("H"),
        attrs: b("A"),
        key: b("L"),
        waiter: b(waiter),
        arrival: b(ticket),
        wait_ms,
        ttl_ms: 1000,
        kind,
        first,
        inbox: Vec::new(),
    }
}

/// An enqueue reply: state, ahead, the ticket as text, holds 0, free 1 (no lock key;
/// [`with_free`] for another).
fn joined(state: i64, ahead: i64, score: u64) -> Reply {
    Reply::Array(vec![
        Reply::Int(state),
        Reply::Int(ahead),
        Reply::Bulk(score.to_string().into_bytes()),
        Reply::Int(0),
        Reply::Int(1),
    ])
}

/// One resource of a release: lock key `lock`, the queue's keys `Q`, `H`, `A`, fence `F`,
/// channel `C`, loud.
fn queued(lock: &[u8]) -> Queued {
    Queued {
        key: lock.to_vec(),
        queue: b("Q"),
        leases: b("H"),
        attrs: b("A"),
        fence: b("F"),
        channel: b("C"),
        loud: true,
    }
}

fn release_one(token: &str, waiter: &str) -> Request {
    Request::ReleaseOne {
        token: b(token),
        waiter: b(waiter),
        resources: vec![queued(b"L")],
        set: Vec::new(),
    }
}

#[test]
fn set_nx_px_get_sets_once_and_reports_the_holder() {
    let mut n = SimNode::default();
    assert_eq!(run(&mut n, T0, set("k", "A", 100)), Reply::Nil);
    assert_eq!(run(&mut n, T0, set("k", "B", 100)), Reply::Bulk(b("A")));
    assert_eq!(get(&mut n, T0, "k"), Reply::Bulk(b("A")));
    assert_eq!(
        run(&mut n, T0, set("x", "A", 0)).error_code(),
        Some("ERR"),
        "a zero TTL is refused"
    );
    run(&mut n, T0, enqueue("w", 1, 1000));
    assert_eq!(
        run(&mut n, T0, set("Q", "A", 100)).error_code(),
        Some("WRONGTYPE")
    );
}

#[test]
fn a_key_is_visible_through_its_expiry_millisecond_and_gone_after() {
    let mut n = SimNode::default();
    run(&mut n, T0, set("k", "A", 100));
    assert_eq!(pttl(&mut n, T0 + 100 * MS, "k"), Reply::Int(0));
    assert_eq!(get(&mut n, T0 + 100 * MS + 999, "k"), Reply::Bulk(b("A")));
    assert_eq!(get(&mut n, T0 + 101 * MS, "k"), Reply::Nil);
    assert_eq!(pttl(&mut n, T0 + 101 * MS, "k"), Reply::Int(-2));
}

#[test]
fn extend_only_moves_expiry_later_and_only_for_the_holder() {
    let mut n = SimNode::default();
    run(&mut n, T0, set("k", "A", 1000));
    assert_eq!(run(&mut n, T0, extend(&["k"], "A", 10)), Reply::Int(1));
    assert_eq!(
        pttl(&mut n, T0, "k"),
        Reply::Int(1000),
        "GT: never shortened"
    );
    assert_eq!(run(&mut n, T0, extend(&["k"], "A", 5000)), Reply::Int(1));
    assert_eq!(pttl(&mut n, T0, "k"), Reply::Int(5000));
    assert_eq!(run(&mut n, T0, extend(&["k"], "B", 9000)), Reply::Int(0));
    assert_eq!(
        run(&mut n, T0, extend(&["k", "m"], "A", 9000)),
        Reply::Int(0)
    );
    assert_eq!(
        pttl(&mut n, T0, "k"),
        Reply::Int(5000),
        "no partial extension"
    );
    // A key without expiry is never given one (GT treats it as infinite).
    run(
        &mut n,
        T0,
        Request::Set {
            key: b("p"),
            value: b("A"),
        },
    );
    assert_eq!(run(&mut n, T0, extend(&["p"], "A", 10)), Reply::Int(1));
    assert_eq!(pttl(&mut n, T0, "p"), Reply::Int(-1));
}

#[test]
fn acquire_takes_every_key_or_none() {
    let mut n = SimNode::default();
    run(&mut n, T0, set("b", "X", 1000));
    let acquire = Request::Acquire {
        keys: vec![b("a"), b("b")],
        token: b("A"),
        ttl_ms: 100,
    };
    assert_eq!(run(&mut n, T0, acquire.clone()), Reply::Int(0));
    assert_eq!(get(&mut n, T0, "a"), Reply::Nil);
    assert_eq!(run(&mut n, T0 + 1001 * MS, acquire), Reply::Int(1));
    assert_eq!(get(&mut n, T0 + 1001 * MS, "a"), Reply::Bulk(b("A")));
}

#[test]
fn fenced_acquire_raises_counters_to_the_clock_or_by_one() {
    let mut n = SimNode::default();
    assert_eq!(run(&mut n, T0, fenced(&["1"], "A")), ints(&[1, T0 as i64]));
    assert_eq!(
        get(&mut n, T0, "F1"),
        Reply::Bulk(T0.to_string().into_bytes())
    );
    assert_eq!(run(&mut n, T0, fenced(&["1"], "B")), ints(&[0]));
    // A counter ahead of the clock rises by one.
    let ahead = T0 + 10_000_000;
    run(
        &mut n,
        T0,
        Request::Set {
            key: b("F2"),
            value: ahead.to_string().into_bytes(),
        },
    );
    assert_eq!(
        run(&mut n, T0, fenced(&["2", "3"], "C")),
        ints(&[1, ahead as i64 + 1])
    );
    assert_eq!(
        get(&mut n, T0, "F3"),
        Reply::Bulk(T0.to_string().into_bytes())
    );
}

#[test]
fn fenced_acquire_refuses_a_counter_that_is_not_a_plain_integer_without_writing() {
    let mut n = SimNode::default();
    for bad in [
        "abc", "1.5", "-3", "nan", "1e16", " 7", "007", "", "+1", "0x1f",
    ] {
        run(
            &mut n,
            T0,
            Request::Set {
                key: b("F1"),
                value: b(bad),
            },
        );
        let r = run(&mut n, T0, fenced(&["1"], "A"));
        assert_eq!(
            r,
            Reply::Error("fence counter F1 is not an integer".into()),
            "{bad:?}"
        );
        assert_eq!(get(&mut n, T0, "L1"), Reply::Nil, "{bad:?}: no write");
    }
    for big in ["9007199254740992", "9999999999999999"] {
        run(
            &mut n,
            T0,
            Request::Set {
                key: b("F1"),
                value: b(big),
            },
        );
        let r = run(&mut n, T0, fenced(&["1"], "A"));
        assert_eq!(
            r,
            Reply::Error("fence counter F1 is not below 2^53".into()),
            "{big}"
        );
        assert_eq!(get(&mut n, T0, "L1"), Reply::Nil, "{big}: no write");
    }
    // The largest accepted counter rises by one.
    run(
        &mut n,
        T0,
        Request::Set {
            key: b("F1"),
            value: b("9007199254740991"),
        },
    );
    assert_eq!(
        run(&mut n, T0, fenced(&["1"], "A")),
        ints(&[1, 9_007_199_254_740_992])
    );
}

#[test]
fn commit_fence_only_raises_and_only_for_the_holder() {
    let mut n = SimNode::default();
    run(&mut n, T0, fenced(&["1"], "A"));
    let commit = |token: &str, t: u64| Request::CommitFence {
        locks: vec![b("L1")],
        fences: vec![b("F1")],
        token: b(token),
        t,
    };
    assert_eq!(run(&mut n, T0, commit("B", T0 + 5)), Reply::Int(0));
    assert_eq!(run(&mut n, T0, commit("A", 7)), Reply::Int(1));
    assert_eq!(
        get(&mut n, T0, "F1"),
        Reply::Bulk(T0.to_string().into_bytes())
    );
    assert_eq!(run(&mut n, T0, commit("A", T0 + 5)), Reply::Int(1));
    assert_eq!(
        get(&mut n, T0, "F1"),
        Reply::Bulk((T0 + 5).to_string().into_bytes())
    );
}

#[test]
fn release_deletes_only_our_keys_and_announces() {
    let mut n = SimNode::default();
    n.set_subscribers(b"C", 3);
    run(&mut n, T0, set("a", "token-AAAA", 1000));
    run(&mut n, T0, set("b", "other", 1000));
    let release = Request::Release {
        keys: vec![b("a"), b("b")],
        token: b("token-AAAA"),
        channels: vec![b("C"), b("D")],
    };
    assert_eq!(run(&mut n, T0, release.clone()), ints(&[1, 3]));
    assert_eq!(get(&mut n, T0, "b"), Reply::Bulk(b("other")));
    let sent = n.drain_published();
    assert_eq!(sent.len(), 2);
    assert_eq!(sent[0].payload, b("token-AA"));
    assert_eq!(run(&mut n, T0, release), ints(&[0, 0]), "nothing announced");
    assert!(n.drain_published().is_empty());
}

#[test]
fn enqueue_keeps_arrival_order_and_renews_leases() {
    let mut n = SimNode::default();
    assert_eq!(run(&mut n, T0, enqueue("w2", 3, 1000)), joined(1, 0, 3));
    assert_eq!(run(&mut n, T0, enqueue("w1", 2, 1000)), joined(1, 0, 2));
    // A renewal keeps the place and moves the lease (and both keys' expiry) later.
    assert_eq!(
        run(&mut n, T0 + 500 * MS, enqueue("w2", 9, 1000)),
        joined(0, 1, 3)
    );
    assert_eq!(pttl(&mut n, T0 + 500 * MS, "Q"), Reply::Int(1000));
    assert_eq!(pttl(&mut n, T0 + 500 * MS, "H"), Reply::Int(1000));
    // w1's lease lapsed (T0 + 1000 ms): it is purged, and joins again as new.
    let t = T0 + 1001 * MS;
    assert_eq!(run(&mut n, t, enqueue("w3", 1, 1000)), joined(1, 0, 1));
    assert_eq!(run(&mut n, t, enqueue("w1", 2, 1000)), joined(1, 1, 2));
}

/// A waiter's retired token and its fresh one share the waiter's ticket: neither is
/// ahead of the other, so the fresh token still learns that it is the queue's head.
#[test]
fn entries_with_the_same_ticket_are_not_ahead_of_each_other() {
    let mut n = SimNode::default();
    assert_eq!(run(&mut n, T0, enqueue("old", 5, 1000)), joined(1, 0, 5));
    assert_eq!(run(&mut n, T0, enqueue("new", 5, 1000)), joined(1, 0, 5));
    assert_eq!(run(&mut n, T0, enqueue("a", 4, 1000)), joined(1, 0, 4));
    assert_eq!(run(&mut n, T0, enqueue("old", 5, 1000)), joined(0, 1, 5));
    assert_eq!(run(&mut n, T0, enqueue("z", 6, 1000)), joined(1, 3, 6));
}

#[test]
fn a_first_join_arrives_at_the_nodes_clock() {
    let mut n = SimNode::default();
    let first = |w: &str| join(w, "", 1000, b'n', true);
    assert_eq!(run(&mut n, T0 + 7, first("a")), joined(1, 0, T0 + 7));
    assert_eq!(run(&mut n, T0 + 9, first("b")), joined(1, 1, T0 + 9));
    // A re-join with the score the node gave keeps the place.
    assert_eq!(
        run(&mut n, T0 + 20, enqueue("a", T0 + 7, 1000)),
        joined(0, 0, T0 + 7)
    );
    let bad = join("c", "abc", 1000, b'n', true);
    assert_eq!(run(&mut n, T0, bad).error_code(), Some("ERR"));
}

#[test]
fn release_one_names_the_first_live_waiter() {
    let mut n = SimNode::default();
    run(&mut n, T0, enqueue("late", 1, 10)); // lapses at T0 + 10 ms
    run(&mut n, T0, enqueue("w2", 3, 60_000));
    run(&mut n, T0, enqueue("w1", 2, 60_000));
    run(&mut n, T0, enqueue("me", 0, 60_000));
    let t = T0 + 20 * MS;
    run(&mut n, t, set("L", "tok", 1000));
    assert_eq!(run(&mut n, t, release_one("tok", "me")), ints(&[1, 2]));
    let sent = n.drain_published();
    assert_eq!(sent[0].payload, b("tok:w1"));
    run(&mut n, t, set("L", "tok", 1000));
    assert_eq!(run(&mut n, t, release_one("tok", "")), ints(&[1, 1]));
    assert_eq!(n.drain_published()[0].payload, b("tok:w2"));
    assert!(n.is_empty(), "an emptied queue is deleted with its leases");
    run(&mut n, t, set("L", "tok", 1000));
    assert_eq!(run(&mut n, t, release_one("tok", "")), ints(&[1, 0]));
    assert_eq!(n.drain_published()[0].payload, b("tok"));
    assert_eq!(run(&mut n, t, release_one("tok", "")), ints(&[0, 0]));
}

#[test]
fn a_zero_lease_deletes_the_queue_at_once() {
    let mut n = SimNode::default();
    // The lease lapses at `now`: PEXPIREAT to a time not after now deletes both keys,
    // so the waiter's rank is nil.
    assert_eq!(
        run(&mut n, T0, enqueue("w", 1, 0)),
        Reply::Array(vec![
            Reply::Int(1),
            Reply::Nil,
            Reply::Nil,
            Reply::Int(0),
            Reply::Int(1)
        ])
    );
    assert!(n.is_empty());
}

#[test]
fn a_crash_loses_everything_without_persistence_and_nothing_with_aof_always() {
    for (persistence, kept) in [(Persistence::None, false), (Persistence::AofAlways, true)] {
        let mut n = SimNode::new(persistence);
        run(&mut n, T0, set("k", "A", 1000));
        n.crash();
        assert_eq!(n.execute(T0, &Request::Ping), Err(NodeDown));
        n.restart();
        let want = if kept {
            Reply::Bulk(b("A"))
        } else {
            Reply::Nil
        };
        assert_eq!(get(&mut n, T0, "k"), want, "{persistence:?}");
        // The expiry is absolute: it survives as it was.
        if kept {
            assert_eq!(get(&mut n, T0 + 1001 * MS, "k"), Reply::Nil);
        }
    }
}

#[test]
fn evalsha_needs_the_script_loaded_since_the_start() {
    let mut n = SimNode::default();
    let r = extend(&["k"], "A", 10);
    assert_eq!(
        n.execute_sha(T0, &r)
            .map(|r| r.error_code().map(str::to_owned)),
        Ok(Some("NOSCRIPT".into()))
    );
    run(&mut n, T0, Request::ScriptLoad(Script::Extend));
    assert_eq!(n.execute_sha(T0, &r), Ok(Reply::Int(0)));
    n.crash();
    n.restart();
    assert_eq!(
        n.execute_sha(T0, &r)
            .map(|r| r.error_code().map(str::to_owned)),
        Ok(Some("NOSCRIPT".into()))
    );
}

#[test]
fn plain_commands_answer_like_a_contract_node() {
    let mut n = SimNode::new(Persistence::AofAlways);
    assert_eq!(run(&mut n, T0, Request::Ping), Reply::Status("PONG"));
    assert_eq!(
        run(&mut n, T0, Request::ConfigGet(b("appendfsync"))),
        Reply::Array(vec![
            Reply::Bulk(b("appendfsync")),
            Reply::Bulk(b("always"))
        ])
    );
    let Reply::Bulk(info) = run(&mut n, T0, Request::InfoReplication) else {
        panic!("INFO is a bulk string");
    };
    assert!(
        String::from_utf8_lossy(&info)
            .lines()
            .any(|l| l == "role:master")
    );
}

// ---- properties over random sequences ----

fn arb_request() -> impl Strategy<Value = Request> {
    let key = prop::sample::select(vec!["a", "b", "Q", "H"]).prop_map(b);
    let token = prop::sample::select(vec!["A", "B", "12", "x"]).prop_map(b);
    let ttl = prop_oneof![1u64..50, 1000u64..2000];
    prop_oneof![
        (key.clone(), token.clone(), ttl.clone())
            .prop_map(|(key, token, ttl_ms)| { Request::SetNxPxGet { key, token, ttl_ms } }),
        (
            prop::collection::vec(key.clone(), 1..3),
            token.clone(),
            ttl.clone()
        )
            .prop_map(|(keys, token, ttl_ms)| Request::Extend {
                keys,
                token,
                ttl_ms
            }),
        (prop::collection::vec(key.clone(), 1..3), token.clone()).prop_map(|(keys, token)| {
            Request::Release {
                keys,
                token,
                channels: vec![b("C")],
            }
        }),
        (key.clone(), token.clone()).prop_map(|(f, token)| Request::AcquireFenced {
            locks: vec![b("a")],
            fences: vec![f],
            token,
            ttl_ms: 100,
        }),
        (prop::sample::select(vec!["w0", "w1"]), 0u64..5, ttl.clone()).prop_map(
            |(w, score, wait_ms)| Request::Enqueue {
                queue: b("Q"),
                leases: b("H"),
                attrs: b("A"),
                key: b("a"),
                waiter: b(w),
                arrival: score.to_string().into_bytes(),
                wait_ms,
                ttl_ms: 100,
                kind: b't',
                first: score % 2 == 0,
                inbox: if score < 2 { b("I") } else { Vec::new() },
            }
        ),
        token.prop_map(|token| Request::ReleaseOne {
            token,
            waiter: Vec::new(),
            resources: vec![queued(b"a")],
            set: Vec::new(),
        }),
    ]
}

proptest! {
    /// Active expiry (`advance`) never changes a reply: expired keys are invisible anyway.
    #[test]
    fn active_expiry_is_invisible(steps in prop::collection::vec((arb_request(), 0u64..30_000), 1..60)) {
        let mut lazy = SimNode::default();
        let mut active = SimNode::default();
        let mut now = T0;
        for (req, dt) in steps {
            now += dt;
            active.advance(now);
            prop_assert_eq!(lazy.execute(now, &req), active.execute(now, &req));
        }
    }

    /// Another token's extend or release never changes a held key, and an extension never
    /// shortens one.
    #[test]
    fn a_holders_key_is_never_shortened_or_taken(steps in prop::collection::vec(arb_request(), 1..40)) {
        let mut n = SimNode::default();
        run(&mut n, T0, set("a", "holder", 5_000));
        for req in steps {
            let before = pttl(&mut n, T0, "a");
            let _ = n.execute(T0, &req);
            prop_assert_eq!(get(&mut n, T0, "a"), Reply::Bulk(b("holder")));
            if let (Reply::Int(x), Reply::Int(y)) = (before, pttl(&mut n, T0, "a")) {
                prop_assert!(y >= x);
            }
        }
    }

    /// Same requests, same clock: same replies and keyspace (the node is deterministic).
    #[test]
    fn replays_are_identical(steps in prop::collection::vec((arb_request(), 0u64..3_000), 1..60)) {
        let mut a = SimNode::default();
        let mut b2 = SimNode::default();
        let mut now = T0;
        for (req, dt) in steps {
            now += dt;
            prop_assert_eq!(a.execute(now, &req), b2.execute(now, &req));
        }
        prop_assert!(a.entries(now).eq(b2.entries(now)));
    }
}

/// Cost of a simulated schedule: 5 nodes, 300 requests (fenced and plain acquires,
/// extensions, releases, queue joins and hand-offs) over 3 resources, clocks drifting
/// apart. Prints schedules per second; run with
/// `cargo test --release --features sim --lib schedule_cost -- --ignored --nocapture`.
#[test]
#[ignore = "a measurement, not a check"]
fn schedule_cost() {
    let keys = ["a", "b", "c"].map(|r| (b(&format!("L{r}")), b(&format!("F{r}"))));
    let tokens = ["tok-1111", "tok-2222", "tok-3333"].map(b);
    let start = std::time::Instant::now();
    let mut schedules = 0u64;
    let mut replies = 0u64;
    while start.elapsed() < std::time::Duration::from_secs(3) {
        let mut nodes: Vec<SimNode> = (0..5).map(|_| SimNode::default()).collect();
        for step in 0..300u64 {
            let (lock, fence) = &keys[(step % 3) as usize];
            let token = &tokens[(step % 7 % 3) as usize];
            let req = match step % 6 {
                0 => Request::SetNxPxGet {
                    key: lock.clone(),
                    token: token.clone(),
                    ttl_ms: 1000,
                },
                1 => Request::AcquireFenced {
                    locks: vec![lock.clone()],
                    fences: vec![fence.clone()],
                    token: token.clone(),
                    ttl_ms: 1000,
                },
                2 => Request::Extend {
                    keys: vec![lock.clone()],
                    token: token.clone(),
                    ttl_ms: 2000,
                },
                3 => Request::Enqueue {
                    queue: b("Q"),
                    leases: b("H"),
                    attrs: b("A"),
                    key: lock.clone(),
                    waiter: token.clone(),
                    arrival: Vec::new(),
                    wait_ms: 500,
                    ttl_ms: 1000,
                    kind: b't',
                    first: true,
                    inbox: Vec::new(),
                },
                4 => release_one_of(lock, token),
                _ => Request::Release {
                    keys: vec![lock.clone()],
                    token: token.clone(),
                    channels: vec![b("C")],
                },
            };
            for (i, node) in nodes.iter_mut().enumerate() {
                // Each node's clock runs at its own rate.
                let now = T0 + step * 7_000 * (1000 + i as u64) / 1000;
                if node.execute(now, &req).is_ok() {
                    replies += 1;
                }
                node.drain_published();
            }
        }
        schedules += 1;
    }
    let secs = start.elapsed().as_secs_f64();
    println!(
        "schedule_cost: {schedules} schedules of 5 nodes x 300 requests in {secs:.2} s: {:.0} schedules/min, {:.2} M requests/s",
        schedules as f64 / secs * 60.0,
        replies as f64 / secs / 1e6
    );
}

fn release_one_of(lock: &[u8], token: &[u8]) -> Request {
    Request::ReleaseOne {
        token: token.to_vec(),
        waiter: Vec::new(),
        resources: vec![queued(lock)],
        set: Vec::new(),
    }
}

/// A release transfers the key to the head's token with its TTL and announces it; the
/// token is then gone from the queue for good (a renewal never adds it back, and reports
/// that the key holds it).
#[test]
fn release_one_transfers_to_the_head() {
    let mut n = SimNode::default();
    assert_eq!(
        run(&mut n, T0, join("w1", "5", 60_000, b't', true)),
        joined(1, 0, 5)
    );
    assert_eq!(
        run(&mut n, T0, join("w2", "7", 60_000, b't', true)),
        joined(1, 1, 7)
    );
    run(&mut n, T0, set("L", "tok", 1000));
    let t = T0 + 10 * MS;
    assert_eq!(
        run(&mut n, t, release_one("tok", "")),
        Reply::Array(vec![Reply::Int(2), Reply::Int(1), Reply::Int(0)])
    );
    assert_eq!(n.drain_published()[0].payload, b("tok:>:w1"));
    assert_eq!(get(&mut n, t, "L"), Reply::Bulk(b("w1")));
    assert_eq!(
        pttl(&mut n, t, "L"),
        Reply::Int(1000),
        "the waiter's own TTL"
    );
    // A renewal of w1 finds it gone, and the key holding it; it is not re-added.
    assert_eq!(
        run(&mut n, t, join("w1", "5", 60_000, b't', false)),
        Reply::Array(vec![
            Reply::Int(2),
            Reply::Nil,
            Reply::Nil,
            Reply::Int(1),
            Reply::Int(0)
        ])
    );
    // A first join of a token the key holds does not add it either.
    assert_eq!(
        run(&mut n, t, join("w1", "5", 60_000, b't', true)),
        Reply::Array(vec![
            Reply::Int(2),
            Reply::Nil,
            Reply::Nil,
            Reply::Int(1),
            Reply::Int(0)
        ])
    );
    // w1's release passes it on to w2; w2 is not in the queue any more.
    assert_eq!(
        run(&mut n, t, release_one("w1", "")),
        Reply::Array(vec![Reply::Int(2), Reply::Int(0), Reply::Int(0)])
    );
    assert_eq!(get(&mut n, t, "L"), Reply::Bulk(b("w2")));
    // A release that does not hold the key still removes its own entry.
    run(&mut n, t, join("w3", "9", 60_000, b't', true));
    assert_eq!(run(&mut n, t, release_one("w3", "")), ints(&[0, 0]));
    assert_eq!(run(&mut n, t, release_one("w2", "")), ints(&[1, 0]));
    assert_eq!(n.drain_published().last().unwrap().payload, b("w2"));
    assert!(n.is_empty());
}

/// A transfer to an entry that brought its own channel is announced there, not on the
/// resource's channel (only its waiter hears it); a plain release still goes to the
/// resource's channel.
#[test]
fn release_one_announces_a_transfer_on_the_entrys_channel() {
    let mut n = SimNode::default();
    let mut with_inbox = join("w1", "5", 60_000, b't', true);
    if let Request::Enqueue { inbox, .. } = &mut with_inbox {
        *inbox = b("quorumlock:inbox:x:y");
    }
    run(&mut n, T0, with_inbox);
    let attr = n.entries(T0).find_map(|(k, v, _)| match v {
        Value::Hash(h) if k == b"A" => h.iter().find(|(f, _)| f == b"w1").map(|(_, v)| v.clone()),
        _ => None,
    });
    assert_eq!(attr, Some(b("1000:t:quorumlock:inbox:x:y")));
    run(&mut n, T0, set("L", "tok", 1000));
    assert_eq!(
        run(&mut n, T0, release_one("tok", "")),
        Reply::Array(vec![Reply::Int(2), Reply::Int(0), Reply::Int(0)])
    );
    let sent = n.drain_published();
    assert_eq!(sent.len(), 1);
    assert_eq!(sent[0].channel, b("quorumlock:inbox:x:y"));
    assert_eq!(sent[0].payload, b("tok:>:w1"));
    assert_eq!(run(&mut n, T0, release_one("w1", "")), ints(&[1, 0]));
    let sent = n.drain_published();
    assert_eq!(sent[0].channel, b("C"));
    assert_eq!(sent[0].payload, b("w1"));
}

/// A fenced transfer raises the counter as a fenced grant does and announces the value;
/// a bad counter names the waiter instead (the key is deleted, nothing transferred).
#[test]
fn release_one_fenced_transfer() {
    let mut n = SimNode::default();
    run(&mut n, T0, join("w1", "1", 60_000, b'f', true));
    run(&mut n, T0, set("L", "tok", 1000));
    run(
        &mut n,
        T0,
        Request::Set {
            key: b("F"),
            value: (T0 + 5).to_string().into_bytes(),
        },
    );
    let r = run(&mut n, T0, release_one("tok", ""));
    assert_eq!(
        r,
        Reply::Array(vec![
            Reply::Int(2),
            Reply::Int(0),
            Reply::Int((T0 + 6) as i64)
        ])
    );
    assert_eq!(
        n.drain_published()[0].payload,
        format!("tok:>:w1:{}", T0 + 6).into_bytes()
    );
    assert_eq!(
        get(&mut n, T0, "F"),
        Reply::Bulk((T0 + 6).to_string().into_bytes())
    );
    // The clock floor.
    run(&mut n, T0, join("w2", "2", 60_000, b'f', true));
    let later = T0 + 1_000_000;
    let r = run(&mut n, later, release_one("w1", ""));
    assert_eq!(
        r,
        Reply::Array(vec![Reply::Int(2), Reply::Int(0), Reply::Int(later as i64)])
    );
    // A bad counter: the head is named, the key deleted.
    run(&mut n, later, join("w3", "3", 60_000, b'f', true));
    run(
        &mut n,
        later,
        Request::Set {
            key: b("F"),
            value: b("1e16"),
        },
    );
    n.drain_published();
    assert_eq!(run(&mut n, later, release_one("w2", "")), ints(&[1, 1]));
    assert_eq!(n.drain_published()[0].payload, b("w2:w3"));
    assert_eq!(get(&mut n, later, "L"), Reply::Nil);
}

/// A quiet release (not a herald) transfers but neither names a name-only head nor
/// announces a plain release; a claim counts a key holding our token as granted.
#[test]
fn quiet_release_and_claim() {
    let mut n = SimNode::default();
    run(&mut n, T0, join("w1", "1", 60_000, b'n', true));
    run(&mut n, T0, set("L", "tok", 1000));
    let mut quiet = release_one("tok", "");
    if let Request::ReleaseOne { resources, .. } = &mut quiet {
        resources[0].loud = false;
    }
    assert_eq!(run(&mut n, T0, quiet), ints(&[1, 1]));
    assert!(n.drain_published().is_empty());
    let claim = |tok: &str| Request::Claim {
        key: b("L"),
        token: b(tok),
        ttl_ms: 500,
    };
    assert_eq!(run(&mut n, T0, claim("a")), Reply::Nil);
    assert_eq!(run(&mut n, T0, claim("b")), Reply::Bulk(b("a")));
    assert_eq!(run(&mut n, T0 + 100 * MS, claim("a")), Reply::Nil);
    assert_eq!(pttl(&mut n, T0 + 100 * MS, "L"), Reply::Int(500));
}

/// A multi-resource waiter's join of the queues of `names` (lock key `L<name>`, queue
/// `Q<name>`, leases `H<name>`, attributes `A<name>`), set key `S<waiter>`.
fn join_many(waiter: &str, names: &[&str], ticket: &str, first: bool) -> Request {
    Request::EnqueueMany {
        queues: names
            .iter()
            .map(|n| {
                [
                    b(&format!("Q{n}")),
                    b(&format!("H{n}")),
                    b(&format!("A{n}")),
                    b(&format!("L{n}")),
                ]
            })
            .collect(),
        set: b(&format!("S{waiter}")),
        waiter: b(waiter),
        arrival: b(ticket),
        wait_ms: 60_000,
        ttl_ms: 500,
        first,
        inbox: b("I"),
    }
}

/// A join's reply with its fifth element, free, set: 1 when no lock key (of the set) is
/// held.
fn with_free(reply: Reply, free: bool) -> Reply {
    match reply {
        Reply::Array(mut a) => {
            a.truncate(4);
            a.push(Reply::Int(i64::from(free)));
            Reply::Array(a)
        }
        other => other,
    }
}

/// The release of `names` (keys as in [`join_many`]) by `token`, loud.
fn release_many(token: &str, names: &[&str]) -> Request {
    Request::ReleaseOne {
        token: b(token),
        waiter: Vec::new(),
        resources: names
            .iter()
            .map(|n| Queued {
                key: b(&format!("L{n}")),
                queue: b(&format!("Q{n}")),
                leases: b(&format!("H{n}")),
                attrs: b(&format!("A{n}")),
                fence: b(&format!("F{n}")),
                channel: b(&format!("C{n}")),
                loud: true,
            })
            .collect(),
        set: b(&format!("S{token}")),
    }
}

/// A multi-resource entry gets every key of its set at once or none: a release of one of
/// its keys while another is held leaves it at the head and hands the key to the first
/// waiter behind it that can be served now (a single-resource transfer entry); with none,
/// a plain release. The release of the last one hands it both keys, pops it from both
/// queues and announces the transfer on its channel only.
#[test]
fn a_multi_resource_entry_gets_every_key_or_none() {
    let mut n = SimNode::default();
    run(&mut n, T0, set("La", "ha", 10_000));
    run(&mut n, T0, set("Lb", "hb", 10_000));
    assert_eq!(
        run(&mut n, T0, join_many("m", &["a", "b"], "5", true)),
        with_free(joined(1, 0, 5), false)
    );
    // A single waiter on `a` behind it.
    let behind = Request::Enqueue {
        queue: b("Qa"),
        leases: b("Ha"),
        attrs: b("Aa"),
        key: b("La"),
        waiter: b("s"),
        arrival: b("9"),
        wait_ms: 60_000,
        ttl_ms: 500,
        kind: b't',
        first: true,
        inbox: b("I2"),
    };
    // The entry ahead of it is blocked (its keys are held by others): not counted ahead.
    assert_eq!(run(&mut n, T0, behind), with_free(joined(1, 0, 9), false));
    // `a` is released while `b` is held: the entry stays at the head, the single waiter
    // behind it gets `a`.
    assert_eq!(
        run(&mut n, T0, release_many("ha", &["a"])),
        ints(&[2, 1, 0])
    );
    assert_eq!(get(&mut n, T0, "La"), Reply::Bulk(b("s")));
    let sent = n.drain_published();
    assert_eq!(sent.len(), 1);
    assert_eq!(
        (sent[0].channel.as_slice(), sent[0].payload.as_slice()),
        (&b"I2"[..], &b"ha:>:s"[..])
    );
    // Its release: `b` still held and no one else waits for `a`: a plain release.
    assert_eq!(run(&mut n, T0, release_many("s", &["a"])), ints(&[1, 1]));
    assert_eq!(get(&mut n, T0, "La"), Reply::Nil);
    let sent = n.drain_published();
    assert_eq!(
        (sent[0].channel.as_slice(), sent[0].payload.as_slice()),
        (&b"Ca"[..], &b"s"[..])
    );
    // `b` is released: both keys are the entry's, announced on its channel.
    assert_eq!(
        run(&mut n, T0, release_many("hb", &["b"])),
        ints(&[2, 0, 0])
    );
    assert_eq!(get(&mut n, T0, "La"), Reply::Bulk(b("m")));
    assert_eq!(get(&mut n, T0, "Lb"), Reply::Bulk(b("m")));
    assert_eq!(pttl(&mut n, T0, "La"), Reply::Int(500));
    let sent = n.drain_published();
    assert_eq!(sent.len(), 1);
    assert_eq!(
        (sent[0].channel.as_slice(), sent[0].payload.as_slice()),
        (&b"I"[..], &b"hb:>:m"[..])
    );
    // Gone from both queues; its renewal says so, and that both keys hold it.
    assert_eq!(
        run(&mut n, T0, join_many("m", &["a", "b"], "5", false)),
        Reply::Array(vec![
            Reply::Int(2),
            Reply::Nil,
            Reply::Nil,
            Reply::Int(1),
            Reply::Int(0)
        ])
    );
    // Its release deletes both keys, and its set key (gone already, with the hand-over).
    assert_eq!(
        run(&mut n, T0, release_many("m", &["a", "b"])),
        ints(&[2, 0])
    );
    assert_eq!(get(&mut n, T0, "La"), Reply::Nil);
    assert_eq!(get(&mut n, T0, "Lb"), Reply::Nil);
}

/// A join counts a multi-resource entry ahead of it only while that entry can be served
/// (no key of its set held by another token).
#[test]
fn a_blocked_multi_resource_entry_is_not_ahead() {
    let mut n = SimNode::default();
    run(&mut n, T0, join_many("m", &["a", "b"], "5", true));
    let single = |first: bool| Request::Enqueue {
        queue: b("Qa"),
        leases: b("Ha"),
        attrs: b("Aa"),
        key: b("La"),
        waiter: b("s"),
        arrival: b("9"),
        wait_ms: 60_000,
        ttl_ms: 500,
        kind: b't',
        first,
        inbox: Vec::new(),
    };
    assert_eq!(
        run(&mut n, T0, single(true)),
        joined(1, 1, 9),
        "free: ahead"
    );
    // Its key in this queue held (by the holder whose release will serve it): still ahead.
    run(&mut n, T0, set("La", "holder", 10_000));
    assert_eq!(
        run(&mut n, T0, single(false)),
        with_free(joined(0, 1, 9), false),
        "own key: ahead"
    );
    run(&mut n, T0, set("Lb", "other", 10_000));
    assert_eq!(
        run(&mut n, T0, single(false)),
        with_free(joined(0, 0, 9), false),
        "blocked: not ahead"
    );
    run(
        &mut n,
        T0,
        Request::Set {
            key: b("Lb"),
            value: b("m"),
        },
    );
    assert_eq!(
        run(&mut n, T0, single(false)),
        with_free(joined(0, 1, 9), false),
        "a key holding its own token does not block it"
    );
}

/// A multi-resource waiter behind a blocked one is served when it can be: it heads its
/// other queue, and only the blocked entry is ahead of it here. Its release deletes its set
/// key.
#[test]
fn a_multi_resource_entry_behind_a_blocked_one_is_served() {
    let mut n = SimNode::default();
    run(&mut n, T0, set("La", "ha", 10_000));
    run(&mut n, T0, set("Lb", "hb", 10_000));
    run(&mut n, T0, join_many("m", &["a", "b"], "5", true));
    assert_eq!(
        run(&mut n, T0, join_many("y", &["a", "c"], "7", true)),
        with_free(joined(1, 0, 7), false)
    );
    assert_eq!(
        run(&mut n, T0, release_many("ha", &["a"])),
        ints(&[2, 1, 0])
    );
    assert_eq!(get(&mut n, T0, "La"), Reply::Bulk(b("y")));
    assert_eq!(get(&mut n, T0, "Lc"), Reply::Bulk(b("y")));
    assert_eq!(
        get(&mut n, T0, "Sy"),
        Reply::Nil,
        "handed over: its set key goes"
    );
    assert_ne!(get(&mut n, T0, "Sm"), Reply::Nil, "still waiting");
    // A set key left behind (a waiter that left) goes with its token's release.
    run(&mut n, T0, join_many("z", &["d", "e"], "9", true));
    assert_ne!(get(&mut n, T0, "Sz"), Reply::Nil);
    run(&mut n, T0, release_many("z", &["d", "e"]));
    assert_eq!(get(&mut n, T0, "Sz"), Reply::Nil);
}

/// The release of several keys counts its own keys as free: a multi-resource entry whose
/// set is exactly the released keys gets them all in the same script.
#[test]
fn a_release_of_several_keys_hands_them_all_to_a_multi_resource_entry() {
    let mut n = SimNode::default();
    let many = Request::Acquire {
        keys: vec![b("La"), b("Lb")],
        token: b("h"),
        ttl_ms: 10_000,
    };
    assert_eq!(run(&mut n, T0, many), Reply::Int(1));
    run(&mut n, T0, join_many("m", &["a", "b"], "5", true));
    // (`b` was handed over with `a`: only `a`'s release found our token.)
    assert_eq!(
        run(&mut n, T0, release_many("h", &["a", "b"])),
        ints(&[1, 0])
    );
    assert_eq!(get(&mut n, T0, "La"), Reply::Bulk(b("m")));
    assert_eq!(get(&mut n, T0, "Lb"), Reply::Bulk(b("m")));
    let sent = n.drain_published();
    assert_eq!(sent.len(), 1, "one transfer, no plain release");
}

/// A renewal that finds the token missing from one of its queues (a lapse or a pop seen
/// there first) drops it from all of them: a token is queued on all of its set or none. A
/// first join is refused when any key already holds the token.
#[test]
fn a_multi_resource_token_is_queued_on_all_of_its_set_or_none() {
    let mut n = SimNode::default();
    run(&mut n, T0, join_many("m", &["a", "b"], "5", true));
    // Pop it from `b` only, as a stray removal would.
    let drop_b = Request::ReleaseOne {
        token: b("m"),
        waiter: Vec::new(),
        resources: vec![Queued {
            key: b("Lb"),
            queue: b("Qb"),
            leases: b("Hb"),
            attrs: b("Ab"),
            fence: b("Fb"),
            channel: b("Cb"),
            loud: false,
        }],
        set: Vec::new(),
    };
    run(&mut n, T0, drop_b);
    assert_eq!(
        run(&mut n, T0, join_many("m", &["a", "b"], "5", false)),
        Reply::Array(vec![
            Reply::Int(2),
            Reply::Nil,
            Reply::Nil,
            Reply::Int(0),
            Reply::Int(1)
        ])
    );
    assert_eq!(
        get(&mut n, T0, "Sm"),
        Reply::Nil,
        "the set key goes with it"
    );
    assert_eq!(run(&mut n, T0, Request::Pttl(b("Qa"))), Reply::Int(-2));
    // A key holding the token: never added.
    let own = Request::Set {
        key: b("Lc"),
        value: b("m2"),
    };
    run(&mut n, T0, own);
    assert_eq!(
        run(&mut n, T0, join_many("m2", &["c", "d"], "", true)),
        Reply::Array(vec![
            Reply::Int(2),
            Reply::Nil,
            Reply::Nil,
            Reply::Int(0),
            Reply::Int(0)
        ])
    );
}
