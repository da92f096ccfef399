//! [`FaultProxy`]: an in-process TCP proxy whose link to one Redis node can be delayed,
//! stalled, blackholed or cut at run time, including on connections that are already open.
//!
//! # Model
//!
//! Each accepted client connection gets its own backend connection and two copy loops (client →
//! server, server → client). Every loop observes the proxy's current [`ProxyMode`] through a
//! `tokio::sync::watch` channel, so a mode change applies to **live** connections at once, not
//! only to new ones. Chunks are forwarded in order, one `read` at a time; the proxy adds no
//! buffering in [`ProxyMode::Pass`] (`TCP_NODELAY` on both sides).
//!
//! Two ways to make a link silent, because they model different failures:
//!
//! | mode | bytes sent while it lasts | when the mode changes back |
//! | --- | --- | --- |
//! | [`Stall`](ProxyMode::Stall) | held (the proxy stops reading; TCP buffers fill) | delivered, like TCP retransmission after a short partition heals |
//! | [`Blackhole`](ProxyMode::Blackhole) | read and dropped | every connection that lost bytes is reset, like a connection that timed out during a long partition |
//!
//! Dropping bytes out of the middle of a TCP stream is something no real network does: the
//! stream is desynchronised (a request with no reply, half a command), and a multiplexed Redis
//! client would pair later replies with the wrong requests. So a connection that lost bytes in
//! a direction is reset (RST) as soon as the mode would forward that direction again. New
//! connections after the heal work normally; a client that reconnects (redis-rs'
//! `ConnectionManager` does) recovers.
//!
//! The proxy task and every connection task stop when the [`FaultProxy`] is dropped.

use std::collections::VecDeque;
use std::fmt;
use std::io;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;
use tokio::task::{JoinHandle, JoinSet};
use tokio::time::Instant;

/// Bytes a delayed direction may hold before the proxy stops reading from its source.
const MAX_PENDING_BYTES: usize = 4 * 1024 * 1024;
/// Read buffer per direction.
const CHUNK: usize = 16 * 1024;
/// How long the proxy waits for its backend to accept a connection.
const BACKEND_CONNECT_TIMEOUT: Duration = Duration::from_secs(5);

/// What a [`FaultProxy`] does with the bytes of its connections. Takes effect on live
/// connections as soon as it is set with [`FaultProxy::set_mode`].
///
/// The default is [`ProxyMode::Pass`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum ProxyMode {
    /// Forward everything at once, in both directions.
    #[default]
    Pass,
    /// Forward every chunk, in both directions, `Duration` after the proxy read it; order is
    /// preserved. This is a one-way delay: a request/reply round trip gains about twice it.
    Delay(Duration),
    /// Hold everything: the proxy stops reading in both directions (so the senders' TCP
    /// buffers fill up), new connections are accepted but not connected to the backend. When
    /// the mode changes, the held bytes flow again, in order, and nothing is lost: a short
    /// network partition.
    Stall,
    /// Read and drop everything, in both directions; connections stay open, new connections
    /// are accepted but nothing reaches the backend. A connection that lost bytes is reset
    /// when the mode changes to one that would forward them (see the [module docs](self)).
    Blackhole,
    /// Deliver client → server bytes, drop the server's replies: the node executes the
    /// commands but the client never hears back. A connection that lost replies is reset when
    /// the mode changes to one that forwards replies.
    BlackholeReplies,
    /// Close every live connection now (with a TCP RST), and reset every new connection right
    /// after accepting it, until the mode changes: a cut link.
    Reset,
}

impl ProxyMode {
    /// What this mode does to the bytes of one direction.
    fn action(self, dir: Dir) -> Action {
        match (self, dir) {
            (ProxyMode::Pass, _) => Action::Forward(Duration::ZERO),
            (ProxyMode::Delay(d), _) => Action::Forward(d),
            (ProxyMode::BlackholeReplies, Dir::ToServer) => Action::Forward(Duration::ZERO),
            (ProxyMode::BlackholeReplies, Dir::ToClient) | (ProxyMode::Blackhole, _) => {
                Action::Drop
            }
            (ProxyMode::Stall, _) => Action::Hold,
            (ProxyMode::Reset, _) => Action::Reset,
        }
    }
}

