//! Differential test of the simulated node: random sequences of the Redis commands the
//! crate's scripts call (random keys of every type, options, TTLs that run out, wrong
//! types and wrong argument counts), and of every script with random keys and arguments,
//! run against a real `redis-server` and a `SimNode` side by side; every reply and, after
//! each sequence and after a crash and restart, the whole keyspace must agree.
//!
//! The simulator runs the crate's own Lua sources, and so does the server here (the same
//! [`scripts`] list, sent with `SCRIPT LOAD` and `EVALSHA`): a script is the same program on
//! both sides, so what this compares is the simulator's command model and its Lua
//! runtime (argument and reply conversions, errors raised by `redis.call`, writes kept
//! when a script fails) against Redis's.
//!
//! Time: each request is sent in one pipeline between two `TIME` commands, which the
//! server runs back to back, and the simulated node runs it at the first reading: the
//! model and the server see the same clock to within the microseconds between the two
//! readings. Values taken from the clock (inside a script, or sent as a score or an
//! absolute expiry) and TTLs are compared with a small tolerance; when the two readings
//! straddle a millisecond at which an expiry or a clock-like score ends, the model's run at
//! a neighbouring millisecond is accepted too (counted in the summary). Short TTLs and
//! deliberate waits make keys expire during the sequences. After each sequence the
//! keyspace (keys, types, values, absolute expiry by `PEXPIRETIME`) is compared, then the
//! server is killed and restarted (AOF with `appendfsync always`) and the model crashed
//! and restarted, and it is compared again.
//!
//! The run is drawn from a printed seed; `QUORUMLOCK_SEED=<seed>` replays the same
//! sequence of requests (arguments read from the clock aside). A mismatch names the seed,
//! the sequence, the request's index, the request and both replies.
#![cfg(feature = "sim")]

use std::time::{Duration, Instant};

use quorumlock::sim::{
    Persistence as SimPersistence, Reply, Request, Script, SimNode, Value, scripts,
};
use quorumlock_testkit::{LocalCluster, Persistence};
use rand::rngs::StdRng;
use rand::{RngExt, SeedableRng};
use redis::aio::MultiplexedConnection;

const RUNS: usize = 6;
const OPS_PER_RUN: usize = 500;
/// When the keyspaces are compared, no expiry or lease may end within this many ms.
const GUARD_MS: u64 = 30;
/// Expiry times set by the model at the clock reading before a request, by the server at
/// its execution a moment later.
const EXPIRY_TOLERANCE_MS: u64 = 20;

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

// ---- the request space: few keys and values, so that requests collide ----

/// Keys of every type meet here (a hash tag keeps them in one slot, as a script's keys).
const KEYS: [&str; 6] = ["{t}a", "{t}b", "{t}c", "{t}d", "{t}e", "{t}f"];
const MEMBERS: [&str; 4] = ["m0", "m1", "tokAAAAAAAA1", "tokBBBBBBBB2"];
/// Values each command reads in its own way (integers, floats, text, odd syntax).
const VALUES: [&str; 16] = [
    "tokAAAAAAAA1",
    "tokBBBBBBBB2",
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
    "9007199254740992",
    "9223372036854775807",
    "",
];
const SCORES: [&str; 12] = [
    "1", "2", "2", "-1.5", "0.1", "inf", "-inf", "abc", " 5", "1e400", "0x10", "nan",
];
const BOUNDS: [&str; 9] = ["-inf", "+inf", "1", "(1", "2", "(2", "0.5", "x", "(x"];
const OPTIONS: [&str; 9] = [
    "NX",
    "XX",
    "GT",
    "LT",
    "CH",
    "GET",
    "KEEPTTL",
    "WITHSCORES",
    "BOGUS",
];

fn pick<'a>(rng: &mut StdRng, from: &[&'a str]) -> &'a str {
    from[rng.random_range(0..from.len())]
}

/// A TTL in ms: mostly short enough to run out during the sequence, sometimes invalid.
fn ttl(rng: &mut StdRng) -> String {
    match rng.random_range(0..20) {
        0 => "0".into(),
        1 => "-5".into(),
        2 => "x".into(),
        3 => "9223372036854775807".into(),
        4..=7 => rng.random_range(1..=30).to_string(),
        8..=11 => rng.random_range(60..=150).to_string(),
        _ => (120_000 + rng.random_range(0..1000)).to_string(),
    }
}

