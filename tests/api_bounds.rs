//! The auto traits the API promises (C-SEND-SYNC): checked at compile time.

use quorumlock::{Error, Lock, Redlock, RedlockBuilder, Retry, Votes};

fn is_send<T: Send>() {}
fn is_sync<T: Sync>() {}
fn is_static<T: 'static>() {}
fn is_clone<T: Clone>() {}
fn send_future<F: std::future::Future + Send>(_: &F) {}

#[test]
fn public_types() {
    is_send::<Redlock>();
    is_sync::<Redlock>();
    is_clone::<Redlock>();
    is_static::<Redlock>();
    is_send::<Lock>();
    is_sync::<Lock>();
    is_send::<Error>();
    is_sync::<Error>();
    is_static::<Error>();
    is_send::<RedlockBuilder>();
    is_send::<Retry>();
    is_send::<Votes>();
    fn is_error<E: std::error::Error + Send + Sync + 'static>() {}
    is_error::<Error>();
}

#[allow(dead_code, unused_must_use, clippy::let_underscore_future)]
async fn futures_are_send(locks: Redlock, mut lock: Lock) {
    let ttl = std::time::Duration::from_secs(1);
    send_future(&locks.try_lock("r", ttl));
    send_future(&locks.lock("r", ttl));
    send_future(&locks.try_lock_many(["a", "b"], ttl));
    send_future(&locks.lock_many(["a", "b"], ttl));
    send_future(&lock.extend(ttl));
    send_future(&lock.release());
    send_future(&Redlock::builder(["redis://127.0.0.1:1"]).build());
}
