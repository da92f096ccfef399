//! `quorumlock demo`: the coupon scenario.
//!
//! K coupons are in stock (an in-process counter standing for the shop's database, with a
//! simulated 2 ms round trip). 100 buyers arrive at once, spread over several Redlock
//! clients. Each reads the stock, and if one is left, "writes" stock − 1 and counts a sale.
//!
//! 1. Without a lock, the read–check–write races: far more than K coupons are sold.
//! 2. With quorumlock around it, exactly K are sold, even though one of the Redis nodes
//!    is killed halfway through (when the demo started its own nodes).
//! 3. Without a lock again, but with the check and the decrement as one atomic operation
//!    on the stock (a compare-and-swap here; `DECR` or a Lua script on a Redis stock):
//!    exactly K are sold, and much faster. When the critical section is one key of one
//!    store, its atomic operation is the right tool; the lock is for everything else.

use std::sync::Arc;
use std::sync::atomic::{AtomicI64, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use quorumlock::{Redlock, Retry};
use quorumlock_testkit::LocalCluster;

use crate::exit;

/// Arguments of `quorumlock demo`.
#[derive(Debug, clap::Args)]
pub struct DemoArgs {
    /// Redis nodes to use (lock groups separated by `;`); by default the demo starts 5
    /// local redis-server nodes (and kills one halfway through).
    #[arg(
        long,
        env = "QUORUMLOCK_NODES",
        hide_env_values = true,
        value_delimiter = ',',
        value_name = "URL,..."
    )]
    nodes: Vec<String>,
    /// Coupons in stock.
    #[arg(long, default_value_t = 10)]
    stock: i64,
    /// Concurrent buyers.
    #[arg(long, default_value_t = 100)]
    buyers: usize,
    /// Redlock clients the buyers are spread over (like several app servers).
    #[arg(long, default_value_t = 4)]
    clients: usize,
}

const RESOURCE: &str = "demo:coupon";
const DB_ROUND_TRIP: Duration = Duration::from_millis(2);

/// The shop's stock and the sales, shared by every buyer.
#[derive(Default)]
struct Shop {
    stock: AtomicI64,
    sold: AtomicI64,
    served: AtomicUsize,
}

impl Shop {
    /// One buyer: read, check, (round trip), write back. Racy on purpose.
    async fn buy(&self) -> bool {
        let left = self.stock.load(Ordering::SeqCst);
        let bought = if left > 0 {
            tokio::time::sleep(DB_ROUND_TRIP).await;
            self.stock.store(left - 1, Ordering::SeqCst);
            self.sold.fetch_add(1, Ordering::SeqCst);
            true
        } else {
            false
        };
        self.served.fetch_add(1, Ordering::SeqCst);
        bought
    }
}

impl Shop {
    /// One buyer without a lock: take a coupon with one atomic operation, then pay
    /// (the round trip) outside any critical section.
    async fn buy_atomically(&self) -> bool {
        let taken = self
            .stock
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |left| {
                (left > 0).then(|| left - 1)
            })
            .is_ok();
        if taken {
            tokio::time::sleep(DB_ROUND_TRIP).await;
            self.sold.fetch_add(1, Ordering::SeqCst);
        }
        self.served.fetch_add(1, Ordering::SeqCst);
        taken
    }
}

