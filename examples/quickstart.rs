use quorumlock::{Redlock, Watchdog};
use std::time::Duration;

#[tokio::main]
async fn main() -> Result<(), quorumlock::Error> {
    let nodes = std::env::var("QUORUMLOCK_NODES")
        .unwrap_or("redis://127.0.0.1:7001,redis://127.0.0.1:7002,redis://127.0.0.1:7003".into());
    let locks = Redlock::builder(nodes.split(',')).build().await?;
    let ttl = Duration::from_secs(10);
    locks
        .with_lock("coupon:last", ttl, Watchdog::new(), |ctx| async move {
            // One machine at a time runs this; it is cancelled if the lock is lost.
            println!("issuing the last coupon; {:?} left", ctx.remaining());
        })
        .await
}