/// An absolute time in ms: around the clock (past or future), or far off.
fn at_ms(rng: &mut StdRng, now_us: u64) -> String {
    let now = now_us / 1000;
    match rng.random_range(0..6) {
        0 => "1".into(),
        1 => "-1".into(),
        2 => (now - rng.random_range(1..100)).to_string(),
        _ => (now + rng.random_range(50..150_000)).to_string(),
    }
}

fn words(w: &[String]) -> Request {
    Request::command(w)
}

/// One random command of the modelled set.
fn gen_command(rng: &mut StdRng, now_us: u64) -> Request {
    let k = pick(rng, &KEYS).to_owned();
    let v = pick(rng, &VALUES).to_owned();
    let m = pick(rng, &MEMBERS).to_owned();
    let s = |x: &str| x.to_owned();
    let w: Vec<String> = match rng.random_range(0..26) {
        0 => vec![s("GET"), k],
        1 | 2 => {
            let mut w = vec![s("SET"), k, v];
            for _ in 0..rng.random_range(0..3) {
                match rng.random_range(0..8) {
                    0 => w.push(s("NX")),
                    1 => w.push(s("XX")),
                    2 => w.push(s("GET")),
                    3 => w.push(s("KEEPTTL")),
                    4 => w.extend([s("PXAT"), at_ms(rng, now_us)]),
                    5 => w.extend([s("EX"), rng.random_range(0..3).to_string()]),
                    _ => w.extend([s("PX"), ttl(rng)]),
                }
            }
            w
        }
        3 => {
            let mut w = vec![s("DEL"), k];
            w.push(pick(rng, &KEYS).to_owned());
            w
        }
        4 => vec![
            s("EXISTS"),
            k,
            pick(rng, &KEYS).to_owned(),
            pick(rng, &KEYS).to_owned(),
        ],
        5 => vec![s("PSETEX"), k, ttl(rng), v],
        6 => vec![s("INCR"), k],
        7 | 8 => {
            let mut w = vec![s("PEXPIRE"), k, ttl(rng)];
            if rng.random_bool(0.5) {
                w.push(pick(rng, &OPTIONS[..4]).to_owned());
            }
            w
        }
        9 => {
            let mut w = vec![s("PEXPIREAT"), k, at_ms(rng, now_us)];
            if rng.random_bool(0.3) {
                w.push(pick(rng, &OPTIONS[..4]).to_owned());
            }
            w
        }
        10 => vec![s("PTTL"), k],
        11 => vec![s("TYPE"), k],
        12 => vec![s("HGET"), k, m],
        13 => {
            let mut w = vec![s("HSET"), k, m, v];
            if rng.random_bool(0.3) {
                w.extend([
                    pick(rng, &MEMBERS).to_owned(),
                    pick(rng, &VALUES).to_owned(),
                ]);
            }
            w
        }
        14 => vec![s("HDEL"), k, m, pick(rng, &MEMBERS).to_owned()],
        15 | 16 => {
            let mut w = vec![s("ZADD"), k];
            for _ in 0..rng.random_range(0..2) {
                w.push(pick(rng, &OPTIONS[..5]).to_owned());
            }
            let score = if rng.random_bool(0.3) {
                // A clock-like score (a lease), as the queue scripts write.
                (now_us / 1000 + rng.random_range(0..200)).to_string()
            } else {
                pick(rng, &SCORES).to_owned()
            };
            w.extend([score, m]);
            w
        }
        17 => vec![s("ZSCORE"), k, m],
        18 => {
            let mut w = vec![
                s("ZRANGE"),
                k,
                rng.random_range(-3..3).to_string(),
                rng.random_range(-3..3).to_string(),
            ];
            if rng.random_bool(0.5) {
                w.push(s("WITHSCORES"));
            }
            w
        }
        19 => {
            let mut w = vec![
                s("ZRANGEBYSCORE"),
                k,
                pick(rng, &BOUNDS).to_owned(),
                pick(rng, &BOUNDS).to_owned(),
            ];
            if rng.random_bool(0.3) {
                w.push(s("WITHSCORES"));
            }
            if rng.random_bool(0.3) {
                w.extend([
                    s("LIMIT"),
                    rng.random_range(-1..3).to_string(),
                    rng.random_range(-1..3).to_string(),
                ]);
            }
            w
        }
        20 => vec![
            s("ZCOUNT"),
            k,
            pick(rng, &BOUNDS).to_owned(),
            pick(rng, &BOUNDS).to_owned(),
        ],
        21 => vec![s("ZCARD"), k],
        22 => vec![s("ZREM"), k, m, pick(rng, &MEMBERS).to_owned()],
        23 => {
            let now = (now_us / 1000).to_string();
            vec![
                s("ZREMRANGEBYSCORE"),
                k,
                s("-inf"),
                if rng.random_bool(0.5) {
                    now
                } else {
                    pick(rng, &BOUNDS).to_owned()
                },
            ]
        }
        24 => vec![
            s(if rng.random_bool(0.5) {
                "PUBLISH"
            } else {
                "SPUBLISH"
            }),
            s("{t}chan"),
            v,
        ],
        // A wrong number of arguments, or the clock.
        _ => match rng.random_range(0..4) {
            0 => vec![s("GET")],
            1 => vec![s("GET"), k, v],
            2 => vec![s("ZCOUNT"), k],
            _ => vec![s("TIME")],
        },
    };
    words(&w)
}

