//! The last-coupon sale: K coupons, 100 concurrent buyers spread over several client
//! instances, a "database" that does read-check-write. First without a lock (it
//! oversells), then with quorumlock (exactly K sold) while one Redis node is killed
//! halfway through.
//!
//! Run it with `scripts/demo.sh` (or `cargo run --release --features testkit --example
//! coupon`). With `QUORUMLOCK_NODES` unset it starts its own local 5-node cluster; with
//! `QUORUMLOCK_NODES=redis://…,redis://…` it uses yours (and skips the node kill).

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use quorumlock::testkit::LocalCluster;
use quorumlock::{Redlock, Retry};
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
    let started = Instant::now();
    run_buyers(&db_url, None, None).await?;
    let (left, sold) = read_stock(&db_url).await?;
    println!("1. WITHOUT a lock");
    println!(
        "   sold {sold} coupons out of {COUPONS} in {:?}: oversold by {} (stock now {left})",
        started.elapsed(),
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
    let started = Instant::now();
    let stats = Arc::new(Stats::default());
    run_buyers(&db_url, Some((clients, stats.clone())), own.as_ref()).await?;
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
        "   sold {sold} coupons out of {COUPONS} in {:?} (stock now {left}); {} buyers found it sold out",
        started.elapsed(),
        stats.sold_out.load(Ordering::Relaxed)
    );
    println!(
        "   lock: {} acquisitions, {} lock() calls gave up",
        stats.acquired.load(Ordering::Relaxed),
        stats.gave_up.load(Ordering::Relaxed)
    );
    let ok = sold == COUPONS && left == 0;
    println!(
        "\n{}",
        if ok {
            "RESULT: exactly the stock was sold with the lock, although a Redis node died mid-sale."
        } else {
            "RESULT: UNEXPECTED: the locked sale did not sell exactly the stock."
        }
    );
    if !ok {
        std::process::exit(1);
    }
    Ok(())
}

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

async fn run_buyers(
    db_url: &str,
    locking: Option<(Vec<Redlock>, Arc<Stats>)>,
    cluster: Option<&LocalCluster>,
) -> Result<(), BoxError> {
    let start = Arc::new(Barrier::new(BUYERS));
    let stats = locking.as_ref().map(|(_, s)| s.clone()).unwrap_or_default();
    let mut tasks = Vec::with_capacity(BUYERS);
    for i in 0..BUYERS {
        let mut db = db_conn(db_url).await?;
        let start = start.clone();
        let lock = locking
            .as_ref()
            .map(|(clients, _)| clients[i % clients.len()].clone());
        let stats = stats.clone();
        tasks.push(tokio::spawn(async move {
            start.wait().await;
            let r: Result<(), BoxError> = async {
                match lock {
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
    // Kill one lock node once half of the buyers are done.
    if let (Some(c), true) = (cluster, locking.is_some()) {
        let deadline = Instant::now() + Duration::from_secs(60);
        while stats.finished.load(Ordering::Relaxed) < BUYERS / 2 && Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
        c.kill(1).await?;
    }
    for t in tasks {
        t.await?.map_err(|e| -> BoxError { e.into() })?;
    }
    Ok(())
}
