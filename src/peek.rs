//! Read-only reads of a resource's keys on one node, for inspection: one `MULTI`/`EXEC`
//! of `TIME` (the node's clock, which the sorted sets' scores are read against), then per
//! resource `GET` and `PTTL` of the lock key, `GET` of the fence counter and, on a herald
//! node, `ZCARD` of the wait queue; `GET` and `PTTL` of the read-write lock's writer key,
//! `ZRANGE … WITHSCORES` of its readers and of its waiting writers' intents;
//! `ZRANGE … WITHSCORES` of the semaphore's holders and `GET` of its configuration;
//! decoded into typed readings. Every key comes from the builders the locks use
//! ([`Resources`], [`RwKeys`], [`SemKeys`]).
//!
//! This is the I/O half of [`Redlock::inspect`](crate::Redlock::inspect): it knows how to
//! ask a node and how to read its answer, nothing of quorums (the verdict rule is
//! `protocol::inspect`) or of how readings are shown (`inspect`). A transaction makes each
//! node's answer one snapshot: a holder is never paired with the next holder's TTL. An
//! answer of the wrong shape, or any server error, is a failure whose text never holds a
//! token.

use std::time::Duration;

use redis::Value;

use crate::node::{Node, Reply};
use crate::resource::{Resources, RwKeys, SemKeys};

/// Why a node gave no reading.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum PeekError {
    /// The node answered with an error, an answer of an unexpected shape, or the
    /// connection failed (the text never holds a password or a whole token).
    Failed(String),
    /// No answer within the per-node timeout.
    TimedOut,
}

/// One node's answer for every resource, or why there is none.
pub(crate) type NodeAnswer = Result<Vec<Raw>, PeekError>;

/// What one node holds for one resource, with the whole lock value (never shown; only
/// compared, to tell holders apart).
pub(crate) struct Raw {
    pub(crate) value: Option<Vec<u8>>,
    pub(crate) ttl: Option<Duration>,
    pub(crate) fence: Option<u64>,
    pub(crate) queued: Option<u64>,
    /// The read-write lock of the same name.
    pub(crate) rw: RawRw,
    /// The semaphore of the same name.
    pub(crate) sem: RawSem,
}

/// A sorted set's live members (score ahead of the node's clock), each with its remaining
/// time, in the set's order (by expiry). Lapsed members the next script will purge are
/// left out.
pub(crate) type Members = Vec<(Vec<u8>, Duration)>;

/// What one node holds for a read-write lock.
#[derive(Debug, Default)]
pub(crate) struct RawRw {
    /// The writer key's value and its TTL (`None`: no expiry).
    pub(crate) writer: Option<(Vec<u8>, Option<Duration>)>,
    /// The live readers.
    pub(crate) readers: Members,
    /// The live intents of waiting writers.
    pub(crate) intents: Members,
}

/// What one node holds for a semaphore.
#[derive(Debug, Default)]
pub(crate) struct RawSem {
    /// The live holders.
    pub(crate) holders: Members,
    /// The stored configuration `P:c:Q:N`, parsed.
    pub(crate) config: Option<SemConfig>,
}

/// A semaphore's stored configuration, `P:c:Q:N`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) struct SemConfig {
    pub(crate) permits: u32,
    pub(crate) limit: u32,
    pub(crate) quorum: usize,
    pub(crate) nodes: usize,
}

impl SemConfig {
    /// Parses `P:c:Q:N` (as `protocol::semaphore::config` writes it).
    fn parse(text: &[u8]) -> Option<SemConfig> {
        let text = std::str::from_utf8(text).ok()?;
        let mut parts = text.split(':');
        let config = SemConfig {
            permits: parts.next()?.parse().ok()?,
            limit: parts.next()?.parse().ok()?,
            quorum: parts.next()?.parse().ok()?,
            nodes: parts.next()?.parse().ok()?,
        };
        parts.next().is_none().then_some(config)
    }
}