/// An argument a script may read in its own way. Never a number from 1 to 4: read as a
/// lease, it ends within the script's own millisecond on a real server (which then
/// deletes a key the script just wrote, while the simulator runs a script at one
/// instant), and the library's leases are seconds.
fn script_arg(rng: &mut StdRng, now_us: u64) -> String {
    let arg = any_script_arg(rng, now_us);
    match arg.parse::<i64>() {
        Ok(1..=4) => "5".to_owned(),
        _ => arg,
    }
}

fn any_script_arg(rng: &mut StdRng, now_us: u64) -> String {
    match rng.random_range(0..12) {
        0..=2 => pick(rng, &VALUES).to_owned(),
        3 => ttl(rng),
        4 => wait_ms(rng).to_string(),
        5 => pick(rng, &["0", "1", "t", "f", "m", "n"]).to_owned(),
        6 => now_us.to_string(),
        7 => (now_us / 1000 + rng.random_range(0..500)).to_string(),
        8 => "3:{t}chan".to_owned(),
        9 => rng.random_range(1..4).to_string(),
        _ => pick(rng, &MEMBERS).to_owned(),
    }
}

/// One random script run: a script of the crate with random keys and arguments.
fn gen_script(rng: &mut StdRng, now_us: u64, all: &[Script]) -> Request {
    let name = all[rng.random_range(0..all.len())].name();
    let keys: Vec<String> = (0..rng.random_range(1..=11))
        .map(|_| pick(rng, &KEYS).to_owned())
        .collect();
    let args: Vec<String> = (0..rng.random_range(0..=8))
        .map(|_| script_arg(rng, now_us))
        .collect();
    Request::eval(name, keys, args)
}

/// One step of a sequence: a request, or a deliberate wait for short TTLs to run out.
enum Step {
    Do(Request),
    Wait(Duration),
}

/// The keys of two resources laid out as the clients lay them out (one hash tag, the slot of
/// a script's keys): per resource the lock key, its queue, leases and attributes, and its
/// fence counter. A stray key of [`KEYS`] sometimes takes a place, as another type would.
const LAYOUT: [[&str; 5]; 2] = [
    ["{t}L0", "{t}Q0", "{t}H0", "{t}A0", "{t}F0"],
    ["{t}L1", "{t}Q1", "{t}H1", "{t}A1", "{t}F1"],
];
/// The tokens the queue steps wait, hold and release under, and a listener's id.
const TOKENS: [&str; 3] = ["tokAAAAAAAA1", "tokBBBBBBBB2", "tokCCCCCCCC3"];

/// A queue lease (ms), as a waiter asks for it: the immediate lapse, one that lapses within
/// the sequence, the clients' own lease ([`quorumlock::QUEUE_LEASE`]), and long ones on
/// purpose: two minutes, a day, and past 10^14 ms from now, where `now + lease` has 15
/// digits (Lua's own `%.14g` would round it; `redis.call` sends a number argument as
/// `%.17g` text, exactly).
fn wait_ms(rng: &mut StdRng) -> u64 {
    match rng.random_range(0..12) {
        0 => 0,
        1..=3 => rng.random_range(60..=150),
        4 | 5 => u64::try_from(quorumlock::QUEUE_LEASE.as_millis()).unwrap_or(3000),
        6 | 7 => 120_000 + rng.random_range(0..1000),
        8 | 9 => 86_400_000,
        _ => 100_000_000_000_000 + rng.random_range(0..1_000_000),
    }
}

