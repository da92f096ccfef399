//! Helpers of the `lock` benchmark: the implementations under test, percentiles, process
//! CPU and memory, the JSON-lines summary, and the split-vote counter.

use std::fs::File;
use std::io::Write;
use std::sync::Mutex;
use std::time::Duration;

use futures::future::join_all;
use quorumlock::Redlock;
use redis::aio::MultiplexedConnection;

/// The raw floor: plain redis-rs, one multiplexed connection per node, parallel
/// `SET key token NX PX ttl` to every node and wait for all, then a parallel
/// compare-and-delete (EVALSHA) on every node and wait for all. No quorum logic, no
/// validity arithmetic, no clean-up of failed attempts: what any Redlock must at least pay.
#[derive(Clone)]
pub struct Floor {
    conns: Vec<MultiplexedConnection>,
    release: redis::Script,
}

impl Floor {
    pub async fn connect(urls: &[String]) -> redis::RedisResult<Floor> {
        let mut conns = Vec::new();
        for url in urls {
            conns.push(
                redis::Client::open(url.as_str())?
                    .get_multiplexed_async_connection()
                    .await?,
            );
        }
        Ok(Floor {
            conns,
            release: redis::Script::new(
                r#"if redis.call("get", KEYS[1]) == ARGV[1] then return redis.call("del", KEYS[1]) else return 0 end"#,
            ),
        })
    }

    /// One acquire + release; returns the number of nodes that granted.
    pub async fn cycle(&self, key: &str, ttl: Duration) -> usize {
        let (token, granted) = self.acquire(key, ttl).await;
        self.release(key, &token).await;
        granted
    }

    /// The acquire half of [`cycle`](Floor::cycle): a parallel `SET NX PX` on every node,
    /// waiting for all; returns the token and the number of nodes that granted.
    pub async fn acquire(&self, key: &str, ttl: Duration) -> (String, usize) {
        let token = format!("{:032x}", rand::random::<u128>());
        let ttl_ms = ttl.as_millis() as u64;
        let sets = join_all(self.conns.iter().map(|c| {
            let mut c = c.clone();
            let token = &token;
            async move {
                redis::cmd("SET")
                    .arg(key)
                    .arg(token)
                    .arg("NX")
                    .arg("PX")
                    .arg(ttl_ms)
                    .query_async::<Option<String>>(&mut c)
                    .await
            }
        }))
        .await;
        let granted = sets.iter().filter(|r| matches!(r, Ok(Some(_)))).count();
        (token, granted)
    }

    /// The release half of [`cycle`](Floor::cycle): a parallel compare-and-delete on
    /// every node, waiting for all.
    pub async fn release(&self, key: &str, token: &str) {
        join_all(self.conns.iter().map(|c| {
            let mut c = c.clone();
            let script = &self.release;
            async move { script.key(key).arg(token).invoke_async::<i64>(&mut c).await }
        }))
        .await;
    }

    /// The number of nodes.
    pub fn nodes(&self) -> usize {
        self.conns.len()
    }
}

/// An implementation under test.
#[derive(Clone)]
pub enum Impl {
    Quorumlock(Redlock),
    /// quorumlock built with `.fencing(true)`.
    Fenced(Redlock),
    Rslock(rslock::LockManager),
    Floor(Floor),
}

impl Impl {
    pub fn name(&self) -> &'static str {
        match self {
            Impl::Quorumlock(_) => "quorumlock",
            Impl::Fenced(_) => "quorumlock-fencing",
            Impl::Rslock(_) => "rslock",
            Impl::Floor(_) => "floor",
        }
    }

    /// One uncontended acquire + release on `key`. Panics if the lock is not granted
    /// (the resource is uncontended, so that would be a bug).
    pub async fn cycle(&self, key: &str, ttl: Duration) {
        match self {
            Impl::Quorumlock(q) | Impl::Fenced(q) => {
                let l = q.try_lock(key, ttl).await.expect("quorumlock try_lock");
                l.release().await.expect("quorumlock release");
            }
            Impl::Rslock(r) => {
                let l = r.lock(key, ttl).await.expect("rslock lock");
                r.unlock(&l).await;
            }
            Impl::Floor(f) => {
                let granted = f.cycle(key, ttl).await;
                assert!(granted > f.conns.len() / 2, "floor: only {granted} grants");
            }
        }
    }
}

/// The `q` quantile (0..=1) of `v` (nearest rank; sorts `v`).
pub fn percentile(v: &mut [Duration], q: f64) -> Duration {
    if v.is_empty() {
        return Duration::ZERO;
    }
    v.sort_unstable();
    let idx = ((v.len() - 1) as f64 * q).round() as usize;
    v[idx.min(v.len() - 1)]
}

