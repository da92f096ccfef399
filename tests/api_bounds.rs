//! The auto traits the API promises (C-SEND-SYNC): checked at compile time.

use quorumlock::{Error, Inspection, Lock, Redlock, RedlockBuilder, Retry, Votes};

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
    is_send::<Inspection>();
    is_sync::<Inspection>();
    is_clone::<Inspection>();
    is_static::<Inspection>();
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
    send_future(&locks.inspect("r"));
    send_future(&locks.inspect_many(["a", "b"]));
    send_future(&Redlock::builder(["redis://127.0.0.1:1"]).build());
}

/// Used outside a Tokio runtime, the API answers with an error instead of Tokio's panic.
#[test]
fn no_runtime_is_an_error_not_a_panic() {
    let r = futures::executor::block_on(Redlock::builder(["redis://127.0.0.1:1"]).build());
    match r {
        Err(Error::InvalidInput(i)) => assert_eq!(i.what(), "runtime"),
        other => panic!("expected a runtime error, got {other:?}"),
    }
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let locks = rt
        .block_on(
            Redlock::builder(["redis://127.0.0.1:1"])
                .connect_timeout(std::time::Duration::from_millis(20))
                .build(),
        )
        .unwrap();
    let r = futures::executor::block_on(locks.try_lock("r", std::time::Duration::from_secs(1)));
    assert!(matches!(r, Err(Error::InvalidInput(_))), "{r:?}");
    let r = futures::executor::block_on(locks.lock("r", std::time::Duration::from_secs(1)));
    assert!(matches!(r, Err(Error::InvalidInput(_))), "{r:?}");
    let r = futures::executor::block_on(locks.inspect("r"));
    assert!(matches!(r, Err(Error::InvalidInput(_))), "{r:?}");
}