impl fmt::Display for ProxyMode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ProxyMode::Pass => f.write_str("pass"),
            ProxyMode::Delay(d) => write!(f, "delay {d:?}"),
            ProxyMode::Stall => f.write_str("stall"),
            ProxyMode::Blackhole => f.write_str("blackhole"),
            ProxyMode::BlackholeReplies => f.write_str("blackhole replies"),
            ProxyMode::Reset => f.write_str("reset"),
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Dir {
    ToServer,
    ToClient,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Action {
    Forward(Duration),
    Drop,
    Hold,
    Reset,
}

/// State shared by the accept loop, the connection tasks and the handle.
#[derive(Debug)]
struct Shared {
    live: AtomicUsize,
    accepted: AtomicU64,
}

/// An in-process TCP proxy in front of one backend (a Redis node), listening on
/// `127.0.0.1:<free port>`, whose behaviour is switched at run time with [`ProxyMode`].
///
/// Dropping it stops the proxy: the listener closes and every proxied connection is dropped.
///
/// # Example
///
/// ```no_run
/// use std::time::Duration;
/// use quorumlock_testkit::{FaultProxy, ProxyMode};
///
/// # async fn demo() -> std::io::Result<()> {
/// let proxy = FaultProxy::start("127.0.0.1:6379".parse().unwrap()).await?;
/// let url = proxy.url(); // give this to the client instead of the node's own address
/// proxy.set_mode(ProxyMode::Delay(Duration::from_millis(20)));
/// proxy.set_mode(ProxyMode::Blackhole); // live connections go silent
/// proxy.set_mode(ProxyMode::Pass);
/// # let _ = url;
/// # Ok(())
/// # }
/// ```
pub struct FaultProxy {
    listen: SocketAddr,
    mode: watch::Sender<ProxyMode>,
    backend: watch::Sender<SocketAddr>,
    shared: Arc<Shared>,
    task: JoinHandle<()>,
}

impl fmt::Debug for FaultProxy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("FaultProxy")
            .field("listen", &self.listen)
            .field("backend", &*self.backend.borrow())
            .field("mode", &*self.mode.borrow())
            .field("live_connections", &self.live_connections())
            .finish()
    }
}

impl FaultProxy {
    /// Starts a proxy on `127.0.0.1:<free port>` forwarding to `backend`, in
    /// [`ProxyMode::Pass`]. Must be called inside a tokio runtime: the proxy runs as a task on
    /// it and stops with it.
    ///
    /// # Errors
    ///
    /// When no loopback port can be bound.
    pub async fn start(backend: SocketAddr) -> io::Result<FaultProxy> {
        let listener = TcpListener::bind((std::net::Ipv4Addr::LOCALHOST, 0)).await?;
        let listen = listener.local_addr()?;
        let (mode, mode_rx) = watch::channel(ProxyMode::Pass);
        let (backend, backend_rx) = watch::channel(backend);
        let shared = Arc::new(Shared {
            live: AtomicUsize::new(0),
            accepted: AtomicU64::new(0),
        });
        let task = tokio::spawn(accept_loop(listener, mode_rx, backend_rx, shared.clone()));
        tracing::debug!(proxy.listen = %listen, proxy.backend = %backend.borrow().to_string(), "testkit.proxy started");
        Ok(FaultProxy {
            listen,
            mode,
            backend,
            shared,
            task,
        })
    }

    /// The address clients connect to.
    pub fn addr(&self) -> SocketAddr {
        self.listen
    }

    /// The port clients connect to.
    pub fn port(&self) -> u16 {
        self.listen.port()
    }

    /// `redis://127.0.0.1:<port>`: the URL a Redis client uses to go through this proxy.
    pub fn url(&self) -> String {
        format!("redis://{}", self.listen)
    }

    /// The backend new connections go to.
    pub fn backend(&self) -> SocketAddr {
        *self.backend.borrow()
    }

    /// The current mode.
    pub fn mode(&self) -> ProxyMode {
        *self.mode.borrow()
    }

    /// Switches the mode; live connections observe it at once (see [`ProxyMode`]). Returns the
    /// previous mode.
    pub fn set_mode(&self, mode: ProxyMode) -> ProxyMode {
        let old = self.mode.send_replace(mode);
        tracing::debug!(proxy.listen = %self.listen, proxy.mode = %mode, proxy.previous = %old, "testkit.proxy mode");
        old
    }

