//! Differential test of the simulated node: random sequences of every request quorumlock
//! sends, run against a real `redis-server` (the real Lua scripts, through redis-rs
//! `Script`) and a `SimNode` side by side; every reply and, after each sequence and after a
//! crash and restart, the whole keyspace must agree.
//!
//! Time: each request is sent in one pipeline between two `TIME` commands, which the
//! server runs back to back, and the simulated node runs it at the first reading: the
//! model and the server see the same clock to within the microseconds between the two
//! readings. Values taken from the clock inside a script (fence counters raised to the
//! clock, lease times) and TTLs are compared with a small tolerance; when the two readings
//! straddle a millisecond at which an expiry or lease ends, the model's run at the
//! neighbouring millisecond is accepted too (counted in the summary). Short TTLs, short
//! leases and deliberate waits make keys expire and leases lapse during the sequences.
//! After each sequence the keyspace (keys, types, values, absolute expiry by
//! `PEXPIRETIME`) is compared, then the server is killed and restarted (AOF with
//! `appendfsync always`) and the model crashed and restarted, and it is compared again.
//!
//! The run is drawn from a printed seed; `QUORUMLOCK_SEED=<seed>` replays the same
//! sequence of requests (arguments read from the clock, such as a counter planted ahead of
//! it, aside). A mismatch names the seed, the sequence, the request's index, the request
//! and both replies.
#![cfg(feature = "sim")]

use std::time::{Duration, Instant};

use quorumlock::sim::{Persistence as SimPersistence, Queued, Reply, Request, SimNode, Value};
use quorumlock_testkit::{LocalCluster, Persistence};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use redis::aio::MultiplexedConnection;

const RUNS: usize = 6;
const OPS_PER_RUN: usize = 500;
/// When the keyspaces are compared, no expiry or lease may end within this many ms.
const GUARD_MS: u64 = 30;
/// Expiry times set by the model at the clock reading before a request, by the server at
/// its execution a moment later.
const EXPIRY_TOLERANCE_MS: u64 = 20;
const LONG_TTL: u64 = 120_000;

struct Scripts {
    acquire: redis::Script,
    acquire_fenced: redis::Script,
    commit_fence: redis::Script,
    extend: redis::Script,
    release: redis::Script,
    release_one: redis::Script,
    enqueue: redis::Script,
    claim: redis::Script,
    enqueue_many: redis::Script,
    claim_many: redis::Script,
}

const SOURCES: [&str; 10] = [
    include_str!("../src/scripts/acquire.lua"),
    include_str!("../src/scripts/acquire_fenced.lua"),
    include_str!("../src/scripts/commit_fence.lua"),
    include_str!("../src/scripts/extend.lua"),
    include_str!("../src/scripts/release.lua"),
    // The wait-queue scripts changed (multi-resource waiters no longer queue); this
    // differential test still models the earlier ones, so their requests fail here until
    // the simulator runs the real scripts.
    include_str!("../src/scripts/release_one.lua"),
    include_str!("../src/scripts/enqueue.lua"),
    include_str!("../src/scripts/claim.lua"),
    include_str!("../src/scripts/listen.lua"),
    include_str!("../src/scripts/acquire.lua"),
];

impl Scripts {
    fn new() -> Scripts {
        let [
            acquire,
            acquire_fenced,
            commit_fence,
            extend,
            release,
            release_one,
            enqueue,
            claim,
            enqueue_many,
            claim_many,
        ] = SOURCES.map(redis::Script::new);
        Scripts {
            acquire,
            acquire_fenced,
            commit_fence,
            extend,
            release,
            release_one,
            enqueue,
            claim,
            enqueue_many,
            claim_many,
        }
    }
}

fn seed() -> u64 {
    match std::env::var("QUORUMLOCK_SEED")
        .ok()
        .filter(|s| !s.trim().is_empty())
    {
        Some(s) => {
            let s = s.trim();
            match s.strip_prefix("0x") {
                Some(hex) => u64::from_str_radix(hex, 16).expect("QUORUMLOCK_SEED in hex"),
                None => s.parse().expect("QUORUMLOCK_SEED is a number"),
            }
        }
        None => rand::random(),
    }
}

// ---- the request space: few keys, tokens and ids, so that requests collide ----

const RESOURCES: [&str; 3] = ["r0", "r1", "r2"];
const TOKENS: [&str; 3] = ["tokAAAAAAAA1", "tokBBBBBBBB2", "tokCCCCCCCC3"];
/// Values planted in fence counters: each is something `tonumber`, `INCR` or both reject
/// or read in their own way.
const ODD_VALUES: [&str; 17] = [
    "12",
    "abc",
    "1.5",
    "-3",
    "1e16",
    " 7",
    "0x1f",
    "inf",
    "nan",
    "0",
    "007",
    "+5",
    "9007199254740991",
    "9007199254740992",
    "9999999999999999",
    "9223372036854775807",
    "",
];
/// Arrival scores a client never sends, but the node must read as Redis does.
const ODD_SCORES: [&str; 8] = ["abc", " 5", "5 ", "nan", "inf", "-inf", "1e400", "0x10"];
const WAITERS: [&str; 3] = ["w0", "w1", "w2"];

