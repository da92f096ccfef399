//! Metrics (feature `metrics`) against real `redis-server`s, on nodes that need an ACL user
//! and password:
//!
//! * `exact_values_with_a_debugging_recorder`: every operation of a scripted run (acquired,
//!   refused, extended, released, lost by an extension, lost by a watchdog cap, dropped, a
//!   split vote, a hand-off, waits that time out) and the exact value of every series it
//!   must move, from `metrics-util`'s `DebuggingRecorder` installed for this test's thread;
//! * `prometheus_scrape_moves_between_scrapes`: the Prometheus exporter's HTTP listener on
//!   an ephemeral loopback port, scraped twice around more work (a kept lock lost when two
//!   of three nodes are killed);
//! * `docs_list_every_metric`: every metric name in the source is in the operations guide.
//!
//! Both Redis tests check that no label value holds the password or a lock token.
#![cfg(feature = "metrics")]

mod support;

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::time::Duration;

use metrics_exporter_prometheus::{Matcher, PrometheusBuilder};
use metrics_util::debugging::{DebugValue, DebuggingRecorder};
use metrics_util::{CompositeKey, MetricKind};
use quorumlock::{Error, LostReason, Redlock, Retry, Watchdog};
use quorumlock_testkit::LocalCluster;
use redis::AsyncCommands;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

type TestResult = Result<(), Box<dyn std::error::Error + Send + Sync>>;

const USER: &str = "metricsuser";
const PASSWORD: &str = "pw-9c2e41d7b3a8f065";
const TTL: Duration = Duration::from_secs(10);

/// A cluster whose nodes know the ACL user `USER` with `PASSWORD` (the default user stays
/// open for the kit's probes and the tests' raw connections).
async fn cluster(nodes: usize, proxies: bool) -> LocalCluster {
    LocalCluster::builder(nodes)
        .proxies(proxies)
        .args(["--user", USER, "on"])
        .arg(format!(">{PASSWORD}"))
        .args(["~*", "&*", "+@all"])
        .launch()
        .await
        .expect("start redis-server nodes (is redis-server installed?)")
}

/// The cluster's URLs, with the ACL user and password.
fn authed(cluster: &LocalCluster) -> Vec<String> {
    cluster
        .urls()
        .iter()
        .map(|u| u.replacen("redis://", &format!("redis://{USER}:{PASSWORD}@"), 1))
        .collect()
}

/// One series: name and labels (sorted).
type Series = (String, BTreeMap<String, String>);

fn series(name: &str, labels: &[(&str, &str)]) -> Series {
    let labels = labels
        .iter()
        .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
        .collect();
    (name.to_owned(), labels)
}

/// What a debugging recorder saw: counters, gauges, and each histogram's observations.
#[derive(Default, Debug)]
struct Seen {
    counters: BTreeMap<Series, u64>,
    gauges: BTreeMap<Series, f64>,
    histograms: BTreeMap<Series, Vec<f64>>,
    described: Vec<String>,
}

impl Seen {
    fn counter(&self, name: &str, labels: &[(&str, &str)]) -> u64 {
        self.counters
            .get(&series(name, labels))
            .copied()
            .unwrap_or(0)
    }

    fn observations(&self, name: &str, labels: &[(&str, &str)]) -> &[f64] {
        self.histograms
            .get(&series(name, labels))
            .map_or(&[][..], Vec::as_slice)
    }

    /// The number of observations of `name` over every series whose labels include `with`.
    fn count_where(&self, name: &str, with: &[(&str, &str)]) -> usize {
        self.histograms
            .iter()
            .filter(|((n, l), _)| {
                n == name
                    && with
                        .iter()
                        .all(|(k, v)| l.get(*k).map(String::as_str) == Some(*v))
            })
            .map(|(_, v)| v.len())
            .sum()
    }

    /// Sum of a counter over every label set.
    fn counter_sum(&self, name: &str) -> u64 {
        self.counters
            .iter()
            .filter(|((n, _), _)| n == name)
            .map(|(_, v)| *v)
            .sum()
    }

