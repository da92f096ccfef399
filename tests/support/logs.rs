//! Every `tracing` event of a test process, formatted as a subscriber prints it, for tests
//! that check what an operator reads in the log. Installs the process's global subscriber:
//! include it (`#[path = "support/logs.rs"] mod logs;`) only in a test file whose tests all
//! share that subscriber.

use std::sync::Mutex;

static LOGS: Mutex<Vec<u8>> = Mutex::new(Vec::new());

struct LogCapture;

impl std::io::Write for LogCapture {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        LOGS.lock()
            .unwrap_or_else(|p| p.into_inner())
            .extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// Captures every event at `level` and above from now on (installed once per process; a
/// later call keeps the first level).
pub fn capture(level: tracing::Level) {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        let subscriber = tracing_subscriber::fmt()
            .with_max_level(level)
            .with_ansi(false)
            .with_writer(|| LogCapture)
            .finish();
        tracing::subscriber::set_global_default(subscriber).expect("the only global subscriber");
    });
}

/// Everything captured so far.
pub fn text() -> String {
    String::from_utf8_lossy(&LOGS.lock().unwrap_or_else(|p| p.into_inner())).into_owned()
}
