//! The command model: the Redis 7.0 commands quorumlock's scripts call, over an in-memory
//! keyspace whose keys expire by the caller's clock.
//!
//! [`Store::command`] takes a command as the words a client (or a script's `redis.call`)
//! sends and answers what Redis 7.0 answers, errors included: `WRONGTYPE`, syntax and
//! range errors with Redis's own texts, and a wrong number of arguments or an unknown
//! command reported as [`Fault`] so that the caller words it as Redis does for its path (a
//! client's command, or a script's call). Only the commands and options the scripts use are
//! modelled (see [`Store::command`]); anything else is an unknown command, never a guess.
//!
//! Expiry follows Redis: a key set to expire at millisecond `at` is visible while the
//! clock's millisecond is at most `at`, and every command looks keys up lazily, so an
//! expired key is never seen. Sorted sets keep Redis's order (score, then member bytes),
//! hashes their fields in byte order; the keyspace is a `BTreeMap`, so nothing depends on
//! a hash map's iteration order.

use std::collections::BTreeMap;

use super::lua::{format_score, redis_double, string2ll};
use super::node::{Published, Reply, Value};

const WRONGTYPE: &str = "WRONGTYPE Operation against a key holding the wrong kind of value";
const NOT_INTEGER: &str = "ERR value is not an integer or out of range";
const OVERFLOW: &str = "ERR increment or decrement would overflow";
const NOT_FLOAT: &str = "ERR value is not a valid float";
const MIN_MAX: &str = "ERR min or max is not a float";
const SYNTAX: &str = "ERR syntax error";

/// Why a command was not run at all (worded by the caller, which knows its path).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Fault {
    /// No such command (or not modelled).
    Unknown,
    /// The command's arity does not allow this many words.
    Arity(&'static str),
}

type Res<T> = Result<T, String>;
/// A sorted set's members, `(score, member)` in Redis order.
type ZSet = Vec<(f64, Vec<u8>)>;
/// A hash's fields and values, by field.
type Hash = Vec<(Vec<u8>, Vec<u8>)>;

/// A key's value and its absolute expiry.
#[derive(Debug, Clone)]
pub(crate) struct Entry {
    pub(crate) value: Value,
    /// Absolute expiry in ms by the node's clock; visible while `now_ms <= expires_at`.
    pub(crate) expires_at: Option<u64>,
}

/// Whether `e` is expired at millisecond `now`.
pub(crate) fn expired(e: &Entry, now: u64) -> bool {
    e.expires_at.is_some_and(|at| now > at)
}

/// One node's data: keys, and what `PUBLISH` reaches and sent.
#[derive(Debug, Clone, Default)]
pub(crate) struct Store {
    pub(crate) keys: BTreeMap<Vec<u8>, Entry>,
    pub(crate) subscribers: BTreeMap<Vec<u8>, i64>,
    pub(crate) published: Vec<Published>,
}

/// The arity of every modelled command (Redis's convention: `n` exactly, `-n` at least),
/// its name as Redis writes it in errors.
fn arity(name: &[u8]) -> Option<(i32, &'static str)> {
    const TABLE: [(&str, i32); 27] = [
        ("del", -2),
        ("exists", -2),
        ("get", 2),
        ("set", -3),
        ("psetex", 4),
        ("incr", 2),
        ("pexpire", -3),
        ("pexpireat", -3),
        ("pttl", 2),
        ("type", 2),
        ("hget", 3),
        ("hset", -4),
        ("hdel", -3),
        ("zadd", -4),
        ("zscore", 3),
        ("zrange", -4),
        ("zrangebyscore", -4),
        ("zcount", 4),
        ("zcard", 2),
        ("zrem", -3),
        ("zremrangebyscore", 4),
        ("time", 1),
        ("publish", 3),
        ("spublish", 3),
        ("ping", -1),
        ("config", -2),
        ("info", -1),
    ];
    TABLE
        .iter()
        .find(|(n, _)| n.as_bytes().eq_ignore_ascii_case(name))
        .map(|(n, a)| (*a, *n))
}

fn int(raw: &[u8]) -> Res<i64> {
    string2ll(raw).ok_or_else(|| NOT_INTEGER.to_owned())
}

