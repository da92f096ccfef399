//! A fenced storage: a worker that pauses past its lease cannot overwrite its successor.
//!
//! The storage is a Lua script on a separate Redis: it accepts a write only with a fencing
//! token ≥ the largest it has seen, checking and writing in one atomic step. Worker A takes
//! the lock, then "pauses" (a GC pause, a swapped-out VM…) past its validity; worker B takes
//! the lock with a larger token and writes; A wakes up and writes with its old token: the
//! storage rejects it and B's update survives.
//!
//! Tokens read like microseconds since the Unix epoch (each lock node takes its own clock
//! as a floor, which keeps them rising across nodes restarted without persistence); only
//! their order matters to the storage.
//!
//! ```text
//! cargo run --example fenced_storage
//! ```
//!
//! With `QUORUMLOCK_NODES` unset it starts 5 local `redis-server`s for the lock plus one for
//! the storage. Otherwise it locks on `QUORUMLOCK_NODES` (comma-separated URLs) and stores on
//! `QUORUMLOCK_STORE` (default: the first lock node; fine for a demo, not for production).

use std::time::Duration;

use quorumlock::Redlock;
use quorumlock_testkit::LocalCluster;

/// Write `ARGV[2]` to `KEYS[1]` only if the token `ARGV[1]` is ≥ the largest token seen
/// (kept in `KEYS[2]`). Returns 1 when written, 0 when rejected as stale.
const FENCED_WRITE: &str = r"
local seen = tonumber(redis.call('GET', KEYS[2]) or '0')
local token = tonumber(ARGV[1])
if token < seen then
  return 0
end
redis.call('SET', KEYS[2], ARGV[1])
redis.call('SET', KEYS[1], ARGV[2])
return 1
";

struct FencedStore {
    conn: redis::aio::MultiplexedConnection,
    script: redis::Script,
}

impl FencedStore {
    async fn connect(url: &str) -> Result<FencedStore, Box<dyn std::error::Error>> {
        let conn = redis::Client::open(url)?
            .get_multiplexed_async_connection()
            .await?;
        Ok(FencedStore {
            conn,
            script: redis::Script::new(FENCED_WRITE),
        })
    }

    /// Writes `value` under `key` if `token` is not stale. `Ok(true)` when accepted.
    async fn write(&self, key: &str, token: u64, value: &str) -> redis::RedisResult<bool> {
        let mut conn = self.conn.clone();
        let written: i64 = self
            .script
            .key(key)
            .key(format!("{key}:fence"))
            .arg(token)
            .arg(value)
            .invoke_async(&mut conn)
            .await?;
        Ok(written == 1)
    }

    async fn read(&self, key: &str) -> redis::RedisResult<Option<String>> {
        let mut conn = self.conn.clone();
        redis::cmd("GET").arg(key).query_async(&mut conn).await
    }
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    // Keep the local servers alive until the end of main.
    let mut _local = Vec::new();
    let (nodes, store_url) = match std::env::var("QUORUMLOCK_NODES") {
        Ok(list) => {
            let nodes: Vec<String> = list.split(',').map(|s| s.trim().to_string()).collect();
            let store = std::env::var("QUORUMLOCK_STORE")
                .ok()
                .or_else(|| nodes.first().cloned())
                .ok_or("QUORUMLOCK_NODES is empty")?;
            (nodes, store)
        }
        Err(_) => {
            let lock_nodes = LocalCluster::launch(5).await?;
            let storage = LocalCluster::launch(1).await?;
            let urls = lock_nodes.urls();
            let store = storage.url(0)?;
            _local.push(lock_nodes);
            _local.push(storage);
            (urls, store)
        }
    };
    println!("lock nodes: {}", nodes.join(" "));
    println!("storage:    {store_url}");

    let store = FencedStore::connect(&store_url).await?;
    let worker_a = Redlock::builder(&nodes).fencing(true).build().await?;
    let worker_b = Redlock::builder(&nodes).fencing(true).build().await?;
    let resource = "account:42";
    let key = "fenced-storage-demo:account:42";

    // A takes the lock for 1 s...
    let lease_a = worker_a.lock(resource, Duration::from_secs(1)).await?;
    let token_a = lease_a.fencing_token().ok_or("fencing is off")?;
    println!(
        "A: acquired {resource} with token {token_a}, valid for {:?}",
        lease_a.remaining()
    );

    // ... and pauses past its lease (this sleep stands for a GC pause: A does not know).
    println!("A: pausing (simulated GC pause) past its lease...");
    tokio::time::sleep_until((lease_a.deadline() + Duration::from_millis(200)).into()).await;

    // Meanwhile the lease expired: B gets the lock with a larger token and writes.
    let lease_b = worker_b.lock(resource, Duration::from_secs(5)).await?;
    let token_b = lease_b.fencing_token().ok_or("fencing is off")?;
    println!("B: acquired {resource} with token {token_b}");
    let b_ok = store
        .write(key, token_b, "balance=100 (written by B)")
        .await?;
    println!(
        "B: write with token {token_b}: {}",
        if b_ok { "accepted" } else { "REJECTED" }
    );
    lease_b.release().await?;

    // A wakes up, still believing it holds the lock, and writes with its old token.
    let a_ok = store
        .write(key, token_a, "balance=0 (stale, from A)")
        .await?;
    println!(
        "A: woke up, write with stale token {token_a}: {}",
        if a_ok {
            "ACCEPTED (lost update!)"
        } else {
            "rejected as stale"
        }
    );
    drop(lease_a);

    let value = store.read(key).await?;
    println!(
        "storage now holds: {}",
        value.as_deref().unwrap_or("<nothing>")
    );
    if a_ok || !b_ok || token_b <= token_a {
        return Err("fencing failed: the stale write got through".into());
    }
    println!("the stale write was rejected; B's update was not lost");
    Ok(())
}
