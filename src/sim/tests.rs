//! Unit tests of the simulated node: the command model, the Lua runtime's conversions, and
//! the crate's own scripts run through both with keys and arguments from the crate's own
//! request builders. No I/O, no clock.

use std::time::Duration;

use proptest::prelude::*;

use super::net::{translate, translate_join};
use super::node::{Persistence, Reply, Request, Script, SimNode, Value, scripts};
use crate::base::resource::Resources;
use crate::base::token::Token;
use crate::io::node::{self, EntryKind, JoinArgs, QueueJoin};

const T0: u64 = 1_764_543_600_000_000;

fn cmd(node: &mut SimNode, now: u64, words: &[&str]) -> Reply {
    node.execute(now, &Request::command(words))
        .expect("node up")
}

fn bulk(s: &str) -> Reply {
    Reply::Bulk(s.as_bytes().to_vec())
}

/// A node running one extra script, `t`, with `source` (for the runtime's conversions).
fn with_test_script(source: &str) -> SimNode {
    let extra = scripts()
        .into_iter()
        .find(|s| s.name() == "extend")
        .and_then(|s| s.replaced(s.source(), source))
        .expect("a script to replace");
    SimNode::with_scripts(Persistence::None, vec![extra].into())
}

fn eval(node: &mut SimNode, keys: &[&str], args: &[&str]) -> Reply {
    node.execute(T0, &Request::eval("extend", keys, args))
        .expect("node up")
}

/// Runs a request built by the crate's node layer, as the simulated client sends it.
fn send(node: &mut SimNode, now: u64, req: &node::Request) -> Reply {
    let t = translate(req).expect("a modelled request");
    node.execute(now, &t.req).expect("node up")
}

// ---- the command model ----

#[test]
fn set_options_follow_redis() {
    let mut n = SimNode::default();
    assert_eq!(
        cmd(&mut n, T0, &["SET", "k", "a", "NX", "PX", "100", "GET"]),
        Reply::Nil
    );
    assert_eq!(
        cmd(&mut n, T0, &["SET", "k", "b", "NX", "PX", "100", "GET"]),
        bulk("a")
    );
    assert_eq!(cmd(&mut n, T0, &["SET", "k", "b", "NX"]), Reply::Nil);
    assert_eq!(cmd(&mut n, T0, &["SET", "j", "b", "XX"]), Reply::Nil);
    assert_eq!(
        cmd(&mut n, T0, &["SET", "k", "c", "PX", "0"]),
        Reply::Error("ERR invalid expire time in 'set' command".into())
    );
    assert_eq!(
        cmd(&mut n, T0, &["SET", "k", "c", "NX", "XX"]),
        Reply::Error("ERR syntax error".into())
    );
    assert_eq!(
        cmd(&mut n, T0, &["SET", "k", "c", "PX", "x"]),
        Reply::Error("ERR value is not an integer or out of range".into())
    );
    assert_eq!(
        cmd(&mut n, T0, &["GET"]),
        Reply::Error("ERR wrong number of arguments for 'get' command".into())
    );
    assert_eq!(cmd(&mut n, T0, &["PTTL", "k"]), Reply::Int(100));
    assert_eq!(
        cmd(&mut n, T0, &["SET", "k", "d", "KEEPTTL"]),
        Reply::Status("OK".into())
    );
    assert_eq!(cmd(&mut n, T0, &["PTTL", "k"]), Reply::Int(100));
}

#[test]
fn a_key_is_visible_through_its_expiry_millisecond_and_gone_after() {
    let mut n = SimNode::default();
    cmd(&mut n, T0, &["SET", "k", "v", "PX", "5"]);
    assert_eq!(cmd(&mut n, T0 + 5_999, &["GET", "k"]), bulk("v"));
    assert_eq!(cmd(&mut n, T0 + 6_000, &["GET", "k"]), Reply::Nil);
    assert_eq!(cmd(&mut n, T0 + 6_000, &["PTTL", "k"]), Reply::Int(-2));
}