    /// Shorthand for `set_mode(ProxyMode::Pass)`.
    pub fn pass(&self) {
        self.set_mode(ProxyMode::Pass);
    }

    /// Shorthand for `set_mode(ProxyMode::Delay(delay))`.
    pub fn delay(&self, delay: Duration) {
        self.set_mode(ProxyMode::Delay(delay));
    }

    /// Shorthand for `set_mode(ProxyMode::Blackhole)`.
    pub fn blackhole(&self) {
        self.set_mode(ProxyMode::Blackhole);
    }

    /// Shorthand for `set_mode(ProxyMode::Stall)`.
    pub fn stall(&self) {
        self.set_mode(ProxyMode::Stall);
    }

    /// Shorthand for `set_mode(ProxyMode::Reset)`.
    pub fn reset(&self) {
        self.set_mode(ProxyMode::Reset);
    }

    /// Sends new connections to `backend` from now on, and resets every live connection (they
    /// were talking to the old backend). Used to fail a node's address over to its replica.
    pub fn retarget(&self, backend: SocketAddr) {
        let old = self.backend.send_replace(backend);
        tracing::debug!(proxy.listen = %self.listen, proxy.backend = %backend, proxy.previous = %old, "testkit.proxy retarget");
    }

    /// Connections currently open through the proxy.
    pub fn live_connections(&self) -> usize {
        self.shared.live.load(Ordering::Relaxed)
    }

    /// Connections accepted since the proxy started.
    pub fn accepted_connections(&self) -> u64 {
        self.shared.accepted.load(Ordering::Relaxed)
    }
}

impl Drop for FaultProxy {
    fn drop(&mut self) {
        // Aborting the accept loop drops its JoinSet, which aborts every connection task.
        self.task.abort();
    }
}

async fn accept_loop(
    listener: TcpListener,
    mode: watch::Receiver<ProxyMode>,
    backend: watch::Receiver<SocketAddr>,
    shared: Arc<Shared>,
) {
    let mut conns = JoinSet::new();
    loop {
        tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok((client, _)) => {
                    shared.accepted.fetch_add(1, Ordering::Relaxed);
                    conns.spawn(serve(client, mode.clone(), backend.clone(), shared.clone()));
                }
                Err(e) => {
                    // EMFILE and friends: back off instead of spinning.
                    tracing::debug!(error = %e, "testkit.proxy accept failed");
                    tokio::time::sleep(Duration::from_millis(10)).await;
                }
            },
            Some(_) = conns.join_next(), if !conns.is_empty() => {}
        }
    }
}

/// Decrements the live count however a connection task ends (including abort).
struct LiveGuard(Arc<Shared>);

impl Drop for LiveGuard {
    fn drop(&mut self) {
        self.0.live.fetch_sub(1, Ordering::Relaxed);
    }
}

/// Closes `stream` with a TCP RST instead of a FIN.
fn reset_on_close(stream: &TcpStream) {
    // A zero linger never blocks (the deprecation is about non-zero values); tokio keeps the
    // method. `set_zero_linger` would need tokio >= 1.50.
    #[allow(deprecated)]
    let _ = stream.set_linger(Some(Duration::ZERO));
}

