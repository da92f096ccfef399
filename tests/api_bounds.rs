//! The auto traits the API promises (C-SEND-SYNC): checked at compile time.

use quorumlock::{
    Error, Inspection, Lock, LockMode, PermitsMismatch, Redlock, RedlockBuilder, Retry, Semaphore,
    Votes, Watchdog,
};

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
    is_send::<Semaphore>();
    is_sync::<Semaphore>();
    is_clone::<Semaphore>();
    is_static::<Semaphore>();
    is_send::<LockMode>();
    is_sync::<LockMode>();
    is_clone::<LockMode>();
    is_send::<PermitsMismatch>();
    is_sync::<PermitsMismatch>();
    is_clone::<PermitsMismatch>();
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
    send_future(&locks.try_read_lock("r", ttl));
    send_future(&locks.read_lock("r", ttl));
    send_future(&locks.try_write_lock("r", ttl));
    send_future(&locks.write_lock("r", ttl));
    send_future(&locks.with_read_lock("r", ttl, Watchdog::new(), |_| async {}));
    send_future(&locks.with_write_lock("r", ttl, Watchdog::new(), |_| async {}));
    if let Ok(sem) = locks.semaphore("s", 3) {
        send_future(&sem.try_acquire(ttl));
        send_future(&sem.acquire(ttl));
        send_future(&sem.with_permit(ttl, Watchdog::new(), |_| async {}));
    }
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
    let ttl = std::time::Duration::from_secs(1);
    let r = futures::executor::block_on(locks.try_read_lock("r", ttl));
    assert!(matches!(r, Err(Error::InvalidInput(_))), "{r:?}");
    let r = futures::executor::block_on(locks.write_lock("r", ttl));
    assert!(matches!(r, Err(Error::InvalidInput(_))), "{r:?}");
    let sem = locks.semaphore("s", 3).unwrap();
    let r = futures::executor::block_on(sem.acquire(ttl));
    assert!(matches!(r, Err(Error::InvalidInput(_))), "{r:?}");
    // Bad arguments are refused before any I/O.
    assert!(matches!(
        locks.semaphore("s", 0),
        Err(Error::InvalidInput(_))
    ));
    assert!(matches!(
        locks.semaphore("s", 1_000_001),
        Err(Error::InvalidInput(_))
    ));
    assert!(matches!(
        locks.semaphore("", 3),
        Err(Error::InvalidInput(_))
    ));
    assert!(matches!(
        sem.clone().with_quorum(0),
        Err(Error::InvalidInput(_))
    ));
    assert!(
        matches!(sem.with_quorum(2), Err(Error::InvalidInput(_))),
        "quorum above N = 1"
    );
}