#[test]
fn wrong_types_are_refused_with_redis_text() {
    let mut n = SimNode::default();
    cmd(&mut n, T0, &["ZADD", "z", "1", "m"]);
    cmd(&mut n, T0, &["HSET", "h", "f", "v"]);
    let wrong =
        Reply::Error("WRONGTYPE Operation against a key holding the wrong kind of value".into());
    assert_eq!(cmd(&mut n, T0, &["GET", "z"]), wrong);
    assert_eq!(cmd(&mut n, T0, &["INCR", "h"]), wrong);
    assert_eq!(cmd(&mut n, T0, &["ZCARD", "h"]), wrong);
    assert_eq!(cmd(&mut n, T0, &["HGET", "z", "f"]), wrong);
    assert_eq!(
        cmd(&mut n, T0, &["TYPE", "z"]),
        Reply::Status("zset".into())
    );
    assert_eq!(
        cmd(&mut n, T0, &["TYPE", "nope"]),
        Reply::Status("none".into())
    );
    // SET replaces any type.
    assert_eq!(
        cmd(&mut n, T0, &["SET", "z", "s"]),
        Reply::Status("OK".into())
    );
}

#[test]
fn pexpire_gt_only_moves_expiry_later() {
    let mut n = SimNode::default();
    cmd(&mut n, T0, &["SET", "k", "v", "PX", "100"]);
    assert_eq!(
        cmd(&mut n, T0, &["PEXPIRE", "k", "50", "GT"]),
        Reply::Int(0)
    );
    assert_eq!(
        cmd(&mut n, T0, &["PEXPIRE", "k", "500", "GT"]),
        Reply::Int(1)
    );
    assert_eq!(cmd(&mut n, T0, &["PTTL", "k"]), Reply::Int(500));
    cmd(&mut n, T0, &["SET", "p", "v"]);
    // A key without expiry counts as infinite for GT.
    assert_eq!(cmd(&mut n, T0, &["PEXPIRE", "p", "5", "GT"]), Reply::Int(0));
    assert_eq!(
        cmd(&mut n, T0, &["PEXPIREAT", "k", "1"]),
        Reply::Int(1),
        "a time in the past deletes"
    );
    assert_eq!(cmd(&mut n, T0, &["EXISTS", "k"]), Reply::Int(0));
}

#[test]
fn sorted_sets_keep_redis_order_and_vanish_when_empty() {
    let mut n = SimNode::default();
    assert_eq!(
        cmd(&mut n, T0, &["ZADD", "z", "2", "b", "1", "c", "2", "a"]),
        Reply::Int(3)
    );
    assert_eq!(
        cmd(&mut n, T0, &["ZADD", "z", "NX", "9", "a"]),
        Reply::Int(0)
    );
    assert_eq!(
        cmd(&mut n, T0, &["ZRANGE", "z", "0", "-1"]),
        Reply::Array(vec![bulk("c"), bulk("a"), bulk("b")])
    );
    assert_eq!(
        cmd(&mut n, T0, &["ZRANGE", "z", "-1", "-1", "WITHSCORES"]),
        Reply::Array(vec![bulk("b"), bulk("2")])
    );
    assert_eq!(
        cmd(&mut n, T0, &["ZCOUNT", "z", "(1", "+inf"]),
        Reply::Int(2)
    );
    assert_eq!(
        cmd(
            &mut n,
            T0,
            &["ZRANGEBYSCORE", "z", "-inf", "2", "LIMIT", "1", "1"]
        ),
        Reply::Array(vec![bulk("a")])
    );
    assert_eq!(cmd(&mut n, T0, &["ZSCORE", "z", "c"]), bulk("1"));
    assert_eq!(
        cmd(&mut n, T0, &["ZADD", "z", "1.5x", "d"]).error_code(),
        Some("ERR")
    );
    assert_eq!(
        cmd(&mut n, T0, &["ZREMRANGEBYSCORE", "z", "-inf", "2"]),
        Reply::Int(3)
    );
    assert_eq!(cmd(&mut n, T0, &["EXISTS", "z"]), Reply::Int(0));
}