/// The commands for one resource on node `i` of `n`: `GET` and `PTTL` of the lock key,
/// `GET` of the fence counter, and `ZCARD` of the wait queue on a herald; then the
/// read-write lock's and the semaphore's keys of the same name (see the module docs).
fn commands(pipe: &mut redis::Pipeline, res: &Resources, herald: bool) {
    let lock = res
        .lock_keys()
        .first()
        .map(Vec::as_slice)
        .unwrap_or_default();
    let fence = res.fence_keys().into_iter().next().unwrap_or_default();
    pipe.cmd("GET")
        .arg(lock)
        .cmd("PTTL")
        .arg(lock)
        .cmd("GET")
        .arg(fence);
    if herald {
        let [queue, _lease, _attrs] = res.queue_keys();
        pipe.cmd("ZCARD").arg(queue);
    }
    let name = res.names().first().map_or("", String::as_str);
    let rw = RwKeys::new(name, res.keyspace());
    let sem = SemKeys::new(name, res.keyspace());
    pipe.cmd("GET")
        .arg(&rw.writer)
        .cmd("PTTL")
        .arg(&rw.writer)
        .cmd("ZRANGE")
        .arg(&rw.readers)
        .arg(0)
        .arg(-1)
        .arg("WITHSCORES")
        .cmd("ZRANGE")
        .arg(&rw.intent)
        .arg(0)
        .arg(-1)
        .arg("WITHSCORES")
        .cmd("ZRANGE")
        .arg(&sem.holders)
        .arg(0)
        .arg(-1)
        .arg("WITHSCORES")
        .cmd("GET")
        .arg(&sem.config);
}

/// Reads every resource on one node: in one read-only transaction, or on a Redis Cluster
/// voter in one per resource.
pub(crate) async fn read_node(
    node: &Node,
    i: usize,
    n: usize,
    resources: &[Resources],
    timeout: Duration,
) -> NodeAnswer {
    if node.is_cluster() && resources.len() > 1 {
        // A transaction touches one slot: on a Redis Cluster voter, one per resource.
        let reads = resources
            .iter()
            .map(|r| read_transaction(node, i, n, std::slice::from_ref(r), timeout));
        let mut all = Vec::with_capacity(resources.len());
        for answer in futures::future::join_all(reads).await {
            all.extend(answer?);
        }
        return Ok(all);
    }
    read_transaction(node, i, n, resources, timeout).await
}

/// Reads `resources` on one node in one read-only transaction.
async fn read_transaction(
    node: &Node,
    i: usize,
    n: usize,
    resources: &[Resources],
    timeout: Duration,
) -> NodeAnswer {
    let mut pipe = redis::pipe();
    pipe.atomic();
    let heralds: Vec<bool> = resources.iter().map(|r| r.is_herald(i, n)).collect();
    pipe.cmd("TIME");
    for (res, herald) in resources.iter().zip(&heralds) {
        commands(&mut pipe, res, *herald);
    }
    let count = pipe.len();
    // MULTI's OK, one QUEUED per command, then EXEC's array.
    let values = match node.pipeline(&pipe, count + 2, timeout).await {
        Ok(v) => v,
        Err(Reply::TimedOut) => return Err(PeekError::TimedOut),
        Err(Reply::Error(e)) => return Err(PeekError::Failed(Reply::error_text(&e))),
        Err(Reply::Value(v)) => return Err(unexpected(&v)),
    };
    decode(values, &heralds)
}