fn lock_key(r: &str) -> Vec<u8> {
    format!("L:{{{r}}}").into_bytes()
}
fn fence_key(r: &str) -> Vec<u8> {
    format!("F:{{{r}}}").into_bytes()
}
fn queue_key(r: &str) -> Vec<u8> {
    format!("Q:{{{r}}}").into_bytes()
}
fn attrs_key(r: &str) -> Vec<u8> {
    format!("A:{{{r}}}").into_bytes()
}
/// A token or, often, a waiter's token (which a transfer may have set the key to).
fn token_or_waiter(rng: &mut ChaCha8Rng) -> Vec<u8> {
    if rng.random_bool(0.5) {
        WAITERS[rng.random_range(0..3)].as_bytes().to_vec()
    } else {
        token(rng)
    }
}
/// A multi-resource waiter's set key.
fn set_key(w: &[u8]) -> Vec<u8> {
    let mut k = b"S:{".to_vec();
    k.extend_from_slice(w);
    k.push(b'}');
    k
}
fn lease_key(r: &str) -> Vec<u8> {
    format!("H:{{{r}}}").into_bytes()
}
fn channel(r: &str) -> Vec<u8> {
    format!("C:{{{r}}}").into_bytes()
}

/// Any key of any kind: used now and then so that types collide (WRONGTYPE paths).
fn any_key(rng: &mut ChaCha8Rng) -> Vec<u8> {
    let r = RESOURCES[rng.random_range(0..RESOURCES.len())];
    match rng.random_range(0..4) {
        0 => lock_key(r),
        1 => fence_key(r),
        2 => queue_key(r),
        _ => lease_key(r),
    }
}

fn key_or_stray(rng: &mut ChaCha8Rng, normal: Vec<u8>) -> Vec<u8> {
    if rng.random_bool(0.04) {
        any_key(rng)
    } else {
        normal
    }
}

fn resources(rng: &mut ChaCha8Rng, max: usize) -> Vec<&'static str> {
    let n = rng.random_range(1..=max);
    let mut all = RESOURCES.to_vec();
    let mut out = Vec::with_capacity(n);
    for _ in 0..n {
        out.push(all.remove(rng.random_range(0..all.len())));
    }
    out
}

fn token(rng: &mut ChaCha8Rng) -> Vec<u8> {
    if rng.random_bool(0.03) {
        ODD_VALUES[rng.random_range(0..ODD_VALUES.len())]
            .as_bytes()
            .to_vec()
    } else {
        TOKENS[rng.random_range(0..TOKENS.len())]
            .as_bytes()
            .to_vec()
    }
}

fn ttl(rng: &mut ChaCha8Rng) -> u64 {
    match rng.random_range(0..100) {
        0 => 0,
        1 => u64::MAX,
        2 => i64::MAX as u64,
        3..=7 => rng.random_range(60..=150),
        8..=11 => rng.random_range(1..=30),
        _ => LONG_TTL + rng.random_range(0..1000),
    }
}

/// The arrival score each node gave each (queue, waiter), as the server returned it.
type Arrivals = std::collections::HashMap<(Vec<u8>, Vec<u8>), Vec<u8>>;

/// One step of a sequence: a request, or a deliberate wait for short TTLs to run out.
enum Step {
    Do(Request),
    Wait(Duration),
}

