//! Background work of this process: requests that go on after their caller stopped
//! waiting (clean-ups, the slower nodes of a release, scripts finished late), counted so
//! that [`flush`] can wait for them before a short-lived process exits.
//!
//! Below both `node.rs` (which finishes idempotent scripts late) and `fanout.rs` (which
//! drains stragglers), so neither depends on the other for it.

use std::future::Future;
use std::sync::LazyLock;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

/// Background requests still running in this process (clean-ups, the slower nodes of a
/// release, requests finished after their caller stopped waiting). See [`flush`].
static BACKGROUND: AtomicUsize = AtomicUsize::new(0);
static IDLE: LazyLock<tokio::sync::Notify> = LazyLock::new(tokio::sync::Notify::new);

struct Tracked;

impl Drop for Tracked {
    fn drop(&mut self) {
        if BACKGROUND.fetch_sub(1, Ordering::AcqRel) == 1 {
            IDLE.notify_waiters();
        }
    }
}

/// Spawns background request work on the current Tokio runtime, counted for [`flush`]. Without
/// a runtime (one shutting down, a `Drop` outside any runtime) the work is skipped: keys
/// then expire by TTL.
pub(crate) fn spawn<F>(fut: F) -> bool
where
    F: Future<Output = ()> + Send + 'static,
{
    match tokio::runtime::Handle::try_current() {
        Ok(h) => {
            BACKGROUND.fetch_add(1, Ordering::AcqRel);
            let guard = Tracked;
            drop(h.spawn(async move {
                let _guard = guard;
                fut.await;
            }));
            true
        }
        Err(_) => false,
    }
}

/// Spawns a long-lived task (a subscription connection), not counted by [`flush`].
pub(crate) fn spawn_daemon<F>(fut: F) -> bool
where
    F: Future<Output = ()> + Send + 'static,
{
    match tokio::runtime::Handle::try_current() {
        Ok(h) => {
            drop(h.spawn(fut));
            true
        }
        Err(_) => false,
    }
}

/// Waits until no background request work is running in this process, at most `within`.
/// Returns whether it all finished.
pub(crate) async fn flush(within: Duration) -> bool {
    let deadline = crate::base::time::later(tokio::time::Instant::now(), within);
    crate::base::metrics::flush_pending(&BACKGROUND);
    loop {
        let idle = IDLE.notified();
        tokio::pin!(idle);
        idle.as_mut().enable();
        if BACKGROUND.load(Ordering::Acquire) == 0 {
            return crate::base::metrics::flushed(true);
        }
        if tokio::time::timeout_at(deadline, idle).await.is_err() {
            return crate::base::metrics::flushed(BACKGROUND.load(Ordering::Acquire) == 0);
        }
    }
}