/// Runs `quorumlock demo`; returns the exit code.
pub async fn demo(args: DemoArgs) -> u8 {
    if args.stock < 0 || args.buyers == 0 || args.clients == 0 {
        eprintln!("quorumlock: --stock must be ≥ 0, --buyers and --clients ≥ 1");
        return exit::USAGE;
    }
    let mut cluster = None;
    let urls = if args.nodes.is_empty() {
        println!("starting 5 local redis-server nodes…");
        match LocalCluster::launch(5).await {
            Ok(c) => {
                let urls = c.urls();
                cluster = Some(c);
                urls
            }
            Err(e) => {
                eprintln!("quorumlock: cannot start local Redis nodes: {e}");
                return exit::UNAVAILABLE;
            }
        }
    } else {
        args.nodes.clone()
    };
    let groups = crate::split_groups(&urls);
    let (k, buyers) = (args.stock, args.buyers);

    // 1. Without a lock.
    let shop = Arc::new(Shop::default());
    shop.stock.store(k, Ordering::SeqCst);
    let tasks: Vec<_> = (0..buyers)
        .map(|_| {
            let shop = Arc::clone(&shop);
            tokio::spawn(async move { shop.buy().await })
        })
        .collect();
    futures::future::join_all(tasks).await;
    let sold = shop.sold.load(Ordering::SeqCst);
    println!("\n1. without a lock: {buyers} buyers, {k} coupons in stock");
    println!(
        "   sold {sold}: OVERSOLD by {} (every buyer read the stock before anyone wrote it)",
        (sold - k).max(0)
    );

    // 2. With quorumlock.
    let mut clients = Vec::with_capacity(args.clients);
    for _ in 0..args.clients {
        match groups
            .iter()
            .skip(1)
            .fold(
                Redlock::builder(groups.first().cloned().unwrap_or_default()),
                |b, g| b.group(g),
            )
            .build()
            .await
        {
            Ok(c) => clients.push(c),
            Err(e) => {
                eprintln!("quorumlock: {e}");
                return exit::for_error(&e);
            }
        }
    }
    let shop = Arc::new(Shop::default());
    shop.stock.store(k, Ordering::SeqCst);
    let failures = Arc::new(AtomicUsize::new(0));
    let started = Instant::now();
    let tasks: Vec<_> = (0..buyers)
        .map(|i| {
            let locks = clients[i % clients.len()].clone();
            let (shop, failures) = (Arc::clone(&shop), Arc::clone(&failures));
            tokio::spawn(async move {
                let retry = Retry::new().max_wait(Duration::from_secs(60));
                match locks
                    .lock_with(RESOURCE, Duration::from_secs(2), retry)
                    .await
                {
                    Ok(lock) => {
                        shop.buy().await;
                        let _ = lock.release().await;
                    }
                    Err(e) => {
                        failures.fetch_add(1, Ordering::SeqCst);
                        tracing::warn!(error = %e, "buyer could not take the lock");
                    }
                }
            })
        })
        .collect();
    let killer = async {
        let Some(c) = &cluster else { return None };
        let deadline = Instant::now() + Duration::from_secs(60);
        while shop.served.load(Ordering::SeqCst) < buyers / 2 && Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
        let served = shop.served.load(Ordering::SeqCst);
        c.kill(2).await.ok().map(|()| served)
    };
    let (_, killed_after) = tokio::join!(futures::future::join_all(tasks), killer);
    let sold = shop.sold.load(Ordering::SeqCst);
    let failed = failures.load(Ordering::SeqCst);
    println!(
        "\n2. with quorumlock on {} nodes (quorum {}), {} clients:",
        groups.iter().map(Vec::len).sum::<usize>(),
        clients.first().map_or(0, Redlock::quorum),
        clients.len()
    );
    match killed_after {
        Some(n) => println!("   node 3 of 5 was killed (SIGKILL) after {n} buyers were served"),
        None => println!("   (no node killed: the nodes were given with --nodes)"),
    }
    println!(
        "   sold {sold} of {k}: {}; {} buyers found it sold out, {failed} gave up waiting; took {:.2}s",
        if sold == k.min(buyers as i64) {
            "exactly right"
        } else {
            "WRONG"
        },
        buyers - failed - usize::try_from(sold).unwrap_or(0),
        started.elapsed().as_secs_f64()
    );
    let locked_took = started.elapsed();

    // 3. Lock-free: the check and the decrement in one atomic operation.
    let shop = Arc::new(Shop::default());
    shop.stock.store(k, Ordering::SeqCst);
    let started = Instant::now();
    let tasks: Vec<_> = (0..buyers)
        .map(|_| {
            let shop = Arc::clone(&shop);
            tokio::spawn(async move { shop.buy_atomically().await })
        })
        .collect();
    futures::future::join_all(tasks).await;
    let atomic_sold = shop.sold.load(Ordering::SeqCst);
    let atomic_took = started.elapsed();
    println!("\n3. lock-free: the check and the decrement as one atomic operation on the stock");
    println!(
        "   sold {atomic_sold} of {k}: {}; took {:.1?} (with the lock: {:.1?})",
        if atomic_sold == k.min(buyers as i64) {
            "exactly right"
        } else {
            "WRONG"
        },
        atomic_took,
        locked_took
    );
    if sold > k || atomic_sold > k {
        exit::LOST
    } else {
        0
    }
}