fn gen_step(rng: &mut ChaCha8Rng, now_us: u64, last_top: u64, arrivals: &Arrivals) -> Step {
    let step = rng.random_range(0..124);
    let req = match step {
        0..=3 => {
            let r = RESOURCES[rng.random_range(0..3)];
            Request::Claim {
                key: key_or_stray(rng, lock_key(r)),
                token: token_or_waiter(rng),
                ttl_ms: ttl(rng),
            }
        }
        4..=11 => {
            let r = RESOURCES[rng.random_range(0..3)];
            Request::SetNxPxGet {
                key: key_or_stray(rng, lock_key(r)),
                token: token(rng),
                ttl_ms: ttl(rng),
            }
        }
        12..=19 => Request::Acquire {
            keys: resources(rng, 3)
                .into_iter()
                .map(|r| key_or_stray(rng, lock_key(r)))
                .collect(),
            token: token(rng),
            ttl_ms: ttl(rng),
        },
        20..=33 => {
            let rs = resources(rng, 2);
            Request::AcquireFenced {
                locks: rs.iter().map(|r| key_or_stray(rng, lock_key(r))).collect(),
                fences: rs.iter().map(|r| key_or_stray(rng, fence_key(r))).collect(),
                token: token(rng),
                ttl_ms: ttl(rng),
            }
        }
        34..=42 => {
            let rs = resources(rng, 2);
            let t = match rng.random_range(0..5) {
                0 => 5,
                1 => last_top.saturating_add(1),
                2 => now_us + 3_000_000_000,
                _ => last_top,
            };
            Request::CommitFence {
                locks: rs.iter().map(|r| key_or_stray(rng, lock_key(r))).collect(),
                fences: rs.iter().map(|r| key_or_stray(rng, fence_key(r))).collect(),
                token: token(rng),
                t,
            }
        }
        43..=55 => Request::Extend {
            keys: resources(rng, 2)
                .into_iter()
                .map(|r| key_or_stray(rng, lock_key(r)))
                .collect(),
            token: token(rng),
            ttl_ms: match rng.random_range(0..4) {
                0 => rng.random_range(1..=50),
                1 => LONG_TTL * 2,
                _ => ttl(rng),
            },
        },
        56..=65 => {
            let rs = resources(rng, 2);
            let channels = if rng.random_bool(0.7) {
                rs.iter().map(|r| channel(r)).collect()
            } else {
                Vec::new()
            };
            Request::Release {
                keys: rs.iter().map(|r| key_or_stray(rng, lock_key(r))).collect(),
                token: token(rng),
                channels,
            }
        }
        66..=75 => {
            // One resource, or (a third of the time) two or three, each on its own keys.
            let count = if rng.random_bool(0.67) {
                1
            } else {
                rng.random_range(2..=3)
            };
            let resources = (0..count)
                .map(|_| {
                    let r = RESOURCES[rng.random_range(0..3)];
                    Queued {
                        key: key_or_stray(rng, lock_key(r)),
                        queue: key_or_stray(rng, queue_key(r)),
                        leases: key_or_stray(rng, lease_key(r)),
                        attrs: key_or_stray(rng, attrs_key(r)),
                        fence: key_or_stray(rng, fence_key(r)),
                        channel: channel(r),
                        loud: rng.random_bool(0.7),
                    }
                })
                .collect();
            let token = token_or_waiter(rng);
            // Several resources: the releaser's set key (a waiter's, as the client sends).
            let set = if count > 1 && rng.random_bool(0.8) {
                set_key(&token)
            } else {
                Vec::new()
            };
            Request::ReleaseOne {
                token,
                waiter: if rng.random_bool(0.4) {
                    WAITERS[rng.random_range(0..3)].as_bytes().to_vec()
                } else {
                    Vec::new()
                },
                resources,
                set,
            }
        }
        76..=92 => {
            let r = RESOURCES[rng.random_range(0..3)];
            let queue = key_or_stray(rng, queue_key(r));
            let waiter = WAITERS[rng.random_range(0..3)].as_bytes().to_vec();
            // A first join, or a re-join with the score this node gave the waiter (as the
            // client does), or a small or odd score.
            let arrival = match rng.random_range(0..10) {
                0..=3 => Vec::new(),
                4..=6 => arrivals
                    .get(&(queue.clone(), waiter.clone()))
                    .cloned()
                    .unwrap_or_default(),
                7..=8 => rng.random_range(1..=20u64).to_string().into_bytes(),
                _ => ODD_SCORES[rng.random_range(0..ODD_SCORES.len())]
                    .as_bytes()
                    .to_vec(),
            };
            Request::Enqueue {
                queue,
                leases: key_or_stray(rng, lease_key(r)),
                attrs: key_or_stray(rng, attrs_key(r)),
                key: key_or_stray(rng, lock_key(r)),
                waiter,
                arrival,
                wait_ms: wait_ms(rng, 4, true),
                ttl_ms: match rng.random_range(0..10) {
                    0 => 0,
                    _ => ttl(rng),
                },
                kind: [b't', b'f', b'n', b'x'][rng.random_range(0..4)],
                first: rng.random_bool(0.6),
                // The waiter's own channel, or none (the resource's); one with colons; an
                // inbox as clients name it (not UTF-8: byte 0xFF after the prefix).
                inbox: [
                    &b""[..],
                    b"",
                    b"quorumlock:released:\xffinbox:00000000000000c1",
                    b"a:b:",
                ][rng.random_range(0..4)]
                .to_vec(),
            }
        }
        93..=96 => {
            // Plant a counter value: an odd one, or one ahead of the clock.
            let r = RESOURCES[rng.random_range(0..3)];
            let value = if rng.random_bool(0.5) {
                (now_us + 5_000_000_000).to_string().into_bytes()
            } else {
                ODD_VALUES[rng.random_range(0..ODD_VALUES.len())]
                    .as_bytes()
                    .to_vec()
            };
            Request::Set {
                key: key_or_stray(rng, fence_key(r)),
                value,
            }
        }
        110..=118 => {
            // A multi-resource waiter joins or renews on one to three queues at once.
            let rs = resources(rng, 3);
            let waiter = WAITERS[rng.random_range(0..3)].as_bytes().to_vec();
            let first_queue = queue_key(rs[0]);
            let arrival = match rng.random_range(0..10) {
                0..=4 => Vec::new(),
                5..=7 => arrivals
                    .get(&(first_queue, waiter.clone()))
                    .cloned()
                    .unwrap_or_default(),
                _ => rng.random_range(1..=20u64).to_string().into_bytes(),
            };
            Request::EnqueueMany {
                queues: rs
                    .iter()
                    .map(|r| {
                        [
                            key_or_stray(rng, queue_key(r)),
                            key_or_stray(rng, lease_key(r)),
                            key_or_stray(rng, attrs_key(r)),
                            key_or_stray(rng, lock_key(r)),
                        ]
                    })
                    .collect(),
                set: set_key(&waiter),
                waiter,
                arrival,
                // Short leases rarely: one lapsing within a millisecond of a request makes
                // the model's state (not only its reply) depend on which millisecond the
                // server ran it in, in up to three queues at once; lapses are drawn often
                // enough by the single-resource joins, which share the purge.
                wait_ms: wait_ms(rng, 2, false),
                ttl_ms: match rng.random_range(0..10) {
                    0 => 0,
                    _ => ttl(rng).min(LONG_TTL * 2),
                },
                first: rng.random_bool(0.6),
                inbox: [
                    &b"quorumlock:released:\xffinbox:00000000000000c1"[..],
                    b"a:b:",
                    b"",
                ][rng.random_range(0..3)]
                .to_vec(),
            }
        }
        119..=121 => Request::ClaimMany {
            keys: resources(rng, 3)
                .iter()
                .map(|r| key_or_stray(rng, lock_key(r)))
                .collect(),
            token: token_or_waiter(rng),
            ttl_ms: ttl(rng),
        },
        97..=99 => Request::Get(any_key(rng)),
        100..=102 => Request::Pttl(any_key(rng)),
        103 => Request::Ping,
        104 => Request::ConfigGet(
            ["maxmemory-policy", "appendonly", "appendfsync"][rng.random_range(0..3)]
                .as_bytes()
                .to_vec(),
        ),
        _ => return Step::Wait(Duration::from_millis(rng.random_range(20..=100))),
    };
    Step::Do(ticket_readable(req, now_us))
}