/// A duration in microseconds.
pub fn us(d: Duration) -> f64 {
    d.as_secs_f64() * 1e6
}

pub fn json_f64s(v: &[f64]) -> String {
    let parts: Vec<String> = v.iter().map(|x| format!("{x:.1}")).collect();
    format!("[{}]", parts.join(","))
}

/// Resident set size of this process, in kB (`VmRSS` of `/proc/self/status`).
pub fn rss_kb() -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("VmRSS:"))
                .and_then(|l| l.split_whitespace().nth(1))
                .and_then(|n| n.parse().ok())
        })
        .unwrap_or(0)
}

/// User + system CPU time of this process, in seconds (`getrusage`).
pub fn cpu_time() -> f64 {
    // SAFETY: getrusage only writes into the zeroed struct we pass.
    let mut ru: libc::rusage = unsafe { std::mem::zeroed() };
    let rc = unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut ru) };
    if rc != 0 {
        return 0.0;
    }
    let tv = |t: libc::timeval| t.tv_sec as f64 + t.tv_usec as f64 / 1e6;
    tv(ru.ru_utime) + tv(ru.ru_stime)
}

/// User + system CPU time of another process, in seconds (`/proc/PID/stat`).
pub fn proc_cpu_time(pid: u32) -> f64 {
    let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
        return 0.0;
    };
    // Fields after the command name (which may hold spaces) start at field 3.
    let Some(rest) = stat.rsplit_once(')').map(|(_, r)| r) else {
        return 0.0;
    };
    let fields: Vec<&str> = rest.split_whitespace().collect();
    // utime and stime are fields 14 and 15 (1-based), i.e. 11 and 12 after ')'.
    let ticks: f64 = [11, 12]
        .iter()
        .filter_map(|&i| fields.get(i).and_then(|f| f.parse::<f64>().ok()))
        .sum();
    // SAFETY: sysconf has no preconditions.
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) } as f64;
    if hz > 0.0 { ticks / hz } else { 0.0 }
}

/// The JSON-lines summary file.
pub struct Summary {
    file: Mutex<File>,
}

impl Summary {
    pub fn create(path: &str) -> Summary {
        if let Some(dir) = std::path::Path::new(path).parent() {
            std::fs::create_dir_all(dir).expect("create bench-out/");
        }
        Summary {
            file: Mutex::new(File::create(path).expect("create summary file")),
        }
    }

    pub fn line(&self, json: &str) {
        let mut f = self.file.lock().unwrap();
        writeln!(f, "{json}").expect("write summary");
        f.flush().ok();
    }

    /// The machine, the load and the Redis version, for the docs.
    pub fn meta(&self) {
        let cpu = std::fs::read_to_string("/proc/cpuinfo")
            .ok()
            .and_then(|s| {
                s.lines()
                    .find(|l| l.starts_with("model name"))
                    .and_then(|l| l.split_once(':'))
                    .map(|(_, v)| v.trim().to_string())
            })
            .unwrap_or_default();
        let nproc = std::thread::available_parallelism().map_or(0, |n| n.get());
        let load = std::fs::read_to_string("/proc/loadavg").unwrap_or_default();
        let redis = std::process::Command::new("redis-server")
            .arg("--version")
            .output()
            .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
            .unwrap_or_default();
        let esc = |s: &str| s.replace('\\', "\\\\").replace('"', "\\\"");
        self.line(&format!(
            r#"{{"section":"meta","cpu":"{}","nproc":{nproc},"loadavg_start":"{}","redis":"{}"}}"#,
            esc(&cpu),
            esc(load.trim()),
            esc(&redis)
        ));
        eprintln!("machine: {nproc} × {cpu}; load {}; {redis}", load.trim());
    }
}