    fn label_values(&self) -> Vec<String> {
        let keys = self
            .counters
            .keys()
            .chain(self.gauges.keys())
            .chain(self.histograms.keys());
        keys.flat_map(|(_, l)| l.values().cloned()).collect()
    }
}

fn seen(recorder: &DebuggingRecorder) -> Seen {
    let mut out = Seen::default();
    for (ck, _unit, desc, value) in recorder.snapshotter().snapshot().into_vec() {
        let (kind, key): (MetricKind, _) = CompositeKey::into_parts(ck);
        let labels = key
            .labels()
            .map(|l| (l.key().to_owned(), l.value().to_owned()))
            .collect();
        let s = (key.name().to_owned(), labels);
        if desc.is_some() {
            out.described.push(key.name().to_owned());
        }
        match (kind, value) {
            (MetricKind::Counter, DebugValue::Counter(v)) => {
                *out.counters.entry(s).or_default() += v;
            }
            (MetricKind::Gauge, DebugValue::Gauge(v)) => {
                out.gauges.insert(s, v.into_inner());
            }
            (MetricKind::Histogram, DebugValue::Histogram(v)) => {
                out.histograms
                    .entry(s)
                    .or_default()
                    .extend(v.into_iter().map(|f| f.into_inner()));
            }
            other => panic!("unexpected metric kind/value {other:?}"),
        }
    }
    out
}

/// `INFO commandstats` calls of `cmd` on node `i`.
async fn calls(cluster: &LocalCluster, i: usize, cmd: &str) -> u64 {
    let mut c = support::raw(cluster, i).await;
    let info: String = redis::cmd("INFO")
        .arg("commandstats")
        .query_async(&mut c)
        .await
        .expect("INFO");
    let prefix = format!("cmdstat_{cmd}:calls=");
    info.lines()
        .find_map(|l| l.strip_prefix(&prefix))
        .and_then(|rest| rest.split(',').next())
        .and_then(|n| n.parse().ok())
        .unwrap_or(0)
}

/// Waits (bounded) until every node has a subscriber on the resource's release channel.
async fn subscribed(cluster: &LocalCluster, resource: &str) -> bool {
    let channel = format!("quorumlock:released:{resource}");
    for i in 0..cluster.len() {
        let c = support::raw(cluster, i).await;
        let ok = support::eventually(Duration::from_secs(5), || {
            let mut c = c.clone();
            let channel = channel.clone();
            async move {
                let v: Vec<(String, u64)> = redis::cmd("PUBSUB")
                    .arg("NUMSUB")
                    .arg(&channel)
                    .query_async(&mut c)
                    .await
                    .unwrap_or_default();
                v.first().is_some_and(|(_, n)| *n > 0)
            }
        })
        .await;
        if !ok {
            return false;
        }
    }
    true
}

/// On how many nodes the resource's wait queue has exactly `n` entries.
async fn queued_on(cluster: &LocalCluster, resource: &str, n: u64) -> usize {
    let key = format!("quorumlock:queue:{resource}");
    let mut on = 0;
    for i in 0..cluster.len() {
        let mut c = support::raw(cluster, i).await;
        let size: u64 = c.zcard(&key).await.unwrap_or(0);
        if size == n {
            on += 1;
        }
    }
    on
}

/// The scripted run: what it did, for the expected values.
#[derive(Default)]
struct Ran {
    tokens: Vec<String>,
    flushes: u64,
}