/// A score range bound: `(x` exclusive, `-inf`/`+inf`, else inclusive.
fn bound(raw: &[u8]) -> Res<(f64, bool)> {
    let (exclusive, text) = match raw.split_first() {
        Some((b'(', rest)) => (true, rest),
        _ => (false, raw),
    };
    let v = redis_double(text).ok_or_else(|| MIN_MAX.to_owned())?;
    Ok((v, exclusive))
}

fn in_range(s: f64, min: (f64, bool), max: (f64, bool)) -> bool {
    let above = if min.1 { s > min.0 } else { s >= min.0 };
    let below = if max.1 { s < max.0 } else { s <= max.0 };
    above && below
}

fn bulk(b: &[u8]) -> Reply {
    Reply::Bulk(b.to_vec())
}

fn count(n: usize) -> Reply {
    Reply::Int(i64::try_from(n).unwrap_or(i64::MAX))
}

impl Store {
    /// The live entry at `key` (an expired one is removed: lazy expiry).
    fn live(&mut self, key: &[u8], now: u64) -> Option<&mut Entry> {
        if self.keys.get(key).is_some_and(|e| expired(e, now)) {
            self.keys.remove(key);
            return None;
        }
        self.keys.get_mut(key)
    }

    fn string(&mut self, key: &[u8], now: u64) -> Res<Option<&mut Vec<u8>>> {
        match self.live(key, now) {
            None => Ok(None),
            Some(Entry {
                value: Value::String(s),
                ..
            }) => Ok(Some(s)),
            Some(_) => Err(WRONGTYPE.to_owned()),
        }
    }

    fn zset(&mut self, key: &[u8], now: u64) -> Res<Option<&mut ZSet>> {
        match self.live(key, now) {
            None => Ok(None),
            Some(Entry {
                value: Value::SortedSet(z),
                ..
            }) => Ok(Some(z)),
            Some(_) => Err(WRONGTYPE.to_owned()),
        }
    }

    fn hash(&mut self, key: &[u8], now: u64) -> Res<Option<&mut Hash>> {
        match self.live(key, now) {
            None => Ok(None),
            Some(Entry {
                value: Value::Hash(h),
                ..
            }) => Ok(Some(h)),
            Some(_) => Err(WRONGTYPE.to_owned()),
        }
    }

    /// Replaces a key whatever its type.
    fn put(&mut self, key: &[u8], value: Value, expires_at: Option<u64>) {
        let entry = Entry { value, expires_at };
        if let Some(e) = self.keys.get_mut(key) {
            *e = entry;
        } else {
            self.keys.insert(key.to_vec(), entry);
        }
    }

    /// Drops `key` when its collection is empty (Redis never keeps an empty one).
    fn drop_if_empty(&mut self, key: &[u8]) {
        let empty = match self.keys.get(key).map(|e| &e.value) {
            Some(Value::SortedSet(z)) => z.is_empty(),
            Some(Value::Hash(h)) => h.is_empty(),
            _ => false,
        };
        if empty {
            self.keys.remove(key);
        }
    }

    /// Runs one command at the node's clock `now_us`. `Err` only when the command did not
    /// run at all ([`Fault`]); Redis's errors are [`Reply::Error`].
    pub(crate) fn command(&mut self, now_us: u64, words: &[Vec<u8>]) -> Result<Reply, Fault> {
        let Some((name, args)) = words.split_first() else {
            return Err(Fault::Unknown);
        };
        let (a, lower) = arity(name).ok_or(Fault::Unknown)?;
        let n = i32::try_from(words.len()).unwrap_or(i32::MAX);
        if (a > 0 && n != a) || (a < 0 && n < -a) {
            return Err(Fault::Arity(lower));
        }
        let now = now_us / 1000;
        Ok(self
            .run(lower, now_us, now, args)
            .unwrap_or_else(Reply::Error))
    }