#[test]
fn time_answers_the_nodes_clock() {
    let mut n = SimNode::default();
    assert_eq!(
        cmd(&mut n, 1_700_000_000_123_456, &["TIME"]),
        Reply::Array(vec![bulk("1700000000"), bulk("123456")])
    );
}

// ---- the Lua runtime ----

#[test]
fn numbers_reach_commands_as_percent_17g_and_reply_truncated() {
    let mut n = with_test_script(
        "redis.call('SET', KEYS[1], 101796506964029 + 0.5 - 0.5)\n\
         return {redis.call('GET', KEYS[1]), 3.99, -2.5}",
    );
    assert_eq!(
        eval(&mut n, &["k"], &[]),
        Reply::Array(vec![bulk("101796506964029"), Reply::Int(3), Reply::Int(-2)])
    );
}

#[test]
fn lua_values_convert_as_redis_converts_them() {
    let mut n = with_test_script("return {1, false, 'x', nil, 5}");
    assert_eq!(
        eval(&mut n, &[], &[]),
        Reply::Array(vec![Reply::Int(1), Reply::Nil, bulk("x")]),
        "an array stops at its first nil"
    );
    let mut n = with_test_script("return true");
    assert_eq!(eval(&mut n, &[], &[]), Reply::Int(1));
    let mut n = with_test_script("return redis.status_reply('FINE')");
    assert_eq!(eval(&mut n, &[], &[]), Reply::Status("FINE".into()));
    let mut n = with_test_script("return redis.error_reply('PERMITS 3:x')");
    assert_eq!(eval(&mut n, &[], &[]), Reply::Error("PERMITS 3:x".into()));
    let mut n = with_test_script("return redis.call('GET', 'missing')");
    assert_eq!(eval(&mut n, &[], &[]), Reply::Nil);
    let mut n = with_test_script("return redis.call('SET', 'k', 'v')");
    assert_eq!(eval(&mut n, &[], &[]), Reply::Status("OK".into()));
}

#[test]
fn a_failing_call_ends_the_script_and_keeps_its_writes() {
    let mut n = with_test_script(
        "redis.call('SET', 'a', '1')\n\
         redis.call('ZADD', 'a', 1, 'm')\n\
         redis.call('SET', 'b', '1')",
    );
    let r = eval(&mut n, &[], &[]);
    assert_eq!(r.error_code(), Some("WRONGTYPE"), "{r:?}");
    let Reply::Error(text) = &r else {
        panic!("{r:?}")
    };
    assert!(text.ends_with(", on @user_script:2."), "{text}");
    assert_eq!(cmd(&mut n, T0, &["GET", "a"]), bulk("1"));
    assert_eq!(cmd(&mut n, T0, &["EXISTS", "b"]), Reply::Int(0));
}

#[test]
fn pcall_returns_the_error_as_a_table() {
    let mut n = with_test_script(
        "redis.call('SET', 'a', '1')\n\
         local r = redis.pcall('INCR', 'a', 'b')\n\
         local s = redis.pcall('ZCARD', 'a')\n\
         return {r.err, s.err}",
    );
    assert_eq!(
        eval(&mut n, &[], &[]),
        Reply::Array(vec![
            bulk("ERR Wrong number of args calling Redis command from script"),
            bulk("WRONGTYPE Operation against a key holding the wrong kind of value"),
        ])
    );
}

#[test]
fn scripts_cannot_read_or_create_globals_and_bad_arguments_fail() {
    let mut n = with_test_script("return undefined_thing");
    let r = eval(&mut n, &[], &[]);
    assert!(
        matches!(&r, Reply::Error(e) if e.contains("nonexistent global variable 'undefined_thing'")),
        "{r:?}"
    );
    let mut n = with_test_script("x = 1");
    assert_eq!(eval(&mut n, &[], &[]).error_code(), Some("ERR"));
    let mut n = with_test_script("return redis.call('GET', {})");
    let r = eval(&mut n, &[], &[]);
    assert!(
        matches!(&r, Reply::Error(e) if e.contains("must be strings or integers")),
        "{r:?}"
    );
    let mut n = with_test_script("return redis.call('FLUSHALL')");
    let r = eval(&mut n, &[], &[]);
    assert!(
        matches!(&r, Reply::Error(e) if e.starts_with("ERR Unknown Redis command called from script")),
        "{r:?}"
    );
}