/// A queue's lease (ms) as a waiter asks for it: the immediate lapse; `short` in 40 a lease
/// that lapses within the sequence (and, with `client_lease`, the clients' own lease, which
/// lapses a few seconds in); and long ones on purpose: two minutes, a day, and past 10^14
/// ms from now, where `now + lease` has 15 digits: Lua's own `%.14g` would round it, but
/// `redis.call` sends a number argument as `%.17g` text, exactly.
fn wait_ms(rng: &mut ChaCha8Rng, short: u32, client_lease: bool) -> u64 {
    let r = rng.random_range(0..40);
    if r == 0 {
        0
    } else if r <= short {
        rng.random_range(60..=150)
    } else {
        match r % 8 {
            0 if client_lease => u64::try_from(quorumlock::QUEUE_LEASE.as_millis()).unwrap_or(3000),
            1 => 86_400_000,
            2 => 100_000_000_000_000 + rng.random_range(0..1_000_000),
            _ => LONG_TTL,
        }
    }
}

/// A join's queue keys and lease keys.
type JoinKeys<'a> = (Vec<&'a [u8]>, Vec<&'a [u8]>);

/// The queue keys a join writes its ticket to, and the lease keys it writes its lease to.
fn join_keys(req: &Request) -> Option<JoinKeys<'_>> {
    match req {
        Request::Enqueue { queue, leases, .. } => Some((vec![queue], vec![leases])),
        Request::EnqueueMany { queues, .. } => Some((
            queues.iter().map(|q| q[0].as_slice()).collect(),
            queues.iter().map(|q| q[1].as_slice()).collect(),
        )),
        _ => None,
    }
}

/// A first join that lets the node assign its ticket (its clock in µs, read inside the
/// script) is run by the model with the ticket the server's reply names: the score of the
/// waiter in the first queue. When a stray key makes that queue also one of the request's
/// lease keys, the lease written after the ticket overwrites it there, the reply names the
/// lease and not the ticket, and the model would queue the waiter with the lease as its
/// ticket on every other queue of the request. Such a join brings the clock as its ticket
/// instead (as a re-join does), so the model and the server store the same one. Clients
/// never send such a request: their queue and lease keys have different prefixes.
fn ticket_readable(req: Request, now_us: u64) -> Request {
    let hidden = match join_keys(&req) {
        Some((queues, leases)) => queues.first().is_some_and(|q| leases.contains(q)),
        None => false,
    };
    if !hidden {
        return req;
    }
    with_arrival(req, now_us.to_string().into_bytes())
}

/// A join that let the node assign its ticket (an empty arrival), given `ticket` instead.
fn with_arrival(req: Request, ticket: Vec<u8>) -> Request {
    match req {
        Request::Enqueue {
            queue,
            leases,
            attrs,
            key,
            waiter,
            arrival,
            wait_ms,
            ttl_ms,
            kind,
            first,
            inbox,
        } if arrival.is_empty() => Request::Enqueue {
            queue,
            leases,
            attrs,
            key,
            waiter,
            arrival: ticket,
            wait_ms,
            ttl_ms,
            kind,
            first,
            inbox,
        },
        Request::EnqueueMany {
            queues,
            set,
            waiter,
            arrival,
            wait_ms,
            ttl_ms,
            first,
            inbox,
        } if arrival.is_empty() => Request::EnqueueMany {
            queues,
            set,
            waiter,
            arrival: ticket,
            wait_ms,
            ttl_ms,
            first,
            inbox,
        },
        other => other,
    }
}

// ---- running a request on the real server ----

fn to_reply(v: redis::Value) -> Reply {
    match v {
        redis::Value::Nil => Reply::Nil,
        redis::Value::Int(i) => Reply::Int(i),
        redis::Value::BulkString(b) => Reply::Bulk(b),
        redis::Value::Okay => Reply::Status("OK"),
        redis::Value::SimpleString(s) if s == "PONG" => Reply::Status("PONG"),
        redis::Value::SimpleString(s) if s == "OK" => Reply::Status("OK"),
        redis::Value::Array(a) => Reply::Array(a.into_iter().map(to_reply).collect()),
        other => Reply::Error(format!("UNEXPECTED {other:?}")),
    }
}

fn to_error(e: &redis::RedisError) -> Reply {
    match (e.code(), e.detail()) {
        (Some(code), Some(detail)) => Reply::Error(format!("{code} {detail}")),
        (Some(code), None) => Reply::Error(code.to_owned()),
        _ => Reply::Error(format!("UNEXPECTED {e}")),
    }
}

/// `EVALSHA` of one of the real scripts (loaded at connection time).
fn evalsha(script: &redis::Script, keys: &[&[u8]], args: &[&[u8]]) -> redis::Cmd {
    let mut c = redis::cmd("EVALSHA");
    c.arg(script.get_hash()).arg(keys.len());
    for k in keys {
        c.arg(*k);
    }
    for a in args {
        c.arg(*a);
    }
    c
}

fn slices(v: &[Vec<u8>]) -> Vec<&[u8]> {
    v.iter().map(Vec::as_slice).collect()
}