async fn scripted_run(cluster: &LocalCluster) -> Result<Ran, Box<dyn std::error::Error>> {
    let mut ran = Ran::default();
    let locks = Redlock::builder(authed(cluster)).build().await?;

    // Acquired, refused, extended, released.
    let mut a = locks.try_lock("m:a", TTL).await?;
    ran.tokens.push(a.token().to_owned());
    let refused = locks.try_lock("m:a", TTL).await.unwrap_err();
    assert!(refused.is_held(), "{refused}");
    a.extend(TTL).await?;
    a.release().await?;

    // Lost by an extension: the keys were deleted behind the holder's back.
    let mut b = locks.try_lock("m:b", TTL).await?;
    ran.tokens.push(b.token().to_owned());
    for i in 0..cluster.len() {
        let _: () = support::raw(cluster, i)
            .await
            .del(support::lock_key("m:b"))
            .await?;
    }
    match b.extend(TTL).await {
        Err(Error::Lost(l)) => assert_eq!(l.reason(), LostReason::NotHeld),
        other => panic!("extend after the keys were deleted: {other:?}"),
    }
    let released = b.release().await.unwrap_err();
    assert!(released.is_lost(), "{released}");

    // A kept lock stopped by its cap after one watchdog extension. Its own client gives
    // each node 500 ms (the default for a 1 s TTL is 20 ms, which a loaded machine can
    // miss, and a missed round would be retried: one more round than counted below).
    let patient = Redlock::builder(authed(cluster))
        .node_timeout(Duration::from_millis(500))
        .build()
        .await?;
    let c = patient.try_lock("m:c", Duration::from_secs(1)).await?;
    ran.tokens.push(c.token().to_owned());
    let kept = c
        .keep_alive(Watchdog::new().refresh_at(0.95).max_extensions(1))
        .expect("a watchdog policy that fits the TTL");
    let lost = tokio::time::timeout(Duration::from_secs(5), kept.lost()).await?;
    assert_eq!(lost.reason(), LostReason::MaxExtensions, "{lost}");
    assert!(
        kept.release().await.is_err(),
        "a capped lock reports its loss"
    );

    // Dropped without release.
    let d = locks.try_lock("m:d", TTL).await?;
    ran.tokens.push(d.token().to_owned());
    drop(d);

    // A waiting call that acquires at once.
    let w = locks.lock("m:w", TTL).await?;
    ran.tokens.push(w.token().to_owned());
    w.release().await?;

    // A split vote: two different holders on nodes 0 and 1, node 2 free; nodes 0 and 1
    // answer late, so all three answers are in when the round decides.
    for (i, owner) in [(0, "a".repeat(32)), (1, "b".repeat(32))] {
        let _: () = support::raw(cluster, i)
            .await
            .set_ex(support::lock_key("m:s"), owner, 30)
            .await?;
    }
    cluster.delay(0, Duration::from_millis(30))?;
    cluster.delay(1, Duration::from_millis(30))?;
    let split = locks
        .lock_with("m:s", TTL, Retry::new().attempts(1))
        .await
        .unwrap_err();
    assert!(matches!(split, Error::Timeout(_)), "{split}");
    cluster.delay(0, Duration::ZERO)?;
    cluster.delay(1, Duration::ZERO)?;
    for i in 0..2 {
        let _: () = support::raw(cluster, i)
            .await
            .del(support::lock_key("m:s"))
            .await?;
    }

    // A hand-off. A first waiting call subscribes the client to the resource's channel and
    // gives up after two attempts (the channel stays subscribed a few seconds), so the
    // waiter that follows is not woken by the subscription itself; both use the holder's
    // client, whose connections carry the release ahead of the waiter's attempt.
    let x = locks.try_lock("m:h", TTL).await?;
    ran.tokens.push(x.token().to_owned());
    let warm = Retry::new()
        .attempts(2)
        .delay(Duration::from_millis(50), Duration::from_millis(50));
    let gave_up = locks.lock_with("m:h", TTL, warm).await.unwrap_err();
    assert!(matches!(gave_up, Error::Timeout(_)), "{gave_up}");
    assert!(locks.flush(Duration::from_secs(5)).await, "flush");
    ran.flushes += 1;
    assert!(subscribed(cluster, "m:h").await, "subscribed on every node");
    let sets = calls(cluster, 0, "set").await;
    let waiter = tokio::spawn({
        let locks = locks.clone();
        let slow = Retry::new()
            .delay(Duration::from_secs(3), Duration::from_secs(3))
            .max_wait(Duration::from_secs(20));
        async move { locks.lock_with("m:h", TTL, slow).await }
    });
    let queued = support::eventually(Duration::from_secs(5), || async {
        queued_on(cluster, "m:h", 1).await == cluster.len()
    })
    .await;
    assert!(queued, "the waiter queued on every node");
    let one = support::eventually(Duration::from_secs(2), || async {
        calls(cluster, 0, "set").await == sets + 1
    })
    .await;
    assert!(
        one,
        "exactly one attempt so far (not woken by the subscription)"
    );
    x.release().await?;
    let handed = tokio::time::timeout(Duration::from_secs(2), waiter).await???;
    ran.tokens.push(handed.token().to_owned());
    handed.release().await?;

    assert!(locks.flush(Duration::from_secs(5)).await, "flush");
    ran.flushes += 1;
    Ok(ran)
}

