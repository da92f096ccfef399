//! The last-coupon sale: K coupons, 100 concurrent buyers spread over several client
//! instances, a "database" that does read-check-write. First without a lock (it
//! oversells), then with quorumlock (exactly K sold) while one Redis node is killed
//! halfway through, then without any lock again but with the check and the decrement in
//! one atomic script on the database (exactly K sold, and much faster): when the critical
//! section is one key of one store, that store's atomic operation is the right tool, and a
//! distributed lock is for everything else.
//!
//! Run it with `scripts/demo.sh` (or `cargo run --release --example
//! coupon`). With `QUORUMLOCK_NODES` unset it starts its own local 5-node cluster; with
//! `QUORUMLOCK_NODES=redis://…,redis://…` it uses yours (and skips the node kill).

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use quorumlock::{Redlock, Retry};
use quorumlock_testkit::LocalCluster;
use redis::AsyncCommands;
use tokio::sync::Barrier;

const COUPONS: i64 = 10;
const BUYERS: usize = 100;
const CLIENTS: usize = 4;
const STOCK_KEY: &str = "demo:coupons:left";
const SOLD_KEY: &str = "demo:coupons:sold";

type BoxError = Box<dyn std::error::Error + Send + Sync>;

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() -> Result<(), BoxError> {
    println!(
        "quorumlock demo: {COUPONS} coupons, {BUYERS} buyers over {CLIENTS} client instances\n"
    );

    // The lock nodes: the user's, or a local 5-node cluster we own (and may kill one of).
    let (own, urls) = match std::env::var("QUORUMLOCK_NODES") {
        Ok(v) if !v.trim().is_empty() => (
            None,
            v.split(',')
                .map(|s| s.trim().to_string())
                .collect::<Vec<_>>(),
        ),
        _ => {
            print!("starting 5 local redis-server nodes ... ");
            let c = LocalCluster::launch(5)
                .await
                .map_err(|e| format!("could not start redis-server: {e}"))?;
            println!(
                "ports {:?}",
                (0..5).filter_map(|i| c.port(i).ok()).collect::<Vec<_>>()
            );
            let urls = c.urls();
            (Some(c), urls)
        }
    };
    // The "database" that holds the stock: a separate Redis, accessed with a non-atomic
    // read-check-write, as a real service would do with its own storage.
    let db = LocalCluster::launch(1)
        .await
        .map_err(|e| format!("could not start the database node: {e}"))?;
    let db_url = db.url(0)?;

    // Round 1: no lock.
    reset_stock(&db_url).await?;
    let unlocked_took = run_buyers(&db_url, Sale::Unlocked, None).await?;
    let (left, sold) = read_stock(&db_url).await?;
    let unlocked_sold = sold;
    println!("1. WITHOUT a lock");
    println!(
        "   sold {sold} coupons out of {COUPONS} in {unlocked_took:?}: oversold by {} (stock now {left})",
        sold - COUPONS
    );

    // Round 2: quorumlock, one node killed halfway.
    reset_stock(&db_url).await?;
    let mut clients = Vec::new();
    for _ in 0..CLIENTS {
        clients.push(
            Redlock::builder(&urls)
                .retry(Retry::new().max_wait(Duration::from_secs(30)))
                .build()
                .await?,
        );
    }
    let stats = Arc::new(Stats::default());
    let locked_took =
        run_buyers(&db_url, Sale::Locked(clients, stats.clone()), own.as_ref()).await?;
    let (left, sold) = read_stock(&db_url).await?;
    println!(
        "\n2. WITH quorumlock ({} nodes, quorum {})",
        urls.len(),
        urls.len() / 2 + 1
    );
    match &own {
        Some(_) => println!(
            "   node 1 was killed (SIGKILL) after {} buyers had finished",
            BUYERS / 2
        ),
        None => println!("   (nodes given by QUORUMLOCK_NODES: no node was killed)"),
    }
    println!(
        "   sold {sold} coupons out of {COUPONS} in {locked_took:?} (stock now {left}); {} buyers found it sold out",
        stats.sold_out.load(Ordering::Relaxed)
    );
    println!(
        "   lock: {} acquisitions, {} lock() calls gave up",
        stats.acquired.load(Ordering::Relaxed),
        stats.gave_up.load(Ordering::Relaxed)
    );
    let locked_ok = sold == COUPONS && left == 0;
    let locked_sold = sold;

    // Round 3: no lock at all; the check and the decrement are one atomic script on the
    // database, and the slow part (payment) runs outside any critical section.
    reset_stock(&db_url).await?;
    let stats = Arc::new(Stats::default());
    let atomic_took = run_buyers(&db_url, Sale::Atomic(stats.clone()), None).await?;
    let (left, sold) = read_stock(&db_url).await?;
    println!("\n3. LOCK-FREE: check and decrement in one atomic script on the database");
    println!(
        "   sold {sold} coupons out of {COUPONS} in {atomic_took:?} (stock now {left}); {} buyers found it sold out",
        stats.sold_out.load(Ordering::Relaxed)
    );
    // The assertion of the third act: the atomic script never oversells, whatever the
    // interleaving (and with more buyers than coupons, it sells out).
    let atomic_ok = sold == COUPONS && left == 0;

    println!(
        "\n   {:<28} {:>12}   sold",
        format!("{BUYERS} buyers"),
        "time"
    );
    for (label, took, sold) in [
        ("1. without a lock", unlocked_took, unlocked_sold),
        ("2. with quorumlock", locked_took, locked_sold),
        ("3. atomic script, no lock", atomic_took, sold),
    ] {
        println!(
            "   {label:<28} {:>12}   {sold} of {COUPONS}",
            format!("{took:.1?}")
        );
    }
    println!(
        "\n{}",
        match (locked_ok, atomic_ok) {
            (true, true) => {
                "RESULT: exactly the stock was sold with the lock, although a Redis node died \
                 mid-sale, and by the atomic script, with no lock at all."
            }
            (false, _) => "RESULT: UNEXPECTED: the locked sale did not sell exactly the stock.",
            (true, false) => {
                "RESULT: UNEXPECTED: the atomic script did not sell exactly the stock."
            }
        }
    );
    if !(locked_ok && atomic_ok) {
        std::process::exit(1);
    }
    Ok(())
}