/// The command the real server runs for a request: the real script, or the plain command.
fn real_command(s: &Scripts, req: &Request) -> redis::Cmd {
    match req {
        Request::SetNxPxGet { key, token, ttl_ms } => {
            let mut c = redis::cmd("SET");
            c.arg(key.as_slice())
                .arg(token.as_slice())
                .arg("NX")
                .arg("PX")
                .arg(ttl_ms.to_string())
                .arg("GET");
            c
        }
        Request::Acquire {
            keys,
            token,
            ttl_ms,
        } => evalsha(
            &s.acquire,
            &slices(keys),
            &[token, ttl_ms.to_string().as_bytes()],
        ),
        Request::AcquireFenced {
            locks,
            fences,
            token,
            ttl_ms,
        } => {
            let mut keys = slices(locks);
            keys.extend(slices(fences));
            evalsha(
                &s.acquire_fenced,
                &keys,
                &[token, ttl_ms.to_string().as_bytes()],
            )
        }
        Request::CommitFence {
            locks,
            fences,
            token,
            t,
        } => {
            let mut keys = slices(locks);
            keys.extend(slices(fences));
            evalsha(&s.commit_fence, &keys, &[token, t.to_string().as_bytes()])
        }
        Request::Extend {
            keys,
            token,
            ttl_ms,
        } => evalsha(
            &s.extend,
            &slices(keys),
            &[token, ttl_ms.to_string().as_bytes()],
        ),
        Request::Release {
            keys,
            token,
            channels,
        } => {
            let mut args: Vec<&[u8]> = vec![token];
            args.extend(slices(channels));
            evalsha(&s.release, &slices(keys), &args)
        }
        Request::ReleaseOne {
            token,
            waiter,
            resources,
            set,
        } => {
            let mut keys: Vec<&[u8]> = Vec::new();
            let mut args: Vec<&[u8]> = vec![token, waiter];
            for r in resources {
                keys.extend([&r.key[..], &r.queue, &r.leases, &r.attrs, &r.fence]);
                args.push(&r.channel);
                args.push(if r.loud { b"1" } else { b"0" });
            }
            if !set.is_empty() {
                keys.push(set);
            }
            evalsha(&s.release_one, &keys, &args)
        }
        Request::Enqueue {
            queue,
            leases,
            attrs,
            key,
            waiter,
            arrival,
            wait_ms,
            ttl_ms,
            kind,
            first,
            inbox,
        } => evalsha(
            &s.enqueue,
            &[queue, leases, attrs, key],
            &[
                waiter,
                arrival,
                wait_ms.to_string().as_bytes(),
                ttl_ms.to_string().as_bytes(),
                &[*kind],
                if *first { b"1" } else { b"0" },
                inbox,
            ],
        ),
        Request::Claim { key, token, ttl_ms } => {
            evalsha(&s.claim, &[key], &[token, ttl_ms.to_string().as_bytes()])
        }
        Request::EnqueueMany {
            queues,
            set,
            waiter,
            arrival,
            wait_ms,
            ttl_ms,
            first,
            inbox,
        } => {
            let mut keys: Vec<&[u8]> = Vec::new();
            for q in queues {
                keys.extend(q.iter().map(Vec::as_slice));
            }
            keys.push(set);
            let (wait, ttl) = (wait_ms.to_string(), ttl_ms.to_string());
            evalsha(
                &s.enqueue_many,
                &keys,
                &[
                    waiter,
                    arrival,
                    wait.as_bytes(),
                    ttl.as_bytes(),
                    if *first { b"1" } else { b"0" },
                    inbox,
                ],
            )
        }
        Request::ClaimMany {
            keys,
            token,
            ttl_ms,
        } => evalsha(
            &s.claim_many,
            &slices(keys),
            &[token, ttl_ms.to_string().as_bytes()],
        ),
        Request::Ping => redis::cmd("PING"),
        Request::ConfigGet(name) => {
            let mut c = redis::cmd("CONFIG");
            c.arg("GET").arg(name.as_slice());
            c
        }
        Request::Get(key) => {
            let mut c = redis::cmd("GET");
            c.arg(key.as_slice());
            c
        }
        Request::Set { key, value } => {
            let mut c = redis::cmd("SET");
            c.arg(key.as_slice()).arg(value.as_slice());
            c
        }
        Request::Pttl(key) => {
            let mut c = redis::cmd("PTTL");
            c.arg(key.as_slice());
            c
        }
        other => panic!("the differential test does not send {other:?}"),
    }
}

fn time_us(v: &redis::RedisResult<redis::Value>) -> u64 {
    let (s, us): (u64, u64) = match v {
        Ok(v) => redis::from_redis_value(v.clone()).expect("TIME reply"),
        Err(e) => panic!("TIME failed: {e}"),
    };
    s * 1_000_000 + us
}

/// Runs a request on the real server between two `TIME` readings, in one pipeline: the
/// server runs the three back to back, so the request ran within `[before, after]` (µs).
async fn run_real(
    con: &mut MultiplexedConnection,
    s: &Scripts,
    req: &Request,
) -> (u64, Reply, u64) {
    let mut pipe = redis::pipe();
    pipe.cmd("TIME")
        .add_command(real_command(s, req))
        .cmd("TIME");
    let replies: Vec<redis::RedisResult<redis::Value>> = pipe
        .ignore_errors()
        .query_async(con)
        .await
        .expect("pipeline");
    let [before, reply, after] = <[_; 3]>::try_from(replies).expect("three replies");
    let reply = match reply {
        Ok(v) => to_reply(v),
        Err(e) => to_error(&e),
    };
    (time_us(&before), reply, time_us(&after))
}

async fn load_scripts(con: &mut MultiplexedConnection) {
    for src in SOURCES {
        let _: String = redis::cmd("SCRIPT")
            .arg("LOAD")
            .arg(src)
            .query_async(con)
            .await
            .expect("SCRIPT LOAD");
    }
}

async fn server_time_us(con: &mut MultiplexedConnection) -> u64 {
    let (s, us): (u64, u64) = redis::cmd("TIME").query_async(con).await.expect("TIME");
    s * 1_000_000 + us
}

// ---- comparing ----

/// Whether a value is a clock reading (µs or ms since the epoch): such values may differ by
/// the time a request took.
fn clock_like(v: i128) -> bool {
    v > 100_000_000_000
}