    fn run(&mut self, name: &str, now_us: u64, now: u64, args: &[Vec<u8>]) -> Res<Reply> {
        let arg = |i: usize| args.get(i).map_or(&[][..], Vec::as_slice);
        match name {
            "del" => {
                let mut n = 0;
                for k in args {
                    if self.live(k, now).is_some() {
                        self.keys.remove(k.as_slice());
                        n += 1;
                    }
                }
                Ok(count(n))
            }
            "exists" => {
                let mut n = 0;
                for k in args {
                    if self.live(k, now).is_some() {
                        n += 1;
                    }
                }
                Ok(count(n))
            }
            "get" => Ok(match self.string(arg(0), now)? {
                Some(v) => bulk(v),
                None => Reply::Nil,
            }),
            "set" => self.set(now, args),
            "psetex" => {
                let ms = int(arg(1))?;
                let at = relative_expiry(now, ms, "psetex")?;
                self.put(arg(0), Value::String(arg(2).to_vec()), Some(at));
                Ok(Reply::Status("OK".into()))
            }
            "incr" => {
                let key = arg(0);
                match self.string(key, now)? {
                    None => {
                        self.put(key, Value::String(b"1".to_vec()), None);
                        Ok(Reply::Int(1))
                    }
                    Some(s) => {
                        let v = int(s)?;
                        let v = v.checked_add(1).ok_or_else(|| OVERFLOW.to_owned())?;
                        *s = v.to_string().into_bytes();
                        Ok(Reply::Int(v))
                    }
                }
            }
            "pexpire" | "pexpireat" => self.expire(name, now, args),
            "pttl" => Ok(Reply::Int(match self.live(arg(0), now) {
                None => -2,
                Some(Entry {
                    expires_at: None, ..
                }) => -1,
                Some(Entry {
                    expires_at: Some(at),
                    ..
                }) => i64::try_from(at.saturating_sub(now)).unwrap_or(i64::MAX),
            })),
            "type" => Ok(Reply::Status(
                self.live(arg(0), now)
                    .map_or("none", |e| e.value.type_name())
                    .into(),
            )),
            "hget" => Ok(self
                .hash(arg(0), now)?
                .and_then(|h| h.iter().find(|(f, _)| f.as_slice() == arg(1)))
                .map_or(Reply::Nil, |(_, v)| bulk(v))),
            "hset" => {
                let pairs = args.get(1..).unwrap_or_default();
                if pairs.len() % 2 != 0 {
                    return Err("ERR wrong number of arguments for 'hset' command".to_owned());
                }
                let key = arg(0);
                if self.hash(key, now)?.is_none() {
                    self.put(key, Value::Hash(Vec::new()), None);
                }
                let mut added = 0;
                if let Some(h) = self.hash(key, now)? {
                    for p in pairs.chunks_exact(2) {
                        let (f, v) = (&p[0], &p[1]);
                        match h.binary_search_by(|(x, _)| x.as_slice().cmp(f)) {
                            Ok(i) => h[i].1 = v.clone(),
                            Err(i) => {
                                h.insert(i, (f.clone(), v.clone()));
                                added += 1;
                            }
                        }
                    }
                }
                Ok(count(added))
            }
            "hdel" => {
                let key = arg(0);
                let Some(h) = self.hash(key, now)? else {
                    return Ok(Reply::Int(0));
                };
                let before = h.len();
                let fields = args.get(1..).unwrap_or_default();
                h.retain(|(f, _)| !fields.contains(f));
                let n = before - h.len();
                self.drop_if_empty(key);
                Ok(count(n))
            }
            "zadd" => self.zadd(now, args),
            "zscore" => Ok(self
                .zset(arg(0), now)?
                .and_then(|z| z.iter().find(|(_, m)| m.as_slice() == arg(1)))
                .map_or(Reply::Nil, |(s, _)| {
                    Reply::Bulk(format_score(*s).into_bytes())
                })),
            "zrange" => self.zrange(now, args),
            "zrangebyscore" => self.zrangebyscore(now, args),
            "zcount" => {
                let (min, max) = (bound(arg(1))?, bound(arg(2))?);
                Ok(count(self.zset(arg(0), now)?.map_or(0, |z| {
                    z.iter().filter(|(s, _)| in_range(*s, min, max)).count()
                })))
            }
            "zcard" => Ok(count(self.zset(arg(0), now)?.map_or(0, |z| z.len()))),
            "zrem" => {
                let key = arg(0);
                let Some(z) = self.zset(key, now)? else {
                    return Ok(Reply::Int(0));
                };
                let before = z.len();
                let members = args.get(1..).unwrap_or_default();
                z.retain(|(_, m)| !members.contains(m));
                let n = before - z.len();
                self.drop_if_empty(key);
                Ok(count(n))
            }
            "zremrangebyscore" => {
                let key = arg(0);
                let (min, max) = (bound(arg(1))?, bound(arg(2))?);
                let Some(z) = self.zset(key, now)? else {
                    return Ok(Reply::Int(0));
                };
                let before = z.len();
                z.retain(|(s, _)| !in_range(*s, min, max));
                let n = before - z.len();
                self.drop_if_empty(key);
                Ok(count(n))
            }
            "time" => Ok(Reply::Array(vec![
                Reply::Bulk((now_us / 1_000_000).to_string().into_bytes()),
                Reply::Bulk((now_us % 1_000_000).to_string().into_bytes()),
            ])),
            "publish" | "spublish" => {
                self.published.push(Published {
                    channel: arg(0).to_vec(),
                    payload: arg(1).to_vec(),
                });
                Ok(Reply::Int(
                    self.subscribers.get(arg(0)).copied().unwrap_or(0),
                ))
            }
            "ping" => Ok(Reply::Status("PONG".into())),
            _ => Err(format!("ERR unknown command '{name}'")),
        }
    }