/// How the buyers of one round buy.
enum Sale {
    /// Read, check, write back: races.
    Unlocked,
    /// The same, under quorumlock (the clients are shared round-robin by the buyers).
    Locked(Vec<Redlock>, Arc<Stats>),
    /// No lock: take a coupon with one atomic script, then pay.
    Atomic(Arc<Stats>),
}

/// Takes one coupon if one is left, and counts the sale, atomically (a Lua script runs
/// alone on the server). Returns 1 when a coupon was taken, 0 when sold out. (For the
/// stock alone, `DECR` and giving the coupon back with `INCR` when it went below zero
/// would do as well.)
const TAKE_ONE: &str = r"
local left = tonumber(redis.call('GET', KEYS[1]) or '0')
if left <= 0 then
  return 0
end
redis.call('DECR', KEYS[1])
redis.call('INCR', KEYS[2])
return 1
";

#[derive(Default)]
struct Stats {
    acquired: AtomicUsize,
    gave_up: AtomicUsize,
    sold_out: AtomicUsize,
    finished: AtomicUsize,
}

async fn db_conn(url: &str) -> Result<redis::aio::MultiplexedConnection, BoxError> {
    Ok(redis::Client::open(url)?
        .get_multiplexed_async_connection()
        .await?)
}

async fn reset_stock(url: &str) -> Result<(), BoxError> {
    let mut c = db_conn(url).await?;
    let _: () = c.set(STOCK_KEY, COUPONS).await?;
    let _: () = c.set(SOLD_KEY, 0).await?;
    Ok(())
}