/// Resource `r`'s key at place `i` of [`LAYOUT`], now and then a stray key instead.
fn layout_key(rng: &mut StdRng, r: usize, i: usize) -> String {
    if rng.random_range(0..40) == 0 {
        pick(rng, &KEYS).to_owned()
    } else {
        LAYOUT[r][i].to_owned()
    }
}

/// One waiting or lock step as a client sends it (keys in their places, arguments of
/// their kind), so that queues, leases and hand-offs build up and long waits meet every
/// script that reads a lease: a plain acquire, a queue join or renewal, a listener's mark,
/// a waiter's claim, a release with hand-off.
fn gen_queue_step(rng: &mut StdRng, now_us: u64) -> Request {
    let r = rng.random_range(0..2);
    let token = pick(rng, &TOKENS).to_owned();
    let ttl = match rng.random_range(0..4) {
        0 => rng.random_range(60..=150).to_string(),
        _ => (120_000 + rng.random_range(0..1000)).to_string(),
    };
    let resource = |rng: &mut StdRng, r: usize, places: &[usize]| -> Vec<String> {
        places.iter().map(|&i| layout_key(rng, r, i)).collect()
    };
    match rng.random_range(0..5) {
        0 => Request::command([
            "SET",
            LAYOUT[r][0],
            token.as_str(),
            "NX",
            "PX",
            ttl.as_str(),
        ]),
        1 => {
            let ticket = match rng.random_range(0..3) {
                0 => now_us.to_string(),
                _ => String::new(),
            };
            let kind = pick(rng, &["t", "f"]);
            let first = pick(rng, &["1", "1", "0"]);
            let inbox = pick(rng, &["", "inbox:{t}a"]);
            let wait = wait_ms(rng).to_string();
            let args = [token.as_str(), &ticket, &wait, &ttl, kind, first, inbox];
            Request::eval("enqueue", resource(rng, r, &[1, 2, 3, 0]), args)
        }
        2 => {
            let mut keys = resource(rng, 0, &[1, 2, 3, 0]);
            if rng.random_bool(0.5) {
                keys.extend(resource(rng, 1, &[1, 2, 3, 0]));
            }
            let wait = wait_ms(rng).to_string();
            let mut args = vec!["lst1".to_owned(), wait];
            if rng.random_bool(0.5) {
                args.push(token);
            }
            Request::eval("listen", keys, args)
        }
        3 => Request::eval("claim", [layout_key(rng, r, 0)], [token, ttl]),
        _ => {
            let waiter = pick(rng, &["", "tokAAAAAAAA1", "lst1"]);
            let announce = pick(rng, &["0", "1"]);
            let args = [token.as_str(), waiter, "chan:{t}", announce];
            Request::eval("release_one", resource(rng, r, &[0, 1, 2, 3, 4]), args)
        }
    }
}

fn gen_step(rng: &mut StdRng, now_us: u64, all: &[Script]) -> Step {
    match rng.random_range(0..100) {
        0 => Step::Wait(Duration::from_millis(rng.random_range(5..40))),
        1..=20 => Step::Do(gen_script(rng, now_us, all)),
        21..=40 => Step::Do(gen_queue_step(rng, now_us)),
        _ => Step::Do(gen_command(rng, now_us)),
    }
}

// ---- running a request on the real server ----