/// Every series a scripted run must move, with its exact value.
#[test]
fn exact_values_with_a_debugging_recorder() -> TestResult {
    let recorder = DebuggingRecorder::new();
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    // Everything (the client, its background tasks, the watchdog) runs on this thread, which
    // records into `recorder`; other tests' metrics do not reach it.
    let cluster = rt.block_on(cluster(3, true));
    let ran = metrics::with_local_recorder(&recorder, || rt.block_on(scripted_run(&cluster)))
        .map_err(|e| e.to_string())?;
    let s = seen(&recorder);
    let pairs = |m: &BTreeMap<Series, u64>| {
        m.iter()
            .map(|((n, l), v)| format!("{n}{l:?} {v}"))
            .collect::<Vec<_>>()
            .join("\n")
    };
    println!("counters:\n{}", pairs(&s.counters));

    // Attempts: acquired a, b, c, d, w, x (the hand-off is a transfer: the waiter holds with
    // no attempt of its own); refused: a's second attempt, the split vote, the warm-up's
    // two attempts, the waiter's first.
    let acq = "quorumlock_acquire_total";
    assert_eq!(s.counter(acq, &[("outcome", "acquired")]), 6);
    assert_eq!(s.counter(acq, &[("outcome", "held")]), 5);
    assert_eq!(s.counter_sum(acq), 11);
    let acq_s = "quorumlock_acquire_seconds";
    assert_eq!(s.observations(acq_s, &[("outcome", "acquired")]).len(), 6);
    assert_eq!(s.observations(acq_s, &[("outcome", "held")]).len(), 5);
    let ext = "quorumlock_extend_total";
    assert_eq!(s.counter(ext, &[("outcome", "extended")]), 1);
    assert_eq!(s.counter(ext, &[("outcome", "lost")]), 1);
    assert_eq!(s.counter_sum(ext), 2);
    let rel = "quorumlock_release_total";
    assert_eq!(s.counter(rel, &[("outcome", "released")]), 5);
    assert_eq!(s.counter(rel, &[("outcome", "expired")]), 1);
    assert_eq!(s.counter_sum(rel), 6);
    for (name, n) in [
        ("quorumlock_extend_seconds", 2),
        ("quorumlock_release_seconds", 6),
    ] {
        let all: usize = ["extended", "lost", "released", "expired"]
            .iter()
            .map(|o| s.observations(name, &[("outcome", o)]).len())
            .sum();
        assert_eq!(all, n, "{name}");
    }

    // Validity at grant: each acquisition, the one extension, the one watchdog extension;
    // never more than the TTL.
    let grant = "quorumlock_grant_validity_seconds";
    let acquired = s.observations(grant, &[("op", "acquire")]);
    assert_eq!(acquired.len(), 6);
    assert!(acquired.iter().all(|v| *v > 0.0 && *v <= TTL.as_secs_f64()));
    assert_eq!(s.observations(grant, &[("op", "extend")]).len(), 1);
    let watchdog = s.observations(grant, &[("op", "watchdog")]);
    assert_eq!(watchdog.len(), 1);
    assert!(watchdog[0] > 0.5 && watchdog[0] <= 1.0, "{watchdog:?}");

    // Losses, drops, contention, waiting.
    let lost = "quorumlock_locks_lost_total";
    assert_eq!(s.counter(lost, &[("reason", "not_held")]), 1);
    assert_eq!(s.counter(lost, &[("reason", "max_extensions")]), 1);
    assert_eq!(s.counter_sum(lost), 2);
    assert_eq!(s.counter("quorumlock_locks_dropped_total", &[]), 1);
    assert_eq!(s.counter("quorumlock_split_votes_total", &[]), 1);
    assert_eq!(s.counter("quorumlock_handoffs_total", &[]), 1);
    let wait = "quorumlock_wait_seconds";
    assert_eq!(s.observations(wait, &[("outcome", "acquired")]).len(), 2);
    assert_eq!(s.observations(wait, &[("outcome", "timeout")]).len(), 2);
    assert_eq!(s.observations(wait, &[("outcome", "error")]).len(), 0);

    // The watchdog: one round, one extension, then the cap.
    assert_eq!(s.counter("quorumlock_watchdog_rounds_total", &[]), 1);
    let kept = "quorumlock_watchdog_extensions_total";
    assert_eq!(s.counter(kept, &[("outcome", "extended")]), 1);
    assert_eq!(s.counter_sum(kept), 1);

    // flush.
    let flushed = "quorumlock_flush_total";
    assert_eq!(s.counter(flushed, &[("outcome", "finished")]), ran.flushes);
    assert_eq!(s.counter_sum(flushed), ran.flushes);
    let pending = s
        .gauges
        .get(&series("quorumlock_flush_pending", &[]))
        .copied();
    assert!(pending.is_some_and(|p| p >= 0.0), "{pending:?}");

    // Every node request, after the last flush: every attempt went to the 3 nodes;
    // extensions 2 × 3; the watchdog's one round 3; releases 7 rounds (6 releases, one
    // dropped lock) × 3, plus the split attempt's clean-up of the one node that granted,
    // plus the warm-up waiter's leave (its token released on the 3 nodes, refused: the key
    // is not its). The waiter handed the lock by transfer sends nothing more: its entries
    // left on other nodes go with its release. Queue joins are not node requests here.
    let node = "quorumlock_node_request_seconds";
    let op = |o: &str| s.count_where(node, &[("op", o)]);
    assert_eq!(op("acquire"), 33);
    assert_eq!(op("extend"), 6);
    assert_eq!(op("watchdog"), 3);
    assert_eq!(op("release"), 25);
    assert_eq!(op("fence_commit"), 0);
    let by = |o: &str, out: &str| s.count_where(node, &[("op", o), ("outcome", out)]);
    assert_eq!(by("acquire", "granted"), 19);
    assert_eq!(by("acquire", "refused"), 14);
    assert_eq!(by("extend", "granted"), 3);
    assert_eq!(by("extend", "refused"), 3);
    assert_eq!(
        by("release", "refused"),
        6,
        "b's release found no key; the warm-up waiter's leave"
    );
    assert_eq!(by("release", "granted"), 19);
    for o in ["acquire", "extend", "release", "watchdog"] {
        assert_eq!(by(o, "failed") + by(o, "timed_out"), 0, "{o}");
    }
    let nodes: std::collections::BTreeSet<String> = s
        .histograms
        .keys()
        .filter(|(n, _)| n == node)
        .filter_map(|(_, l)| l.get("node").cloned())
        .collect();
    assert_eq!(nodes.len(), 3, "{nodes:?}");
    for n in &nodes {
        assert!(n.contains(&format!("{USER}:<redacted>@127.0.0.1:")), "{n}");
    }

    // Labels: never the password, a token or a resource name.
    for v in s.label_values() {
        assert!(!v.contains(PASSWORD), "password in a label: {v}");
        assert!(!v.contains("m:"), "resource name in a label: {v}");
        for t in &ran.tokens {
            assert!(
                !v.contains(t.as_str()) && !v.contains(&t[..8]),
                "token in {v}"
            );
        }
    }
    // Described (the recorder was there when the client was built).
    for name in [acq_s, acq, node, lost, "quorumlock_flush_pending"] {
        assert!(
            s.described.iter().any(|d| d == name),
            "{name} not described"
        );
    }
    Ok(())
}