/// Decodes a node's transaction replies: `[OK, QUEUED…, [results…]]`.
fn decode(values: Vec<Value>, heralds: &[bool]) -> NodeAnswer {
    // A command refused while queueing (an ACL, an unknown command) aborts the transaction;
    // its own error says why.
    if let Some(e) = values.iter().find_map(server_error) {
        return Err(e);
    }
    let results = match values.into_iter().last() {
        Some(Value::Array(r)) => r,
        Some(other) => return Err(unexpected(&other)),
        None => return Err(PeekError::Failed("no reply".to_owned())),
    };
    let mut it = results.into_iter();
    let mut next = || {
        it.next()
            .ok_or_else(|| PeekError::Failed("missing reply".to_owned()))
    };
    let now = node_ms(next()?)?;
    let mut out = Vec::with_capacity(heralds.len());
    for &herald in heralds {
        let (get, pttl, fence) = (next()?, next()?, next()?);
        let queued = if herald { Some(count(next()?)?) } else { None };
        let mut raw = resource(get, pttl, fence, queued)?;
        let (writer, writer_ttl) = key_with_ttl(next()?, next()?)?;
        raw.rw = RawRw {
            writer: writer.map(|w| (w, writer_ttl)),
            readers: members(next()?, now)?,
            intents: members(next()?, now)?,
        };
        let holders = members(next()?, now)?;
        let config = match next()? {
            Value::Nil => None,
            Value::BulkString(b) => Some(SemConfig::parse(&b).ok_or_else(|| {
                PeekError::Failed("the semaphore's configuration is not P:c:Q:N".to_owned())
            })?),
            other => return Err(bad(other)),
        };
        raw.sem = RawSem { holders, config };
        out.push(raw);
    }
    match it.next() {
        None => Ok(out),
        Some(extra) => Err(unexpected(&extra)),
    }
}

/// The reply to `TIME`, in milliseconds: the node's clock, as the scripts compute `now`.
fn node_ms(time: Value) -> Result<u64, PeekError> {
    let parts = match time {
        Value::Array(parts) => parts,
        other => return Err(bad(other)),
    };
    let number = |v: &Value| -> Option<u64> {
        match v {
            Value::BulkString(b) => std::str::from_utf8(b).ok()?.parse().ok(),
            Value::Int(i) => u64::try_from(*i).ok(),
            _ => None,
        }
    };
    match parts.as_slice() {
        [secs, micros] => match (number(secs), number(micros)) {
            (Some(s), Some(us)) => Ok(s.saturating_mul(1000).saturating_add(us / 1000)),
            _ => Err(PeekError::Failed("unexpected reply to TIME".to_owned())),
        },
        _ => Err(PeekError::Failed("unexpected reply to TIME".to_owned())),
    }
}

/// The live members of a sorted set from `ZRANGE … WITHSCORES` (flat `member, score` pairs
/// in RESP2, `[member, score]` arrays in RESP3), each with its time left after `now`.
fn members(reply: Value, now: u64) -> Result<Members, PeekError> {
    let items = match reply {
        Value::Array(items) => items,
        Value::Nil => return Ok(Vec::new()),
        other => return Err(bad(other)),
    };
    let mut pairs: Vec<(Value, Value)> = Vec::with_capacity(items.len() / 2 + 1);
    let mut it = items.into_iter().peekable();
    while let Some(item) = it.next() {
        match item {
            Value::Array(pair) => {
                let mut pair = pair.into_iter();
                match (pair.next(), pair.next(), pair.next()) {
                    (Some(m), Some(s), None) => pairs.push((m, s)),
                    _ => return Err(PeekError::Failed("unexpected sorted-set reply".to_owned())),
                }
            }
            m => match it.next() {
                Some(s) => pairs.push((m, s)),
                None => return Err(PeekError::Failed("unexpected sorted-set reply".to_owned())),
            },
        }
    }
    let mut out = Vec::with_capacity(pairs.len());
    for (member, score) in pairs {
        let member = match member {
            Value::BulkString(b) => b,
            other => return Err(bad(other)),
        };
        let score = match score {
            Value::Double(d) => d,
            Value::Int(i) => i as f64,
            Value::BulkString(b) => std::str::from_utf8(&b)
                .ok()
                .and_then(|s| s.parse::<f64>().ok())
                .ok_or_else(|| {
                    PeekError::Failed("a sorted-set score is not a number".to_owned())
                })?,
            other => return Err(bad(other)),
        };
        // Live while the score is ahead of the node's clock, as the scripts purge.
        if score.is_nan() {
            return Err(PeekError::Failed(
                "a sorted-set score is not a number".to_owned(),
            ));
        }
        let left = score - now as f64;
        if left > 0.0 {
            // `as` saturates: an infinite score is the longest duration, never a panic.
            out.push((member, Duration::from_millis(left.ceil() as u64)));
        }
    }
    Ok(out)
}