/// Counting split votes inside `Redlock::lock`: a tracing layer that watches the
/// library's `quorumlock.acquire` spans (one per attempt; fields `granted` and
/// `outcome`).
///
/// An attempt is a **split vote** when it failed although at least one node granted it,
/// and no contender acquired the resource between the attempt's start and end (the
/// bench's global acquisition counter did not move): the votes were spread so that
/// nobody reached the quorum. Failed attempts with grants while someone did acquire are
/// counted apart (`failed_with_grants`): those lost a race to a winner (or met a release
/// still in flight), which costs the loser a round trip but stalls nobody.
pub mod split_votes {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicU64, Ordering};

    use tracing::field::{Field, Visit};
    use tracing::span::{Attributes, Id, Record};
    use tracing::{Dispatch, Subscriber};
    use tracing_subscriber::Layer;
    use tracing_subscriber::layer::{Context, SubscriberExt};
    use tracing_subscriber::registry::LookupSpan;

    use crate::ACQ_SEQ;

    #[derive(Default)]
    pub struct Stats {
        attempts: AtomicU64,
        failed: AtomicU64,
        failed_with_grants: AtomicU64,
        split: AtomicU64,
    }

    #[derive(Clone, Copy, Debug)]
    pub struct Snapshot {
        pub attempts: u64,
        pub failed: u64,
        pub failed_with_grants: u64,
        pub split: u64,
    }

    impl Stats {
        pub fn reset(&self) {
            for c in [
                &self.attempts,
                &self.failed,
                &self.failed_with_grants,
                &self.split,
            ] {
                c.store(0, Ordering::SeqCst);
            }
        }

        pub fn snapshot(&self) -> Snapshot {
            Snapshot {
                attempts: self.attempts.load(Ordering::SeqCst),
                failed: self.failed.load(Ordering::SeqCst),
                failed_with_grants: self.failed_with_grants.load(Ordering::SeqCst),
                split: self.split.load(Ordering::SeqCst),
            }
        }
    }

    struct AttemptData {
        seq_at_start: u64,
        granted: u64,
        outcome: String,
    }

    impl Visit for AttemptData {
        fn record_u64(&mut self, field: &Field, value: u64) {
            if field.name() == "granted" {
                self.granted = value;
            }
        }
        fn record_i64(&mut self, field: &Field, value: i64) {
            if field.name() == "granted" {
                self.granted = value.max(0) as u64;
            }
        }
        fn record_str(&mut self, field: &Field, value: &str) {
            if field.name() == "outcome" {
                self.outcome = value.to_string();
            }
        }
        fn record_debug(&mut self, field: &Field, value: &dyn std::fmt::Debug) {
            if field.name() == "outcome" {
                self.outcome = format!("{value:?}").trim_matches('"').to_string();
            }
        }
    }

    struct SplitLayer {
        stats: Arc<Stats>,
    }

    const SPAN: &str = "quorumlock.acquire";

    impl<S> Layer<S> for SplitLayer
    where
        S: Subscriber + for<'a> LookupSpan<'a>,
    {
        fn register_callsite(
            &self,
            meta: &'static tracing::Metadata<'static>,
        ) -> tracing::subscriber::Interest {
            if meta.is_span() && meta.name() == SPAN {
                tracing::subscriber::Interest::always()
            } else {
                tracing::subscriber::Interest::never()
            }
        }

        fn enabled(&self, meta: &tracing::Metadata<'_>, _: Context<'_, S>) -> bool {
            meta.is_span() && meta.name() == SPAN
        }

        fn on_new_span(&self, attrs: &Attributes<'_>, id: &Id, ctx: Context<'_, S>) {
            if attrs.metadata().name() != SPAN {
                return;
            }
            if let Some(span) = ctx.span(id) {
                span.extensions_mut().insert(AttemptData {
                    seq_at_start: ACQ_SEQ.load(Ordering::SeqCst),
                    granted: 0,
                    outcome: String::new(),
                });
            }
        }

        fn on_record(&self, id: &Id, values: &Record<'_>, ctx: Context<'_, S>) {
            if let Some(span) = ctx.span(id)
                && let Some(data) = span.extensions_mut().get_mut::<AttemptData>()
            {
                values.record(data);
            }
        }

        fn on_close(&self, id: Id, ctx: Context<'_, S>) {
            let Some(span) = ctx.span(&id) else { return };
            let Some(data) = span.extensions_mut().remove::<AttemptData>() else {
                return;
            };
            let s = &self.stats;
            s.attempts.fetch_add(1, Ordering::Relaxed);
            if data.outcome == "acquired" {
                return;
            }
            s.failed.fetch_add(1, Ordering::Relaxed);
            if data.granted >= 1 {
                s.failed_with_grants.fetch_add(1, Ordering::Relaxed);
                if ACQ_SEQ.load(Ordering::SeqCst) == data.seq_at_start {
                    s.split.fetch_add(1, Ordering::Relaxed);
                }
            }
        }
    }

    /// A multi-thread runtime whose threads (and the calling thread) report to the
    /// split-vote layer.
    pub fn runtime() -> (tokio::runtime::Runtime, Arc<Stats>) {
        let stats = Arc::new(Stats::default());
        let subscriber = tracing_subscriber::registry().with(SplitLayer {
            stats: stats.clone(),
        });
        let dispatch = Dispatch::new(subscriber);
        let d = dispatch.clone();
        let rt = tokio::runtime::Builder::new_multi_thread()
            .enable_all()
            .on_thread_start(move || {
                // The guard would restore the previous dispatcher; the thread keeps
                // this one for life.
                std::mem::forget(tracing::dispatcher::set_default(&d));
            })
            .build()
            .expect("tokio runtime");
        std::mem::forget(tracing::dispatcher::set_default(&dispatch));
        (rt, stats)
    }
}