async fn serve(
    mut client: TcpStream,
    mut mode: watch::Receiver<ProxyMode>,
    mut backend: watch::Receiver<SocketAddr>,
    shared: Arc<Shared>,
) {
    shared.live.fetch_add(1, Ordering::Relaxed);
    let _live = LiveGuard(shared);
    let _ = client.set_nodelay(true);
    let lost = [AtomicBool::new(false), AtomicBool::new(false)];

    // Until the mode forwards something, there is no backend connection: hold or discard.
    let mut buf = vec![0u8; CHUNK];
    loop {
        let current = *mode.borrow_and_update();
        match current.action(Dir::ToServer) {
            Action::Reset => return reset_on_close(&client),
            Action::Forward(_) => break,
            Action::Hold => {
                if mode.changed().await.is_err() {
                    return;
                }
            }
            Action::Drop => {
                tokio::select! {
                    read = client.read(&mut buf) => match read {
                        Ok(0) | Err(_) => return,
                        Ok(_) => lost[0].store(true, Ordering::Relaxed),
                    },
                    changed = mode.changed() => if changed.is_err() { return },
                }
            }
        }
    }
    drop(buf);
    if lost[0].load(Ordering::Relaxed) {
        // Requests were dropped before there was a backend: the stream is already broken.
        return reset_on_close(&client);
    }

    let target = *backend.borrow_and_update();
    let mut server =
        match tokio::time::timeout(BACKEND_CONNECT_TIMEOUT, TcpStream::connect(target)).await {
            Ok(Ok(server)) => server,
            _ => return reset_on_close(&client), // like a refused connection
        };
    let _ = server.set_nodelay(true);

    let reset = {
        let (client_read, client_write) = client.split();
        let (server_read, server_write) = server.split();
        let (to_server_mode, to_client_mode) = (mode.clone(), mode.clone());
        let pumps = async {
            tokio::try_join!(
                pump(
                    client_read,
                    server_write,
                    Dir::ToServer,
                    to_server_mode,
                    &lost[0]
                ),
                pump(
                    server_read,
                    client_write,
                    Dir::ToClient,
                    to_client_mode,
                    &lost[1]
                ),
            )
        };
        let watchdog = async {
            loop {
                tokio::select! {
                    changed = mode.changed() => {
                        if changed.is_err() {
                            return false;
                        }
                        let m = *mode.borrow_and_update();
                        let broken = |dir: Dir, i: usize| {
                            lost[i].load(Ordering::Relaxed)
                                && matches!(m.action(dir), Action::Forward(_))
                        };
                        if m == ProxyMode::Reset || broken(Dir::ToServer, 0) || broken(Dir::ToClient, 1) {
                            return true;
                        }
                    }
                    changed = backend.changed() => return changed.is_ok(),
                }
            }
        };
        tokio::select! {
            done = pumps => done.is_err(),
            reset = watchdog => reset,
        }
    };
    if reset {
        reset_on_close(&client);
        reset_on_close(&server);
    }
}

/// Copies one direction, obeying the mode. Returns `Ok` at a clean end of stream (after
/// forwarding the FIN) and `Err` when the connection must be torn down.
async fn pump(
    mut src: tokio::net::tcp::ReadHalf<'_>,
    mut dst: tokio::net::tcp::WriteHalf<'_>,
    dir: Dir,
    mut mode: watch::Receiver<ProxyMode>,
    lost: &AtomicBool,
) -> io::Result<()> {
    let mut buf = vec![0u8; CHUNK];
    let mut pending: VecDeque<(Instant, Vec<u8>)> = VecDeque::new();
    let mut pending_bytes = 0usize;
    let mut eof = false;
    let broken = || io::Error::new(io::ErrorKind::ConnectionReset, "stream lost bytes");
    loop {
        let action = mode.borrow_and_update().action(dir);
        if action == Action::Reset {
            return Err(io::Error::new(io::ErrorKind::ConnectionReset, "reset"));
        }
        if eof && pending.is_empty() {
            let _ = dst.shutdown().await;
            return Ok(());
        }
        let held = action == Action::Hold;
        let next_due = if held {
            None
        } else {
            pending.front().map(|(due, _)| *due)
        };
        let can_read = !eof && !held && pending_bytes < MAX_PENDING_BYTES;
        tokio::select! {
            biased;
            changed = mode.changed() => {
                if changed.is_err() {
                    return Err(io::Error::other("proxy stopped"));
                }
            }
            _ = tokio::time::sleep_until(next_due.unwrap_or_else(Instant::now)), if next_due.is_some() => {
                if let Some((_, chunk)) = pending.pop_front() {
                    pending_bytes -= chunk.len();
                    match action {
                        Action::Forward(_) => {
                            if lost.load(Ordering::Relaxed) {
                                return Err(broken());
                            }
                            dst.write_all(&chunk).await?;
                        }
                        _ => lost.store(true, Ordering::Relaxed),
                    }
                }
            }
            read = src.read(&mut buf), if can_read => {
                let n = read?;
                if n == 0 {
                    eof = true;
                    continue;
                }
                match action {
                    Action::Forward(delay) => {
                        if lost.load(Ordering::Relaxed) {
                            return Err(broken());
                        }
                        if delay.is_zero() && pending.is_empty() {
                            dst.write_all(&buf[..n]).await?;
                        } else {
                            pending.push_back((Instant::now() + delay, buf[..n].to_vec()));
                            pending_bytes += n;
                        }
                    }
                    _ => lost.store(true, Ordering::Relaxed),
                }
            }
        }
    }
}