// ---------------------------------------------------------------------------------------
// The Prometheus exporter over HTTP.

/// Buckets for the `_seconds` histograms (the operations guide recommends the same).
const BUCKETS: &[f64] = &[
    0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5,
    5.0, 10.0,
];

/// Installs the exporter's HTTP listener on a free loopback port; returns its address.
fn install_exporter() -> Result<SocketAddr, Box<dyn std::error::Error + Send + Sync>> {
    let mut last = String::new();
    for _ in 0..5 {
        // A free port: bound, read and released (another process may take it in between,
        // hence the retries).
        let port = std::net::TcpListener::bind("127.0.0.1:0")?
            .local_addr()?
            .port();
        let addr = SocketAddr::from(([127, 0, 0, 1], port));
        let built = PrometheusBuilder::new()
            .with_http_listener(addr)
            .set_buckets_for_metric(Matcher::Suffix("_seconds".into()), BUCKETS)?
            .install();
        match built {
            Ok(()) => return Ok(addr),
            Err(e) => last = e.to_string(),
        }
    }
    Err(format!("install the Prometheus exporter: {last}").into())
}

/// `GET /metrics` over plain HTTP/1.1; the body.
async fn scrape(addr: SocketAddr) -> Result<String, Box<dyn std::error::Error + Send + Sync>> {
    let mut s = tokio::time::timeout(Duration::from_secs(5), tokio::net::TcpStream::connect(addr))
        .await??;
    s.write_all(b"GET /metrics HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n")
        .await?;
    let mut buf = Vec::new();
    tokio::time::timeout(Duration::from_secs(5), s.read_to_end(&mut buf)).await??;
    let text = String::from_utf8(buf)?;
    let (head, body) = text.split_once("\r\n\r\n").ok_or("no HTTP header")?;
    if !head.starts_with("HTTP/1.1 200") {
        return Err(format!("scrape answered {head}").into());
    }
    if head
        .to_ascii_lowercase()
        .contains("transfer-encoding: chunked")
    {
        return Err("chunked body: not expected from the exporter".into());
    }
    Ok(body.to_owned())
}

