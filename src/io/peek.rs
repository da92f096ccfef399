//! Read-only reads of a resource's keys on one node, for inspection: one `MULTI`/`EXEC`
//! of `GET` and `PTTL` of the lock key, `GET` of the fence counter and, on a herald node,
//! `ZCARD` of the wait queue, decoded into typed readings.
//!
//! This is the I/O half of [`Redlock::inspect`](crate::Redlock::inspect): it knows how to
//! ask a node and how to read its answer, nothing of quorums (the verdict rule is
//! `protocol::inspect`) or of how readings are shown (`inspect`). A transaction makes each
//! node's answer one snapshot: a holder is never paired with the next holder's TTL. An
//! answer of the wrong shape, or any server error, is a failure whose text never holds a
//! token.

use std::time::Duration;

use redis::Value;

use crate::base::resource::Resources;
use crate::io::node::{Node, Reply};

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
}

/// The commands for one resource on node `i` of `n`: `GET` and `PTTL` of the lock key,
/// `GET` of the fence counter, and `ZCARD` of the wait queue on a herald.
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
    let mut out = Vec::with_capacity(heralds.len());
    for &herald in heralds {
        let (Some(get), Some(pttl), Some(fence)) = (it.next(), it.next(), it.next()) else {
            return Err(PeekError::Failed("missing reply".to_owned()));
        };
        let queued = if herald {
            match it.next() {
                Some(v) => Some(count(v)?),
                None => return Err(PeekError::Failed("missing reply".to_owned())),
            }
        } else {
            None
        };
        out.push(resource(get, pttl, fence, queued)?);
    }
    match it.next() {
        None => Ok(out),
        Some(extra) => Err(unexpected(&extra)),
    }
}

/// One resource's replies: the lock value, its `PTTL`, the fence counter, the queue length.
fn resource(get: Value, pttl: Value, fence: Value, queued: Option<u64>) -> Result<Raw, PeekError> {
    let value = match get {
        Value::Nil => None,
        Value::BulkString(b) => Some(b),
        other => return Err(bad(other)),
    };
    // -2: no key; -1: a key without expiry. Within the transaction the key cannot change
    // between the GET and the PTTL, so a value always comes with -1 or a TTL.
    let (value, ttl) = match (value, pttl) {
        (None, Value::Int(_)) => (None, None),
        (Some(_), Value::Int(-2)) => (None, None),
        (Some(v), Value::Int(-1)) => (Some(v), None),
        (Some(v), Value::Int(ms)) => match u64::try_from(ms) {
            Ok(ms) => (Some(v), Some(Duration::from_millis(ms))),
            Err(_) => return Err(unexpected(&Value::Int(ms))),
        },
        (_, other) => return Err(bad(other)),
    };
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

    fn tx(results: Vec<Value>) -> Vec<Value> {
        let mut v = vec![Value::Okay];
        v.extend(results.iter().map(|_| Value::SimpleString("QUEUED".into())));
        v.push(Value::Array(results));
        v
    }

    #[test]
    fn decodes_a_transaction() {
        let token = "0123456789abcdef0123456789abcdef";
        let values = tx(vec![
            bulk(token),
            Value::Int(8200),
            bulk("17"),
            Value::Int(3),
            Value::Nil,
            Value::Int(-2),
            Value::Nil,
        ]);
        let raws = decode(values, &[true, false]).unwrap();
        assert_eq!(raws[0].value.as_deref(), Some(token.as_bytes()));
        assert_eq!(raws[0].ttl, Some(Duration::from_millis(8200)));
        assert_eq!(raws[0].fence, Some(17));
        assert_eq!(raws[0].queued, Some(3));
        assert_eq!(raws[1].value, None);
        assert_eq!(raws[1].ttl, None);
        assert_eq!(raws[1].queued, None);
        // A key without expiry.
        let raws = decode(tx(vec![bulk("abc"), Value::Int(-1), Value::Nil]), &[false]).unwrap();
        assert_eq!(raws[0].ttl, None);
        assert!(raws[0].value.is_some());
    }

    fn failure(values: Vec<Value>, heralds: &[bool]) -> String {
        match decode(values, heralds) {
            Err(PeekError::Failed(e)) => e,
            Err(other) => panic!("{other:?}"),
            Ok(_) => panic!("decoded"),
        }
    }

    #[test]
    fn bad_shapes_are_failures_that_show_no_token() {
        let token = "0123456789abcdef0123456789abcdef";
        // Too few replies, too many, the wrong types, a bad counter, a server error.
        let cases: Vec<(Vec<Value>, &[bool])> = vec![
            (tx(vec![bulk(token), Value::Int(5)]), &[false]),
            (tx(vec![Value::Nil, Value::Int(-2), Value::Nil]), &[true]),
            (
                tx(vec![Value::Nil, Value::Int(-2), Value::Nil, bulk(token)]),
                &[false],
            ),
            (tx(vec![Value::Int(1), Value::Int(5), Value::Nil]), &[false]),
            (tx(vec![bulk(token), bulk(token), Value::Nil]), &[false]),
            (tx(vec![Value::Nil, Value::Int(-2), bulk("x7")]), &[false]),
            (tx(vec![Value::Nil, Value::Int(-2), bulk("-3")]), &[false]),
            (
                tx(vec![Value::Nil, Value::Int(-2), Value::Nil, bulk(token)]),
                &[true],
            ),
            (
                tx(vec![Value::Nil, Value::Int(-2), Value::Nil, Value::Int(-1)]),
                &[true],
            ),
            (vec![Value::Okay, bulk(token)], &[false]),
            (vec![], &[false]),
            (
                tx(vec![
                    redis::parse_redis_value(b"-WRONGTYPE Operation against a key\r\n").unwrap(),
                    Value::Int(5),
                    Value::Nil,
                ]),
                &[false],
            ),
        ];
        for (values, heralds) in cases {
            let e = failure(values.clone(), heralds);
            assert!(!e.contains("0123"), "{e}");
            assert!(!e.is_empty());
        }
    }
}