fn close(a: i128, b: i128) -> bool {
    // 1 part in 10^10 of a clock reading now (1.8e15 µs or 1.8e12 ms): about 180 ms.
    let tol = a.abs().max(b.abs()) / 10_000_000_000;
    (a - b).abs() <= tol.max(0)
}

fn same_text(a: &[u8], b: &[u8]) -> bool {
    if a == b {
        return true;
    }
    let parse = |x: &[u8]| std::str::from_utf8(x).ok()?.parse::<i128>().ok();
    match (parse(a), parse(b)) {
        (Some(x), Some(y)) => clock_like(x) && clock_like(y) && close(x, y),
        _ => false,
    }
}

fn same_reply(real: &Reply, sim: &Reply) -> bool {
    match (real, sim) {
        (Reply::Int(a), Reply::Int(b)) => {
            a == b || (clock_like(i128::from(*a)) && close(i128::from(*a), i128::from(*b)))
        }
        (Reply::Bulk(a), Reply::Bulk(b)) => same_text(a, b),
        (Reply::Array(a), Reply::Array(b)) => {
            a.len() == b.len() && a.iter().zip(b).all(|(x, y)| same_reply(x, y))
        }
        (Reply::Error(a), Reply::Error(b)) => {
            // Same code; a script's own error (not an upper-case code) word for word. Redis
            // appends where in the script a redis.call failed; the model does not.
            let code = |e: &str| e.split(' ').next().unwrap_or("").to_owned();
            let ca = code(a);
            if ca != code(b) {
                return false;
            }
            if ca.chars().all(|c| c.is_ascii_uppercase()) {
                return true;
            }
            a == b
        }
        _ => real == sim,
    }
}

fn agree(req: &Request, real: &Reply, model: &Reply, window_us: u64) -> bool {
    match req {
        Request::Pttl(_) => pttl_close(real, model, window_us),
        _ => same_reply(real, model),
    }
}

/// The model read the TTL at `now`, the server up to `window_us` later; the expiry itself
/// may have been set a moment apart too.
fn pttl_close(real: &Reply, sim: &Reply, window_us: u64) -> bool {
    match (real, sim) {
        (Reply::Int(a), Reply::Int(b)) if *a >= 0 && *b >= 0 => {
            let tol = window_us / 1000 + 1 + EXPIRY_TOLERANCE_MS;
            // A queue key whose stray "leases" key was another queue expires at a ticket
            // (a clock reading in µs, which the model took a moment earlier).
            a.abs_diff(*b) <= tol
                || (clock_like(i128::from(*a)) && close(i128::from(*a), i128::from(*b)))
        }
        _ => real == sim,
    }
}

/// Every instant (ms, node clock) at which a decision of the model changes: key expiries
/// and queue leases (sorted set scores that are clock readings).
fn critical_instants(sim: &SimNode, now_us: u64, out: &mut Vec<u64>) {
    out.clear();
    for (_, value, expiry) in sim.entries(now_us) {
        out.extend(expiry);
        if let Value::SortedSet(z) = value {
            for (score, _) in z {
                if score.is_finite() && *score > 1e11 {
                    out.push(*score as u64);
                }
            }
        }
    }
}

fn near(instants: &[u64], now_ms: u64) -> Option<u64> {
    instants
        .iter()
        .copied()
        .filter(|&t| t + 5 >= now_ms && t <= now_ms + GUARD_MS)
        .max()
}

/// Reads the server's clock, waiting (bounded) until no decision of the model changes
/// within the guard band.
async fn quiet_time(con: &mut MultiplexedConnection, sim: &SimNode, buf: &mut Vec<u64>) -> u64 {
    for _ in 0..20 {
        let now = server_time_us(con).await;
        critical_instants(sim, now, buf);
        match near(buf, now / 1000) {
            None => return now,
            Some(t) => {
                let wait = (t + 6).saturating_sub(now / 1000);
                tokio::time::sleep(Duration::from_millis(wait)).await;
            }
        }
    }
    panic!("no quiet instant within 20 tries");
}

#[derive(Debug, PartialEq)]
struct Dumped {
    key: Vec<u8>,
    kind: String,
    value: Vec<Vec<u8>>,
    expires_at_ms: Option<u64>,
}

async fn dump_real(con: &mut MultiplexedConnection) -> Vec<Dumped> {
    let mut keys: Vec<Vec<u8>> = redis::cmd("KEYS")
        .arg("*")
        .query_async(con)
        .await
        .expect("KEYS");
    keys.sort();
    let mut out = Vec::new();
    for key in keys {
        let kind: String = redis::cmd("TYPE")
            .arg(&key)
            .query_async(con)
            .await
            .expect("TYPE");
        let value: Vec<Vec<u8>> = match kind.as_str() {
            "string" => vec![
                redis::cmd("GET")
                    .arg(&key)
                    .query_async(con)
                    .await
                    .expect("GET"),
            ],
            "zset" => redis::cmd("ZRANGE")
                .arg(&key)
                .arg(0)
                .arg(-1)
                .arg("WITHSCORES")
                .query_async(con)
                .await
                .expect("ZRANGE"),
            "hash" => {
                let mut pairs: Vec<(Vec<u8>, Vec<u8>)> = redis::cmd("HGETALL")
                    .arg(&key)
                    .query_async(con)
                    .await
                    .expect("HGETALL");
                pairs.sort();
                pairs.into_iter().flat_map(|(f, v)| [f, v]).collect()
            }
            "none" => continue,
            other => vec![other.as_bytes().to_vec()],
        };
        // Absolute expiry, as stored (no clock reading of ours involved).
        let at: i64 = redis::cmd("PEXPIRETIME")
            .arg(&key)
            .query_async(con)
            .await
            .expect("PEXPIRETIME");
        if at == -2 {
            continue;
        }
        let expires_at_ms = u64::try_from(at).ok();
        out.push(Dumped {
            key,
            kind,
            value,
            expires_at_ms,
        });
    }
    out
}