#[test]
fn evalsha_needs_the_script_loaded_since_the_start() {
    let mut n = SimNode::default();
    let r = Request::eval("extend", ["k"], ["t", "10"]);
    assert_eq!(
        n.execute_sha(T0, &r).unwrap().error_code(),
        Some("NOSCRIPT")
    );
    let sha = n.execute(T0, &Request::ScriptLoad("extend")).unwrap();
    let extend = n.scripts().iter().find(|s| s.name() == "extend").unwrap();
    assert_eq!(sha, Reply::Bulk(extend.sha1().as_bytes().to_vec()));
    assert_eq!(n.execute_sha(T0, &r).unwrap(), Reply::Int(0));
    n.crash();
    n.restart();
    assert_eq!(
        n.execute_sha(T0, &r).unwrap().error_code(),
        Some("NOSCRIPT")
    );
}

#[test]
fn a_crash_loses_everything_without_persistence_and_nothing_with_aof_always() {
    for (p, kept) in [(Persistence::None, false), (Persistence::AofAlways, true)] {
        let mut n = SimNode::new(p);
        cmd(&mut n, T0, &["SET", "k", "v", "PX", "1000"]);
        n.crash();
        assert!(n.execute(T0, &Request::command(["PING"])).is_err());
        n.restart();
        assert_eq!(
            cmd(&mut n, T0, &["EXISTS", "k"]),
            Reply::Int(i64::from(kept))
        );
    }
}

// ---- the crate's scripts, with the crate's keys and arguments ----

#[test]
fn every_script_file_is_loaded() {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("src/scripts");
    let mut files: Vec<String> = std::fs::read_dir(&dir)
        .expect("src/scripts")
        .map(|e| e.expect("entry").file_name().to_string_lossy().into_owned())
        .collect();
    files.sort();
    let node = SimNode::default();
    for file in &files {
        let using: Vec<&Script> = node
            .scripts()
            .iter()
            .filter(|s| s.files().contains(&file.as_str()))
            .collect();
        assert!(!using.is_empty(), "the simulator does not load {file}");
        let text = std::fs::read_to_string(dir.join(file)).expect("read");
        for s in using {
            assert!(
                s.source().contains(&text),
                "{} lacks {file}'s text",
                s.name()
            );
        }
    }
    for s in node.scripts() {
        for f in s.files() {
            assert!(
                files.iter().any(|x| x == f),
                "{} names missing {f}",
                s.name()
            );
        }
    }
}

#[test]
fn lock_scripts_run_with_the_clients_own_requests() {
    let res = Resources::new(&["r"]).unwrap();
    let key = res.lock_keys()[0].clone();
    let a = Token::from_bytes([1; 16]);
    let b = Token::from_bytes([2; 16]);
    let ttl = Duration::from_millis(1_000);
    let mut n = SimNode::default();
    assert_eq!(
        send(
            &mut n,
            T0,
            &node::Request::acquire(res.lock_keys(), &a, ttl)
        ),
        Reply::Nil
    );
    assert_eq!(
        send(
            &mut n,
            T0,
            &node::Request::acquire(res.lock_keys(), &b, ttl)
        ),
        Reply::Bulk(a.as_bytes().to_vec())
    );
    // An extension never shortens.
    let short = node::Request::extend(vec![key.clone()], &a, Duration::from_millis(10));
    assert_eq!(send(&mut n, T0, &short), Reply::Int(1));
    let pttl = Request::Command(vec![b"PTTL".to_vec(), key.clone()]);
    assert_eq!(n.execute(T0, &pttl).unwrap(), Reply::Int(1_000));
    // Only the holder's release deletes.
    let release = |t: &Token| node::Request::release(&res, t, b"", true);
    assert_eq!(send(&mut n, T0, &release(&b)), Reply::Int(0));
    assert_eq!(send(&mut n, T0, &release(&a)), Reply::Int(1));
    assert!(n.is_empty());
    // The fenced acquire raises the counter to at least the clock.
    let mut keys = res.lock_keys().to_vec();
    keys.extend(res.fence_keys());
    let fenced = send(&mut n, T0, &node::Request::acquire_fenced(keys, &a, ttl));
    match fenced {
        Reply::Array(v) => {
            assert!(matches!(v[..], [Reply::Int(1), Reply::Int(t)] if t as u64 >= T0))
        }
        other => panic!("{other:?}"),
    }
}