    /// `SET key value [NX|XX] [GET] [PX ms|PXAT ms|EX s|EXAT s|KEEPTTL]`.
    fn set(&mut self, now: u64, args: &[Vec<u8>]) -> Res<Reply> {
        let (key, value) = match args {
            [k, v, ..] => (k.as_slice(), v.clone()),
            _ => return Err(SYNTAX.to_owned()),
        };
        let (mut nx, mut xx, mut get, mut keepttl) = (false, false, false, false);
        let mut expiry: Option<(&str, &[u8])> = None;
        let mut i = 2;
        while let Some(word) = args.get(i) {
            let w = word.to_ascii_uppercase();
            match w.as_slice() {
                b"NX" if !xx => nx = true,
                b"XX" if !nx => xx = true,
                b"GET" => get = true,
                b"KEEPTTL" if expiry.is_none() => keepttl = true,
                b"PX" | b"PXAT" | b"EX" | b"EXAT" if !keepttl => {
                    let unit = match w.as_slice() {
                        b"PX" => "px",
                        b"PXAT" => "pxat",
                        b"EX" => "ex",
                        _ => "exat",
                    };
                    // The same unit again replaces the value; another unit conflicts.
                    let (Some(v), true) = (args.get(i + 1), expiry.is_none_or(|(u, _)| u == unit))
                    else {
                        return Err(SYNTAX.to_owned());
                    };
                    expiry = Some((unit, v.as_slice()));
                    i += 1;
                }
                _ => return Err(SYNTAX.to_owned()),
            }
            i += 1;
        }
        let at = match expiry {
            None => None,
            Some((unit, raw)) => {
                // Redis reads every option first (a syntax error wins), then the number.
                let v = int(raw)?;
                let seconds = unit == "ex" || unit == "exat";
                if v <= 0 || (seconds && v > i64::MAX / 1000) {
                    return Err("ERR invalid expire time in 'set' command".to_owned());
                }
                let ms = if seconds { v * 1000 } else { v };
                Some(if unit == "px" || unit == "ex" {
                    relative_expiry(now, ms, "set")?
                } else {
                    u64::try_from(ms).unwrap_or(0)
                })
            }
        };
        let old = match self.live(key, now) {
            None => None,
            Some(Entry {
                value: Value::String(s),
                expires_at,
            }) => Some((s.clone(), *expires_at)),
            Some(_) if get => return Err(WRONGTYPE.to_owned()),
            Some(e) => Some((Vec::new(), e.expires_at)),
        };
        let done = !((nx && old.is_some()) || (xx && old.is_none()));
        if done {
            let keep = if keepttl {
                old.as_ref().and_then(|(_, at)| *at)
            } else {
                at
            };
            match keep {
                // An absolute time already past: the key is deleted, not written.
                Some(at) if at <= now && expiry.is_some() => {
                    self.keys.remove(key);
                }
                _ => self.put(key, Value::String(value), keep),
            }
        }
        if get {
            return Ok(old.map_or(Reply::Nil, |(v, _)| Reply::Bulk(v)));
        }
        Ok(if done {
            Reply::Status("OK".into())
        } else {
            Reply::Nil
        })
    }