fn dump_sim(sim: &SimNode, now_us: u64) -> Vec<Dumped> {
    sim.entries(now_us)
        .map(|(key, value, expiry)| Dumped {
            key: key.to_vec(),
            kind: value.type_name().to_owned(),
            value: match value {
                Value::String(s) => vec![s.clone()],
                Value::SortedSet(z) => z
                    .iter()
                    .flat_map(|(score, m)| [m.clone(), format_score(*score).into_bytes()])
                    .collect(),
                Value::Hash(h) => h.iter().flat_map(|(f, v)| [f.clone(), v.clone()]).collect(),
                _ => vec![b"unknown".to_vec()],
            },
            expires_at_ms: expiry,
        })
        .collect()
}

fn format_score(s: f64) -> String {
    if s == s.trunc() && s.abs() < 1e15 {
        format!("{}", s as i64)
    } else {
        format!("{s}")
    }
}

fn same_dump(real: &[Dumped], sim: &[Dumped], slack_ms: u64) -> bool {
    real.len() == sim.len()
        && real.iter().zip(sim).all(|(r, s)| {
            r.key == s.key
                && r.kind == s.kind
                && r.value.len() == s.value.len()
                && r.value.iter().zip(&s.value).all(|(a, b)| same_text(a, b))
                && match (r.expires_at_ms, s.expires_at_ms) {
                    (None, None) => true,
                    (Some(a), Some(b)) => a.abs_diff(b) <= EXPIRY_TOLERANCE_MS + slack_ms,
                    _ => false,
                }
        })
}

async fn compare_keyspace(
    con: &mut MultiplexedConnection,
    sim: &SimNode,
    buf: &mut Vec<u64>,
    seed: u64,
    (what, slack_ms): (&str, u64),
) {
    for attempt in 0..5 {
        let now = quiet_time(con, sim, buf).await;
        let real = dump_real(con).await;
        let after = server_time_us(con).await;
        // The dump is not atomic: under load it can take longer than the guard band, and a
        // key that expires while it runs is read before or after. Dump again when any
        // decision of the model falls anywhere within the dump's window.
        let (from, to) = (now / 1000, after / 1000);
        let inside = buf.iter().any(|&t| t + 5 >= from && t <= to + GUARD_MS);
        if inside && attempt < 4 {
            continue;
        }
        let model = dump_sim(sim, now);
        assert!(
            same_dump(&real, &model, slack_ms),
            "seed {seed}: keyspace differs {what}\nreal: {real:#?}\nsim:  {model:#?}"
        );
        return;
    }
}

fn show(r: &Request) -> String {
    // Byte strings print as lists of numbers; show them as text.
    let text = format!("{r:?}");
    let mut out = String::new();
    let mut rest = text.as_str();
    while let Some(i) = rest.find('[') {
        let (head, tail) = rest.split_at(i);
        out.push_str(head);
        let inner_end = tail.find(']').unwrap_or(tail.len());
        let inner = &tail[1..inner_end];
        let bytes: Option<Vec<u8>> = inner.split(", ").map(|b| b.parse().ok()).collect();
        match bytes {
            Some(b) if !inner.is_empty() && inner_end < tail.len() => {
                out.push_str(&format!("{:?}", String::from_utf8_lossy(&b)));
                rest = &tail[inner_end + 1..];
            }
            _ => {
                out.push('[');
                rest = &tail[1..];
            }
        }
    }
    out.push_str(rest);
    out
}

/// A reply with bulk strings as text.
fn show_reply(r: &Reply) -> String {
    match r {
        Reply::Bulk(b) => format!("Bulk({:?})", String::from_utf8_lossy(b)),
        Reply::Array(a) => format!(
            "[{}]",
            a.iter().map(show_reply).collect::<Vec<_>>().join(", ")
        ),
        other => format!("{other:?}"),
    }
}

/// A first join that let the node assign the ticket (its clock in µs), run by the model
/// with the ticket the server assigned. The model reads the clock a few µs before the
/// server's `TIME` inside the script; both tickets are stored, and a later join that passes
/// the real one back (`arrivals`) would find the entry's own ticket equal in Redis and
/// earlier in the model (`ahead` counts strictly earlier tickets). What the model's own
/// assignment does is checked in the unit tests (`a_first_join_arrives_at_the_nodes_clock`).
fn with_real_ticket(req: Request, real: &Reply) -> Request {
    let score = match real {
        Reply::Array(a) if a.first() == Some(&Reply::Int(1)) => match a.get(2) {
            Some(Reply::Bulk(s)) => s.clone(),
            _ => return req,
        },
        _ => return req,
    };
    // A reply that added the entry (state 1) comes from a first join.
    with_arrival(req, score)
}