#[test]
fn a_release_hands_the_lock_to_a_queued_waiter() {
    let res = Resources::new(&["r"]).unwrap();
    let key = res.lock_keys()[0].clone();
    let holder = Token::from_bytes([1; 16]);
    let waiter = Token::from_bytes([2; 16]);
    let ttl = Duration::from_millis(1_000);
    let mut n = SimNode::default();
    send(
        &mut n,
        T0,
        &node::Request::acquire(res.lock_keys(), &holder, ttl),
    );
    let join = QueueJoin::new(
        &res,
        &JoinArgs {
            token: waiter.as_bytes(),
            ticket: b"",
            lease: Duration::from_millis(500),
            ttl,
            kind: EntryKind::Transfer,
            first: true,
            inbox: b"",
        },
    );
    let joined = n.execute(T0, &translate_join(&join).unwrap()).unwrap();
    assert!(
        matches!(&joined, Reply::Array(v) if v.first() == Some(&Reply::Int(1))),
        "{joined:?}"
    );
    send(
        &mut n,
        T0 + 1_000,
        &node::Request::release(&res, &holder, b"", true),
    );
    let get = Request::Command(vec![b"GET".to_vec(), key]);
    assert_eq!(
        n.execute(T0 + 1_000, &get).unwrap(),
        Reply::Bulk(waiter.as_bytes().to_vec()),
        "the waiter holds the lock after the release"
    );
    assert!(!n.drain_published().is_empty(), "the transfer is announced");
}

#[test]
fn a_release_of_a_listened_resource_announces_and_drops_the_mark() {
    let res = Resources::new(&["r", "s"]).unwrap();
    let holder = Token::from_bytes([1; 16]);
    let waiter = Token::from_bytes([2; 16]);
    let ttl = Duration::from_millis(1_000);
    let mut n = SimNode::default();
    send(
        &mut n,
        T0,
        &node::Request::acquire(res.lock_keys(), &holder, ttl),
    );
    let listen = QueueJoin::listen(&res, waiter.as_bytes(), Duration::from_millis(500), None);
    let marked = n.execute(T0, &translate_join(&listen).unwrap()).unwrap();
    assert_eq!(marked, Reply::Int(0), "the set is held");
    // Every node announces a multi-resource lock's releases, where someone listens.
    send(
        &mut n,
        T0 + 1_000,
        &node::Request::release(&res, &holder, b"", true),
    );
    assert!(!n.drain_published().is_empty(), "the release is announced");
    let again = n.execute(T0 + 1_000, &translate_join(&listen).unwrap());
    assert_eq!(again.unwrap(), Reply::Int(1), "the set is free");
    // The waiter's acquire of every key, then its release drops its mark.
    let claim = node::Request::claim(res.lock_keys(), &waiter, ttl);
    send(&mut n, T0 + 1_000, &claim);
    send(
        &mut n,
        T0 + 1_000,
        &node::Request::release(&res, &waiter, b"", true),
    );
    assert!(n.is_empty(), "no lock key nor mark is left");
    // With no mark left, the next release is a plain compare-and-delete: no announcement.
    n.drain_published();
    send(&mut n, T0 + 1_000, &claim);
    send(
        &mut n,
        T0 + 1_000,
        &node::Request::release(&res, &waiter, b"", true),
    );
    assert!(
        n.drain_published().is_empty(),
        "nothing announced without a listener"
    );
}