/// A string key's `GET` and `PTTL` replies: its value and TTL (`None`: no expiry).
fn key_with_ttl(get: Value, pttl: Value) -> Result<(Option<Vec<u8>>, Option<Duration>), PeekError> {
    let value = match get {
        Value::Nil => None,
        Value::BulkString(b) => Some(b),
        other => return Err(bad(other)),
    };
    // -2: no key; -1: a key without expiry. Within the transaction the key cannot change
    // between the GET and the PTTL, so a value always comes with -1 or a TTL.
    Ok(match (value, pttl) {
        (None, Value::Int(_)) => (None, None),
        (Some(_), Value::Int(-2)) => (None, None),
        (Some(v), Value::Int(-1)) => (Some(v), None),
        (Some(v), Value::Int(ms)) => match u64::try_from(ms) {
            Ok(ms) => (Some(v), Some(Duration::from_millis(ms))),
            Err(_) => return Err(unexpected(&Value::Int(ms))),
        },
        (_, other) => return Err(bad(other)),
    })
}

/// One resource's replies: the lock value, its `PTTL`, the fence counter, the queue length.
fn resource(get: Value, pttl: Value, fence: Value, queued: Option<u64>) -> Result<Raw, PeekError> {
    let (value, ttl) = key_with_ttl(get, pttl)?;
    let fence = match fence {
        Value::Nil => None,
        Value::Int(i) => Some(u64::try_from(i).map_err(|_| counter_error())?),
        Value::BulkString(b) => Some(
            std::str::from_utf8(&b)
                .ok()
                .and_then(|s| s.parse::<u64>().ok())
                .ok_or_else(counter_error)?,
        ),
        other => return Err(bad(other)),
    };
    Ok(Raw {
        value,
        ttl,
        fence,
        queued,
        rw: RawRw::default(),
        sem: RawSem::default(),
    })
}

fn count(v: Value) -> Result<u64, PeekError> {
    match v {
        Value::Int(i) => u64::try_from(i).map_err(|_| unexpected(&Value::Int(i))),
        other => Err(bad(other)),
    }
}

fn counter_error() -> PeekError {
    PeekError::Failed("the fence counter is not a non-negative integer".to_owned())
}

/// A server error reply as a failure, with its text.
fn server_error(v: &Value) -> Option<PeekError> {
    match v {
        Value::ServerError(e) => {
            let e: redis::RedisError = e.clone().into();
            Some(PeekError::Failed(Reply::error_text(&e)))
        }
        _ => None,
    }
}

/// A reply of the wrong shape (or a server error in its place) as a failure.
fn bad(v: Value) -> PeekError {
    server_error(&v).unwrap_or_else(|| unexpected(&v))
}