#[tokio::test]
async fn sim_node_matches_redis() {
    let seed = seed();
    eprintln!("sim differential: seed {seed} (replay with QUORUMLOCK_SEED={seed})");
    let cluster = LocalCluster::builder(1)
        .persistence(Persistence::AofAlways)
        .launch()
        .await
        .expect("launch redis-server");
    let url = cluster.direct_url(0).expect("url");
    // redis-rs gives up on a reply after 500 ms by default; on a loaded machine (a build
    // beside the test) a request can wait longer, which says nothing of the model.
    let config =
        redis::AsyncConnectionConfig::new().set_response_timeout(Some(Duration::from_secs(30)));
    let connect = || async {
        redis::Client::open(url.as_str())
            .expect("client")
            .get_multiplexed_async_connection_with_config(&config)
            .await
            .expect("connect")
    };
    let mut con = connect().await;
    load_scripts(&mut con).await;
    let scripts = Scripts::new();
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let mut buf = Vec::new();
    let mut compared = 0usize;
    let mut errors = std::collections::BTreeMap::new();
    let mut kinds = std::collections::BTreeMap::new();
    let mut waits = 0usize;
    let mut neighbour_ms = 0usize;
    let started = Instant::now();
    for run in 0..RUNS {
        let _: () = redis::cmd("FLUSHALL")
            .query_async(&mut con)
            .await
            .expect("FLUSHALL");
        let mut sim = SimNode::new(SimPersistence::AofAlways);
        let mut last_top = 0u64;
        let mut arrivals = Arrivals::new();
        let mut clock = server_time_us(&mut con).await;
        let mut widest_us = 0u64;
        for op in 0..OPS_PER_RUN {
            let req = match gen_step(&mut rng, clock, last_top, &arrivals) {
                Step::Wait(d) => {
                    waits += 1;
                    tokio::time::sleep(d).await;
                    continue;
                }
                Step::Do(req) => req,
            };
            let before_sim = sim.clone();
            let (now, real, after) = run_real(&mut con, &scripts, &req).await;
            let req = with_real_ticket(req, &real);
            clock = after;
            // The model runs at the server's clock just before the request. The request
            // ran within [now, after] (µs apart). When that window spans a millisecond
            // boundary, the server may have run it at the later millisecond; and an expiry
            // the server set then is a millisecond later than the model's. So when the
            // replies differ and an expiry or lease of the model ends within a millisecond
            // or two of `now`, the model's run at the neighbouring milliseconds is accepted
            // too (counted and reported).
            let mut model = sim.execute(now, &req).expect("sim node is up");
            // An expiry set in an earlier request may be off by that request's window (the
            // server ran it somewhere within it): PTTLs and expiries are compared with the
            // widest window of the run so far.
            widest_us = widest_us.max(after - now);
            let window = widest_us;
            let mut ok = agree(&req, &real, &model, window);
            if !ok {
                let now_ms = now / 1000;
                // An expiry the model set in an earlier request may be early by that
                // request's window (the server ran it later within it): under load the
                // window grows past a millisecond, so the model is also run up to the
                // widest window of the run (and two milliseconds) earlier. Its instants
                // are read that much earlier too: a key the model let expire within the
                // lag is one the server may still hold.
                let lag_ms = widest_us / 1000 + 2;
                critical_instants(&before_sim, now.saturating_sub(lag_ms * 1000), &mut buf);
                if buf
                    .iter()
                    .any(|&t| t + lag_ms + 1 >= now_ms && t <= after / 1000 + 1)
                {
                    let earlier = (1..=lag_ms).map(|k| now.saturating_sub(k * 1000));
                    for at in std::iter::once(after).chain(earlier) {
                        let mut alt = before_sim.clone();
                        let m = alt.execute(at, &req).expect("sim node is up");
                        if agree(&req, &real, &m, window) {
                            sim = alt;
                            model = m;
                            ok = true;
                            neighbour_ms += 1;
                            break;
                        }
                    }
                }
            }
            assert!(
                ok,
                "seed {seed}: run {run} op {op}: replies differ\nrequest: {}\nreal:    {}\nsim:     {}",
                show(&req),
                show_reply(&real),
                show_reply(&model)
            );
            if let (Request::AcquireFenced { .. }, Reply::Array(a)) = (&req, &model)
                && let Some(Reply::Int(top)) = a.get(1)
            {
                last_top = u64::try_from(*top).unwrap_or(0);
            }
            if let (Request::Enqueue { queue, waiter, .. }, Reply::Array(a)) = (&req, &real)
                && let Some(Reply::Bulk(score)) = a.get(2)
            {
                arrivals.insert((queue.clone(), waiter.clone()), score.clone());
            }
            if let (Request::EnqueueMany { queues, waiter, .. }, Reply::Array(a)) = (&req, &real)
                && let Some(Reply::Bulk(score)) = a.get(2)
                && let Some([queue, ..]) = queues.first()
            {
                arrivals.insert((queue.clone(), waiter.clone()), score.clone());
            }
            if let Reply::Error(e) = &real {
                let code = e.split(' ').next().unwrap_or("").to_owned();
                *errors.entry(code).or_insert(0usize) += 1;
            }
            let kind = format!("{req:?}");
            let kind = kind.split([' ', '(']).next().unwrap_or("").to_owned();
            *kinds.entry(kind).or_insert(0usize) += 1;
            sim.drain_published();
            compared += 1;
        }
        let slack_ms = widest_us / 1000 + 1;
        compare_keyspace(
            &mut con,
            &sim,
            &mut buf,
            seed,
            (&format!("after run {run}"), slack_ms),
        )
        .await;
        // Crash and restart both: with AOF always every acknowledged write survives.
        drop(con);
        cluster.kill(0).await.expect("kill");
        sim.crash();
        cluster.start(0).await.expect("start");
        sim.restart();
        con = connect().await;
        load_scripts(&mut con).await;
        compare_keyspace(
            &mut con,
            &sim,
            &mut buf,
            seed,
            (&format!("after run {run} and a crash"), slack_ms),
        )
        .await;
    }
    eprintln!(
        "sim differential: seed {seed}: {compared} requests compared ({kinds:?}; error replies by code: {errors:?}), {waits} deliberate waits, {neighbour_ms} requests at an expiry boundary matched the model at a neighbouring millisecond, {RUNS} keyspace comparisons before and after a crash, in {:?}",
        started.elapsed()
    );
}