/// A parsed exposition: series → value, and the names with a `# HELP` line.
struct Exposition {
    samples: BTreeMap<Series, f64>,
    help: Vec<String>,
}

impl Exposition {
    fn parse(text: &str) -> Exposition {
        let mut samples = BTreeMap::new();
        let mut help = Vec::new();
        for line in text.lines() {
            if let Some(rest) = line.strip_prefix("# HELP ") {
                help.push(rest.split(' ').next().unwrap_or("").to_owned());
                continue;
            }
            if line.starts_with('#') || line.trim().is_empty() {
                continue;
            }
            let (series, value) = line.rsplit_once(' ').expect("a sample line");
            let value: f64 = value.parse().expect("a sample value");
            let (name, labels) = match series.split_once('{') {
                Some((n, l)) => (n, parse_labels(l.trim_end_matches('}'))),
                None => (series, BTreeMap::new()),
            };
            samples.insert((name.to_owned(), labels), value);
        }
        Exposition { samples, help }
    }

    fn get(&self, name: &str, labels: &[(&str, &str)]) -> Option<f64> {
        self.samples.get(&series(name, labels)).copied()
    }

    /// Sum over every series of `name` whose labels include `with`.
    fn sum(&self, name: &str, with: &[(&str, &str)]) -> f64 {
        self.samples
            .iter()
            .filter(|((n, l), _)| {
                n == name
                    && with
                        .iter()
                        .all(|(k, v)| l.get(*k).map(String::as_str) == Some(*v))
            })
            .map(|(_, v)| *v)
            .sum()
    }
}