    /// `PEXPIRE key ms [NX|XX|GT|LT]` and `PEXPIREAT key at [NX|XX|GT|LT]`.
    fn expire(&mut self, name: &str, now: u64, args: &[Vec<u8>]) -> Res<Reply> {
        let (mut nx, mut xx, mut gt, mut lt) = (false, false, false, false);
        for opt in args.get(2..).unwrap_or_default() {
            match opt.to_ascii_uppercase().as_slice() {
                b"NX" => nx = true,
                b"XX" => xx = true,
                b"GT" => gt = true,
                b"LT" => lt = true,
                _ => {
                    return Err(format!(
                        "ERR Unsupported option {}",
                        String::from_utf8_lossy(opt)
                    ));
                }
            }
        }
        if nx && (xx || gt || lt) {
            return Err(
                "ERR NX and XX, GT or LT options at the same time are not compatible".to_owned(),
            );
        }
        if gt && lt {
            return Err("ERR GT and LT options at the same time are not compatible".to_owned());
        }
        let v = int(args.get(1).map_or(&[][..], Vec::as_slice))?;
        let when = if name == "pexpire" {
            let base = i64::try_from(now).unwrap_or(i64::MAX);
            if v > i64::MAX - base || (v < 0 && v < i64::MIN + base) {
                return Err(format!("ERR invalid expire time in '{name}' command"));
            }
            v + base
        } else {
            v
        };
        let key = args.first().map_or(&[][..], Vec::as_slice);
        let Some(e) = self.live(key, now) else {
            return Ok(Reply::Int(0));
        };
        let current = e.expires_at;
        let refused = (nx && current.is_some())
            || (xx && current.is_none())
            || (gt && current.is_none_or(|c| when <= i64::try_from(c).unwrap_or(i64::MAX)))
            || (lt && current.is_some_and(|c| when >= i64::try_from(c).unwrap_or(i64::MAX)));
        if refused {
            return Ok(Reply::Int(0));
        }
        match u64::try_from(when) {
            Ok(at) if at > now => e.expires_at = Some(at),
            _ => {
                self.keys.remove(key);
            }
        }
        Ok(Reply::Int(1))
    }

    /// `ZADD key [NX|XX] [GT|LT] [CH] score member [score member …]`.
    fn zadd(&mut self, now: u64, args: &[Vec<u8>]) -> Res<Reply> {
        let key = args.first().map_or(&[][..], Vec::as_slice);
        let (mut nx, mut xx, mut gt, mut lt, mut ch) = (false, false, false, false, false);
        let mut i = 1;
        while let Some(word) = args.get(i) {
            match word.to_ascii_uppercase().as_slice() {
                b"NX" => nx = true,
                b"XX" => xx = true,
                b"GT" => gt = true,
                b"LT" => lt = true,
                b"CH" => ch = true,
                _ => break,
            }
            i += 1;
        }
        let pairs = args.get(i..).unwrap_or_default();
        if pairs.is_empty() || pairs.len() % 2 != 0 {
            return Err(SYNTAX.to_owned());
        }
        if nx && xx {
            return Err("ERR XX and NX options at the same time are not compatible".to_owned());
        }
        if (nx && (gt || lt)) || (gt && lt) {
            return Err(
                "ERR GT, LT, and/or NX options at the same time are not compatible".to_owned(),
            );
        }
        let mut scored = Vec::with_capacity(pairs.len() / 2);
        for p in pairs.chunks_exact(2) {
            let s = redis_double(&p[0]).ok_or_else(|| NOT_FLOAT.to_owned())?;
            scored.push((s, p[1].clone()));
        }
        if self.zset(key, now)?.is_none() {
            if xx {
                return Ok(Reply::Int(0));
            }
            self.put(key, Value::SortedSet(Vec::new()), None);
        }
        let (mut added, mut changed) = (0usize, 0usize);
        if let Some(z) = self.zset(key, now)? {
            for (score, member) in scored {
                match z.iter().position(|(_, m)| *m == member) {
                    Some(at) => {
                        let cur = z[at].0;
                        if nx || (gt && score <= cur) || (lt && score >= cur) || score == cur {
                            continue;
                        }
                        z.remove(at);
                        changed += 1;
                    }
                    None if xx => continue,
                    None => added += 1,
                }
                let at = z.partition_point(|(s, m)| {
                    *s < score || (*s == score && m.as_slice() < member.as_slice())
                });
                z.insert(at, (score, member));
            }
        }
        self.drop_if_empty(key);
        Ok(count(if ch { added + changed } else { added }))
    }