/// A reply of an unexpected shape. Only its kind is shown: it could hold a token.
fn unexpected(v: &Value) -> PeekError {
    let kind = match v {
        Value::Nil => "nil",
        Value::Int(_) => "an integer",
        Value::BulkString(_) => "a string",
        Value::Array(_) => "an array",
        Value::SimpleString(_) => "a status",
        Value::Okay => "OK",
        Value::Map(_) => "a map",
        Value::Set(_) => "a set",
        Value::Double(_) => "a double",
        Value::Boolean(_) => "a boolean",
        Value::ServerError(_) => "an error",
        _ => "a value of another type",
    };
    PeekError::Failed(format!("unexpected reply: {kind}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bulk(s: &str) -> Value {
        Value::BulkString(s.as_bytes().to_vec())
    }

    /// `TIME` at 1000 s on the node's clock.
    fn time() -> Value {
        Value::Array(vec![bulk("1000"), bulk("250000")])
    }

    /// The replies of a free read-write lock and a free semaphore.
    fn free_kinds() -> Vec<Value> {
        vec![
            Value::Nil,
            Value::Int(-2),
            Value::Array(vec![]),
            Value::Array(vec![]),
            Value::Array(vec![]),
            Value::Nil,
        ]
    }

    /// A transaction's replies: `TIME`, then each resource's own replies (the mutex's,
    /// then the other kinds').
    fn tx(resources: Vec<Vec<Value>>) -> Vec<Value> {
        let mut results = vec![time()];
        results.extend(resources.into_iter().flatten());
        let mut v = vec![Value::Okay];
        v.extend(results.iter().map(|_| Value::SimpleString("QUEUED".into())));
        v.push(Value::Array(results));
        v
    }

    /// A mutex's replies followed by free other kinds.
    fn mutex_only(mutex: Vec<Value>) -> Vec<Value> {
        let mut v = mutex;
        v.extend(free_kinds());
        v
    }

    #[test]
    fn decodes_a_transaction() {
        let token = "0123456789abcdef0123456789abcdef";
        let values = tx(vec![
            mutex_only(vec![
                bulk(token),
                Value::Int(8200),
                bulk("17"),
                Value::Int(3),
            ]),
            mutex_only(vec![Value::Nil, Value::Int(-2), Value::Nil]),
        ]);
        let raws = decode(values, &[true, false]).unwrap();
        assert_eq!(raws[0].value.as_deref(), Some(token.as_bytes()));
        assert_eq!(raws[0].ttl, Some(Duration::from_millis(8200)));
        assert_eq!(raws[0].fence, Some(17));
        assert_eq!(raws[0].queued, Some(3));
        assert_eq!(raws[1].value, None);
        assert_eq!(raws[1].ttl, None);
        assert_eq!(raws[1].queued, None);
        assert!(raws[1].rw.writer.is_none() && raws[1].rw.readers.is_empty());
        assert!(raws[1].sem.holders.is_empty() && raws[1].sem.config.is_none());
        // A key without expiry.
        let raws = decode(
            tx(vec![mutex_only(vec![
                bulk("abc"),
                Value::Int(-1),
                Value::Nil,
            ])]),
            &[false],
        )
        .unwrap();
        assert_eq!(raws[0].ttl, None);
        assert!(raws[0].value.is_some());
    }

    #[test]
    fn decodes_readers_intents_and_permits_in_both_protocols() {
        let ms = Duration::from_millis;
        // The node's clock is 1_000_250 ms: a score below it has lapsed.
        let readers_resp2 = Value::Array(vec![
            bulk("lapsed"),
            bulk("1000000"),
            bulk("reader-a"),
            bulk("1008450"),
            bulk("reader-b"),
            bulk("1.00905e6"),
        ]);
        let intents_resp3 = Value::Array(vec![Value::Array(vec![
            bulk("intent-1"),
            Value::Double(1_003_250.0),
        ])]);
        let holders = Value::Array(vec![bulk("permit-1"), bulk("+inf")]);
        let values = tx(vec![vec![
            Value::Nil,
            Value::Int(-2),
            Value::Nil,
            bulk("writer"),
            Value::Int(900),
            readers_resp2,
            intents_resp3,
            holders,
            bulk("2:2:4:5"),
        ]]);
        let raws = decode(values, &[false]).unwrap();
        let rw = &raws[0].rw;
        assert_eq!(rw.writer, Some((b"writer".to_vec(), Some(ms(900)))));
        assert_eq!(
            rw.readers,
            [
                (b"reader-a".to_vec(), ms(8200)),
                (b"reader-b".to_vec(), ms(8800))
            ]
        );
        assert_eq!(rw.intents, [(b"intent-1".to_vec(), ms(3000))]);
        let sem = &raws[0].sem;
        assert_eq!(sem.holders.len(), 1);
        assert_eq!(
            sem.config,
            Some(SemConfig {
                permits: 2,
                limit: 2,
                quorum: 4,
                nodes: 5
            })
        );
    }

    fn failure(values: Vec<Value>, heralds: &[bool]) -> String {
        match decode(values, heralds) {
            Err(PeekError::Failed(e)) => e,
            Err(other) => panic!("{other:?}"),
            Ok(_) => panic!("decoded"),
        }
    }

    /// Mutex replies of the wrong shape: too few, too many, the wrong types, a bad counter,
    /// a server error.
    fn bad_mutex_replies(token: &str) -> Vec<(Vec<Value>, &'static [bool])> {
        let free = || vec![Value::Nil, Value::Int(-2), Value::Nil];
        let one = |v: Vec<Value>| tx(vec![mutex_only(v)]);
        let gone = || Value::Int(-2);
        let wrong_type = redis::parse_redis_value(b"-WRONGTYPE Operation against a key\r\n");
        vec![
            (tx(vec![vec![bulk(token), Value::Int(5)]]), &[false]),
            (tx(vec![free()]), &[true]),
            (tx(vec![mutex_only(free()), vec![bulk(token)]]), &[false]),
            (
                one(vec![Value::Int(1), Value::Int(5), Value::Nil]),
                &[false],
            ),
            (one(vec![bulk(token), bulk(token), Value::Nil]), &[false]),
            (one(vec![Value::Nil, gone(), bulk("x7")]), &[false]),
            (one(vec![Value::Nil, gone(), bulk("-3")]), &[false]),
            (
                one(vec![Value::Nil, gone(), Value::Nil, bulk(token)]),
                &[true],
            ),
            (
                one(vec![Value::Nil, gone(), Value::Nil, Value::Int(-1)]),
                &[true],
            ),
            (
                one(vec![wrong_type.unwrap(), Value::Int(5), Value::Nil]),
                &[false],
            ),
        ]
    }

    #[test]
    fn bad_shapes_are_failures_that_show_no_token() {
        let token = "0123456789abcdef0123456789abcdef";
        let mut cases = bad_mutex_replies(token);
        cases.push((vec![Value::Okay, bulk(token)], &[false]));
        cases.push((vec![], &[false]));
        for (values, heralds) in cases {
            let e = failure(values.clone(), heralds);
            assert!(!e.contains("0123"), "{e}");
            assert!(!e.is_empty());
        }
    }

    #[test]
    fn bad_replies_of_the_other_kinds_are_failures_that_show_no_token() {
        let token = "0123456789abcdef0123456789abcdef";
        let free = || vec![Value::Nil, Value::Int(-2), Value::Nil];
        let with_kinds = |kinds: Vec<Value>| {
            let mut v = free();
            v.extend(kinds);
            v
        };
        let mut bad_kinds = Vec::new();
        for (at, value) in [
            (2, bulk(token)),
            (2, Value::Array(vec![bulk(token)])),
            (2, Value::Array(vec![bulk(token), bulk("soon")])),
            (3, Value::Array(vec![Value::Array(vec![bulk(token)])])),
            (4, Value::Array(vec![Value::Int(3), bulk("5")])),
            (4, Value::Array(vec![bulk(token), bulk("nan")])),
            (5, bulk(&format!("{token}:2"))),
            (5, bulk("2:2:4")),
            (5, Value::Int(7)),
            (1, bulk(token)),
        ] {
            let mut kinds = free_kinds();
            kinds[at] = value;
            bad_kinds.push(with_kinds(kinds));
        }
        let mut cases: Vec<Vec<Value>> = bad_kinds.into_iter().map(|k| tx(vec![k])).collect();
        // A bad TIME reply.
        let mut v = tx(vec![mutex_only(free())]);
        if let Some(Value::Array(results)) = v.last_mut() {
            results[0] = bulk(token);
        }
        cases.push(v);
        for values in cases {
            let e = failure(values, &[false]);
            assert!(!e.contains("0123"), "{e}");
            assert!(!e.is_empty());
        }
    }
}