/// `k="v",k2="v2"` with the exposition format's escapes.
fn parse_labels(s: &str) -> BTreeMap<String, String> {
    let mut out = BTreeMap::new();
    let mut chars = s.chars().peekable();
    loop {
        let key: String = chars.by_ref().take_while(|c| *c != '=').collect();
        if key.is_empty() {
            return out;
        }
        assert_eq!(chars.next(), Some('"'), "label {key} not quoted in {s}");
        let mut value = String::new();
        while let Some(c) = chars.next() {
            match c {
                '\\' => match chars.next() {
                    Some('n') => value.push('\n'),
                    Some(c) => value.push(c),
                    None => break,
                },
                '"' => break,
                c => value.push(c),
            }
        }
        out.insert(key.trim_start_matches(',').to_owned(), value);
        if chars.peek() == Some(&',') {
            chars.next();
        }
    }
}

/// Two scrapes around more work: counters and histogram counts move, a kept lock lost on
/// killed nodes appears, failed node requests appear under the dead nodes' labels.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn prometheus_scrape_moves_between_scrapes() -> TestResult {
    let addr = install_exporter()?;
    let cluster = cluster(3, false).await;
    let locks = Redlock::builder(authed(&cluster)).build().await?;
    let mut tokens = Vec::new();
    for i in 0..5 {
        let l = locks.try_lock(&format!("p:{i}"), TTL).await?;
        tokens.push(l.token().to_owned());
        l.release().await?;
    }
    let held = locks.try_lock("p:held", TTL).await?;
    tokens.push(held.token().to_owned());
    assert!(locks.try_lock("p:held", TTL).await.unwrap_err().is_held());
    assert!(locks.flush(Duration::from_secs(5)).await);
    let first = Exposition::parse(&scrape(addr).await?);

    // More cycles, then a kept lock whose extensions fail: two of three nodes killed.
    for i in 0..5 {
        let l = locks.try_lock(&format!("p:{i}"), TTL).await?;
        tokens.push(l.token().to_owned());
        l.release().await?;
    }
    held.release().await?;
    let kept = locks
        .try_lock("p:kept", Duration::from_secs(1))
        .await?
        .keep_alive(Watchdog::new())
        .expect("a watchdog policy that fits the TTL");
    cluster.kill(1).await?;
    cluster.kill(2).await?;
    let lost = tokio::time::timeout(Duration::from_secs(5), kept.lost()).await?;
    assert_eq!(lost.reason(), LostReason::ExtendFailed, "{lost}");
    let _ = kept.release().await;
    let _ = locks.flush(Duration::from_secs(2)).await;
    let text = scrape(addr).await?;
    let second = Exposition::parse(&text);

    // Counters and histogram counts moved.
    let acquired = [("outcome", "acquired")];
    let a1 = first
        .get("quorumlock_acquire_total", &acquired)
        .unwrap_or(0.0);
    let a2 = second
        .get("quorumlock_acquire_total", &acquired)
        .unwrap_or(0.0);
    assert!(a1 >= 6.0 && a2 >= a1 + 6.0, "acquired {a1} → {a2}");
    let c1 = first.sum("quorumlock_acquire_seconds_count", &acquired);
    let c2 = second.sum("quorumlock_acquire_seconds_count", &acquired);
    assert!(c2 >= c1 + 6.0, "acquire_seconds_count {c1} → {c2}");
    let b = |e: &Exposition| {
        e.get(
            "quorumlock_acquire_seconds_bucket",
            &[("outcome", "acquired"), ("le", "+Inf")],
        )
        .unwrap_or(0.0)
    };
    assert_eq!(b(&second), c2, "+Inf bucket = count");
    let held = [("outcome", "held")];
    assert!(first.get("quorumlock_acquire_total", &held) >= Some(1.0));
    let released = [("outcome", "released")];
    let r1 = first
        .get("quorumlock_release_total", &released)
        .unwrap_or(0.0);
    let r2 = second
        .get("quorumlock_release_total", &released)
        .unwrap_or(0.0);
    assert!(r2 >= r1 + 6.0, "released {r1} → {r2}");

    // The loss, and the watchdog's failed requests on the killed nodes.
    let reason = [("reason", "extend_failed")];
    assert_eq!(first.get("quorumlock_locks_lost_total", &reason), None);
    assert_eq!(
        second.get("quorumlock_locks_lost_total", &reason),
        Some(1.0)
    );
    assert!(second.get("quorumlock_watchdog_rounds_total", &[]) >= Some(1.0));
    let dead: Vec<String> = cluster.urls()[1..]
        .iter()
        .map(|u| u.replacen("redis://", &format!("redis://{USER}:<redacted>@"), 1))
        .collect();
    let failed_on_dead: f64 = dead
        .iter()
        .flat_map(|n| {
            ["failed", "timed_out"].map(|o| {
                second.sum(
                    "quorumlock_node_request_seconds_count",
                    &[("node", n.as_str()), ("op", "watchdog"), ("outcome", o)],
                )
            })
        })
        .sum();
    assert!(
        failed_on_dead >= 2.0,
        "failed watchdog requests on the dead nodes"
    );

    // Described; every series is one of ours and documented; no secret in any label.
    assert!(
        second
            .help
            .iter()
            .any(|h| h == "quorumlock_acquire_seconds")
    );
    let documented = documented_names();
    for (name, labels) in second.samples.keys() {
        let base = ["_bucket", "_count", "_sum"]
            .iter()
            .find_map(|s| name.strip_suffix(s))
            .filter(|b| documented.iter().any(|d| d == b))
            .unwrap_or(name);
        assert!(
            documented.iter().any(|d| d == base),
            "{name} is not documented"
        );
        for v in labels.values() {
            assert!(!v.contains(PASSWORD), "password in {name}: {v}");
            for t in &tokens {
                assert!(
                    !v.contains(t.as_str()) && !v.contains(&t[..8]),
                    "token in {v}"
                );
            }
        }
    }
    assert!(!text.contains(PASSWORD));
    Ok(())
}