    /// `ZRANGE key start stop [WITHSCORES]` (by index; other forms are not modelled).
    fn zrange(&mut self, now: u64, args: &[Vec<u8>]) -> Res<Reply> {
        let key = args.first().map_or(&[][..], Vec::as_slice);
        let (start, stop) = match args {
            [_, a, b, ..] => (a, b),
            _ => return Err(SYNTAX.to_owned()),
        };
        let mut withscores = false;
        for opt in args.get(3..).unwrap_or_default() {
            match opt.to_ascii_uppercase().as_slice() {
                b"WITHSCORES" => withscores = true,
                _ => return Err(SYNTAX.to_owned()),
            }
        }
        let (start, stop) = (int(start)?, int(stop)?);
        let Some(z) = self.zset(key, now)? else {
            return Ok(Reply::Array(Vec::new()));
        };
        let len = i64::try_from(z.len()).unwrap_or(i64::MAX);
        let start = if start < 0 {
            (len + start).max(0)
        } else {
            start
        };
        let stop = if stop < 0 {
            len + stop
        } else {
            stop.min(len - 1)
        };
        let mut out = Vec::new();
        if start <= stop && start < len {
            let (a, b) = (
                usize::try_from(start).unwrap_or(0),
                usize::try_from(stop).unwrap_or(0),
            );
            for (s, m) in z.get(a..=b).unwrap_or_default() {
                out.push(bulk(m));
                if withscores {
                    out.push(Reply::Bulk(format_score(*s).into_bytes()));
                }
            }
        }
        Ok(Reply::Array(out))
    }

    /// `ZRANGEBYSCORE key min max [WITHSCORES] [LIMIT offset count]`.
    fn zrangebyscore(&mut self, now: u64, args: &[Vec<u8>]) -> Res<Reply> {
        let key = args.first().map_or(&[][..], Vec::as_slice);
        let (min, max) = match args {
            [_, a, b, ..] => (a, b),
            _ => return Err(SYNTAX.to_owned()),
        };
        let (mut withscores, mut offset, mut limit) = (false, 0i64, -1i64);
        let mut i = 3;
        while let Some(opt) = args.get(i) {
            match opt.to_ascii_uppercase().as_slice() {
                b"WITHSCORES" => withscores = true,
                b"LIMIT" => {
                    let (Some(o), Some(c)) = (args.get(i + 1), args.get(i + 2)) else {
                        return Err(SYNTAX.to_owned());
                    };
                    offset = int(o)?;
                    limit = int(c)?;
                    i += 2;
                }
                _ => return Err(SYNTAX.to_owned()),
            }
            i += 1;
        }
        let (min, max) = (bound(min)?, bound(max)?);
        let Some(z) = self.zset(key, now)? else {
            return Ok(Reply::Array(Vec::new()));
        };
        let mut out = Vec::new();
        if offset >= 0 {
            let skip = usize::try_from(offset).unwrap_or(usize::MAX);
            let take = usize::try_from(limit).unwrap_or(usize::MAX);
            for (s, m) in z
                .iter()
                .filter(|(s, _)| in_range(*s, min, max))
                .skip(skip)
                .take(take)
            {
                out.push(bulk(m));
                if withscores {
                    out.push(Reply::Bulk(format_score(*s).into_bytes()));
                }
            }
        }
        Ok(Reply::Array(out))
    }
}

/// The absolute expiry of a relative TTL of `ms` at `now`, or Redis's error.
fn relative_expiry(now: u64, ms: i64, command: &str) -> Res<u64> {
    let base = i64::try_from(now).unwrap_or(i64::MAX);
    if ms <= 0 || ms > i64::MAX - base {
        return Err(format!("ERR invalid expire time in '{command}' command"));
    }
    Ok(u64::try_from(ms + base).unwrap_or(u64::MAX))
}