#[test]
fn a_mark_counts_the_waiters_own_attempt_as_free_and_a_key_of_another_type_as_held() {
    let res = Resources::new(&["r", "s"]).unwrap();
    let attempt = Token::from_bytes([3; 16]);
    let other = Token::from_bytes([4; 16]);
    let waiter = Token::from_bytes([2; 16]);
    let ttl = Duration::from_millis(1_000);
    let lease = Duration::from_millis(500);
    let mut n = SimNode::default();
    // The waiter's own refused attempt still holds the keys here (its clean-up is late).
    send(
        &mut n,
        T0,
        &node::Request::acquire(res.lock_keys(), &attempt, ttl),
    );
    let own = QueueJoin::listen(&res, waiter.as_bytes(), lease, Some(attempt.as_bytes()));
    let marked = n.execute(T0, &translate_join(&own).unwrap()).unwrap();
    assert_eq!(
        marked,
        Reply::Int(1),
        "its own attempt's keys count as free"
    );
    let without = QueueJoin::listen(&res, waiter.as_bytes(), lease, None);
    let marked = n.execute(T0, &translate_join(&without).unwrap()).unwrap();
    assert_eq!(marked, Reply::Int(0), "without its token they are held");
    let by_other = QueueJoin::listen(&res, waiter.as_bytes(), lease, Some(other.as_bytes()));
    let marked = n.execute(T0, &translate_join(&by_other).unwrap()).unwrap();
    assert_eq!(marked, Reply::Int(0), "another attempt's keys are held");
    // A lock key of another type: held, and the mark is still made on every resource.
    let mut m = SimNode::default();
    let first = res.lock_keys()[0].clone();
    let zadd = Request::Command(vec![b"ZADD".to_vec(), first, b"1".to_vec(), b"x".to_vec()]);
    m.execute(T0, &zadd).unwrap();
    let marked = m.execute(T0, &translate_join(&own).unwrap()).unwrap();
    assert_eq!(marked, Reply::Int(0), "a key of another type is held");
    for name in ["r", "s"] {
        let leases = Request::command(["ZCARD", &format!("quorumlock:qlease:{name}")]);
        assert_eq!(
            m.execute(T0, &leases).unwrap(),
            Reply::Int(1),
            "{name} marked"
        );
    }
}

// ---- properties over random sequences ----

fn arb_request() -> impl Strategy<Value = Request> {
    let key = prop::sample::select(vec!["a", "b", "z", "h"]);
    let value = prop::sample::select(vec!["A", "B", "12", "x"]);
    let ttl = prop::sample::select(vec!["1", "20", "1000"]);
    prop_oneof![
        (key.clone(), value.clone(), ttl.clone())
            .prop_map(|(k, v, t)| Request::command(["SET", k, v, "NX", "PX", t, "GET"])),
        (key.clone(), ttl.clone()).prop_map(|(k, t)| Request::command(["PEXPIRE", k, t, "GT"])),
        key.clone().prop_map(|k| Request::command(["INCR", k])),
        (key.clone(), value.clone()).prop_map(|(k, v)| Request::command(["ZADD", k, "1", v])),
        (key.clone(), value.clone()).prop_map(|(k, v)| Request::command(["HSET", k, v, v])),
        (key.clone(), value.clone()).prop_map(|(k, v)| Request::eval("release", [k], [v, "c"])),
        (key.clone(), value, ttl).prop_map(|(k, v, t)| Request::eval("extend", [k], [v, t])),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

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
        let sa: Vec<(Vec<u8>, Value, Option<u64>)> =
            a.entries(now).map(|(k, v, e)| (k.to_vec(), v.clone(), e)).collect();
        let sb: Vec<(Vec<u8>, Value, Option<u64>)> =
            b2.entries(now).map(|(k, v, e)| (k.to_vec(), v.clone(), e)).collect();
        prop_assert_eq!(sa, sb);
    }
}