// ---------------------------------------------------------------------------------------
// Documentation.

/// The metric names the operations guide's "Monitoring" table lists.
fn documented_names() -> Vec<String> {
    let guide = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/docs/operations.md"))
        .expect("read docs/operations.md");
    let section = guide
        .split("\n## Monitoring")
        .nth(1)
        .expect("a Monitoring section in docs/operations.md");
    let section = section.split("\n## ").next().unwrap_or(section);
    let mut names = Vec::new();
    for line in section.lines().filter(|l| l.starts_with("| `quorumlock_")) {
        let cell = line.split('|').nth(1).unwrap_or("");
        for part in cell.split('`').filter(|p| p.starts_with("quorumlock_")) {
            names.push(part.to_owned());
        }
    }
    names
}

/// Every metric name in the source is documented in the operations guide, and the guide
/// lists no metric the source does not have.
#[test]
fn docs_list_every_metric() {
    let src = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/src/base/metrics.rs"))
        .expect("read src/base/metrics.rs");
    let mut in_source: Vec<String> = src
        .split('"')
        .skip(1)
        .step_by(2)
        .filter(|s| s.len() > "quorumlock_".len() && s.starts_with("quorumlock_"))
        .map(str::to_owned)
        .collect();
    in_source.sort();
    in_source.dedup();
    assert_eq!(in_source.len(), 17, "{in_source:?}");
    let mut documented = documented_names();
    documented.sort();
    documented.dedup();
    assert_eq!(documented, in_source);
}