async fn read_stock(url: &str) -> Result<(i64, i64), BoxError> {
    let mut c = db_conn(url).await?;
    Ok((c.get(STOCK_KEY).await?, c.get(SOLD_KEY).await?))
}

/// One purchase: read the stock, think, write it back: correct only under mutual exclusion.
async fn buy(db: &mut redis::aio::MultiplexedConnection) -> Result<bool, BoxError> {
    let left: i64 = db.get(STOCK_KEY).await?;
    if left <= 0 {
        return Ok(false);
    }
    tokio::time::sleep(Duration::from_millis(2)).await; // payment, fraud check, ...
    let _: () = db.set(STOCK_KEY, left - 1).await?;
    let _: () = db.incr(SOLD_KEY, 1).await?;
    Ok(true)
}

/// One purchase without a lock: take a coupon atomically, then the slow part, outside
/// any critical section.
async fn buy_atomically(
    db: &mut redis::aio::MultiplexedConnection,
    take: &redis::Script,
) -> Result<bool, BoxError> {
    let taken: i64 = take.key(STOCK_KEY).key(SOLD_KEY).invoke_async(db).await?;
    if taken == 0 {
        return Ok(false);
    }
    tokio::time::sleep(Duration::from_millis(2)).await; // payment, fraud check, ...
    Ok(true)
}

/// Runs one round: every buyer connects to the database, then all start at once. Returns
/// how long the sale took, from the start to the last buyer's end.
async fn run_buyers(
    db_url: &str,
    sale: Sale,
    cluster: Option<&LocalCluster>,
) -> Result<Duration, BoxError> {
    // Every buyer and this function: the clock starts when all buyers are connected.
    let start = Arc::new(Barrier::new(BUYERS + 1));
    let stats = match &sale {
        Sale::Locked(_, s) | Sale::Atomic(s) => s.clone(),
        Sale::Unlocked => Arc::default(),
    };
    let take = Arc::new(redis::Script::new(TAKE_ONE));
    let mut tasks = Vec::with_capacity(BUYERS);
    for i in 0..BUYERS {
        let mut db = db_conn(db_url).await?;
        let start = start.clone();
        let lock = match &sale {
            Sale::Locked(clients, _) => Some(clients[i % clients.len()].clone()),
            _ => None,
        };
        let atomic = matches!(sale, Sale::Atomic(_));
        let take = take.clone();
        let stats = stats.clone();
        tasks.push(tokio::spawn(async move {
            start.wait().await;
            let r: Result<(), BoxError> = async {
                match lock {
                    None if atomic => {
                        if !buy_atomically(&mut db, &take).await? {
                            stats.sold_out.fetch_add(1, Ordering::Relaxed);
                        }
                    }
                    None => {
                        buy(&mut db).await?;
                    }
                    Some(locks) => match locks.lock("coupon:stock", Duration::from_secs(5)).await {
                        Ok(lock) => {
                            stats.acquired.fetch_add(1, Ordering::Relaxed);
                            if !buy(&mut db).await? {
                                stats.sold_out.fetch_add(1, Ordering::Relaxed);
                            }
                            let _ = lock.release().await;
                        }
                        Err(e) => {
                            stats.gave_up.fetch_add(1, Ordering::Relaxed);
                            eprintln!("buyer {i}: {e}");
                        }
                    },
                }
                Ok(())
            }
            .await;
            stats.finished.fetch_add(1, Ordering::Relaxed);
            r.map_err(|e| e.to_string())
        }));
    }
    start.wait().await;
    let started = Instant::now();
    // Kill one lock node once half of the buyers are done.
    if let (Some(c), Sale::Locked(..)) = (cluster, &sale) {
        let deadline = Instant::now() + Duration::from_secs(60);
        while stats.finished.load(Ordering::Relaxed) < BUYERS / 2 && Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
        c.kill(1).await?;
    }
    for t in tasks {
        t.await?.map_err(|e| -> BoxError { e.into() })?;
    }
    Ok(started.elapsed())
}