fn to_reply(v: redis::Value) -> Reply {
    match v {
        redis::Value::Nil => Reply::Nil,
        redis::Value::Int(i) => Reply::Int(i),
        redis::Value::BulkString(b) => Reply::Bulk(b),
        redis::Value::Okay => Reply::Status("OK".into()),
        redis::Value::SimpleString(s) => Reply::Status(s),
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

/// The command the real server runs for a request: the words, or `EVALSHA` of the script
/// (loaded with the same source the simulator runs).
fn real_command(all: &[Script], req: &Request) -> redis::Cmd {
    match req {
        Request::Command(words) => {
            let mut c = redis::cmd(&String::from_utf8_lossy(&words[0]));
            for w in &words[1..] {
                c.arg(w.as_slice());
            }
            c
        }
        Request::Script { name, keys, args } => {
            let script = all
                .iter()
                .find(|s| s.name() == *name)
                .expect("a known script");
            let mut c = redis::cmd("EVALSHA");
            c.arg(script.sha1()).arg(keys.len());
            for k in keys {
                c.arg(k.as_slice());
            }
            for a in args {
                c.arg(a.as_slice());
            }
            c
        }
        other => panic!("not generated: {other:?}"),
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
    scripts: &[Script],
    req: &Request,
) -> (u64, Reply, u64) {
    let mut pipe = redis::pipe();
    pipe.cmd("TIME")
        .add_command(real_command(scripts, req))
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

async fn load_scripts(con: &mut MultiplexedConnection, scripts: &[Script]) {
    for s in scripts {
        let _: String = redis::cmd("SCRIPT")
            .arg("LOAD")
            .arg(s.source())
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

/// An error Lua itself raised in a script (`user_script:<line>: …`).
fn lua_error(e: &str) -> bool {
    e.starts_with("ERR user_script:")
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
        // Word for word, where the script failed included; the texts of Lua's own
        // run-time errors (Redis's Lua and ours word a few of them apart) by their code.
        (Reply::Error(a), Reply::Error(b)) => a == b || (lua_error(a) && lua_error(b)),
        _ => real == sim,
    }
}

fn agree(req: &Request, real: &Reply, model: &Reply, window_us: u64) -> bool {
    let name = match req {
        Request::Command(words) => words.first().map(|w| w.to_ascii_uppercase()),
        _ => None,
    };
    match name.as_deref() {
        Some(b"PTTL") => pttl_close(real, model, window_us),
        // Two clock readings a moment apart: the seconds agree within one.
        Some(b"TIME") => match (real, model) {
            (Reply::Array(a), Reply::Array(b)) if a.len() == 2 && b.len() == 2 => {
                let secs = |r: &Reply| match r {
                    Reply::Bulk(s) => std::str::from_utf8(s).ok()?.parse::<u64>().ok(),
                    _ => None,
                };
                matches!((secs(&a[0]), secs(&b[0])), (Some(x), Some(y)) if x.abs_diff(y) <= 1)
            }
            _ => false,
        },
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
    // Scores as the model's own `ZRANGE … WITHSCORES` prints them (read on a copy).
    let mut probe = sim.clone();
    sim.entries(now_us)
        .map(|(key, value, expiry)| Dumped {
            key: key.to_vec(),
            kind: value.type_name().to_owned(),
            value: match value {
                Value::String(s) => vec![s.clone()],
                Value::SortedSet(_) => {
                    let zrange = Request::Command(vec![
                        b"ZRANGE".to_vec(),
                        key.to_vec(),
                        b"0".to_vec(),
                        b"-1".to_vec(),
                        b"WITHSCORES".to_vec(),
                    ]);
                    match probe.execute(now_us, &zrange) {
                        Ok(Reply::Array(items)) => items
                            .into_iter()
                            .map(|r| match r {
                                Reply::Bulk(b) => b,
                                other => format!("{other:?}").into_bytes(),
                            })
                            .collect(),
                        other => vec![format!("{other:?}").into_bytes()],
                    }
                }
                Value::Hash(h) => h.iter().flat_map(|(f, v)| [f.clone(), v.clone()]).collect(),
                _ => vec![b"unknown".to_vec()],
            },
            expires_at_ms: expiry,
        })
        .collect()
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
    let text = |ws: &[Vec<u8>]| {
        ws.iter()
            .map(|w| format!("{:?}", String::from_utf8_lossy(w)))
            .collect::<Vec<_>>()
            .join(" ")
    };
    match r {
        Request::Command(ws) => text(ws),
        Request::Script { name, keys, args } => {
            format!("EVALSHA {name} KEYS {} ARGV {}", text(keys), text(args))
        }
        other => format!("{other:?}"),
    }
}

/// Whether `req` is a queue join with a lease of a day or more that the server added to
/// its queue (state 1): the generator is meant to reach those on purpose.
fn is_long_join_added(req: &Request, real: &Reply) -> bool {
    let long = match req {
        Request::Script { name, args, .. } if *name == "enqueue" => args
            .get(2)
            .and_then(|a| std::str::from_utf8(a).ok())
            .and_then(|a| a.parse::<u64>().ok())
            .is_some_and(|ms| ms >= 86_400_000),
        _ => false,
    };
    long && matches!(real, Reply::Array(r) if r.first() == Some(&Reply::Int(1)))
}

#[tokio::test]
async fn sim_node_matches_redis() {
    let seed = seed();
    eprintln!("sim differential: seed {seed} (replay with QUORUMLOCK_SEED={seed})");
    let all = scripts();
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
    load_scripts(&mut con, &all).await;
    let mut rng = StdRng::seed_from_u64(seed);
    let mut buf = Vec::new();
    let mut compared = 0usize;
    let mut errors = std::collections::BTreeMap::new();
    let mut kinds = std::collections::BTreeMap::new();
    let mut waits = 0usize;
    let mut neighbour_ms = 0usize;
    let mut long_joins = 0usize;
    let started = Instant::now();
    for run in 0..RUNS {
        let _: () = redis::cmd("FLUSHALL")
            .query_async(&mut con)
            .await
            .expect("FLUSHALL");
        let mut sim = SimNode::new(SimPersistence::AofAlways);
        let mut clock = server_time_us(&mut con).await;
        let mut widest_us = 0u64;
        for op in 0..OPS_PER_RUN {
            let req = match gen_step(&mut rng, clock, &all) {
                Step::Wait(d) => {
                    waits += 1;
                    tokio::time::sleep(d).await;
                    continue;
                }
                Step::Do(req) => req,
            };
            let before_sim = sim.clone();
            let (now, real, after) = run_real(&mut con, &all, &req).await;
            clock = after;
            // The model runs at the server's clock just before the request. The request
            // ran within [now, after] (µs apart). When that window spans a millisecond
            // boundary, the server may have run it at the later millisecond; and an expiry
            // the server set then is a millisecond later than the model's. So when the
            // replies differ and an expiry or a clock-like score of the model ends within a
            // millisecond or two of `now`, the model's run at the neighbouring milliseconds
            // is accepted too (counted and reported).
            let mut model = sim.execute(now, &req).expect("sim node is up");
            widest_us = widest_us.max(after - now);
            let window = widest_us;
            let mut ok = agree(&req, &real, &model, window);
            if !ok {
                let now_ms = now / 1000;
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
            if is_long_join_added(&req, &real) {
                long_joins += 1;
            }
            assert!(
                ok,
                "seed {seed}: run {run} op {op}: replies differ\nrequest: {}\nreal:    {}\nsim:     {}",
                show(&req),
                show_reply(&real),
                show_reply(&model)
            );
            if let Reply::Error(e) = &real {
                let code = e.split(' ').next().unwrap_or("").to_owned();
                *errors.entry(code).or_insert(0usize) += 1;
            }
            let kind = match &req {
                Request::Command(w) => String::from_utf8_lossy(&w[0]).into_owned(),
                Request::Script { name, .. } => (*name).to_owned(),
                other => format!("{other:?}"),
            };
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
        load_scripts(&mut con, &all).await;
        compare_keyspace(
            &mut con,
            &sim,
            &mut buf,
            seed,
            (&format!("after run {run} and a crash"), slack_ms),
        )
        .await;
    }
    // The sequences exercised what they claim to: every script and wrong types.
    for s in &all {
        assert!(
            kinds.contains_key(s.name()),
            "{} never ran: {kinds:?}",
            s.name()
        );
    }
    assert!(errors.contains_key("WRONGTYPE"), "{errors:?}");
    eprintln!(
        "sim differential: seed {seed}: {compared} requests compared ({kinds:?}; error replies by code: {errors:?}), {waits} deliberate waits, {neighbour_ms} requests at an expiry boundary matched the model at a neighbouring millisecond, {RUNS} keyspace comparisons before and after a crash, {long_joins} queue joins with a lease of a day or more added, in {:?}",
        started.elapsed()
    );
    assert!(
        long_joins > 0,
        "seed {seed}: no queue join with a long lease was added: the generator no longer reaches them"
    );
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
