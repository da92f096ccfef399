//! A minimal RESP2 client used by the cluster to probe and steer its own processes (PING,
//! INFO, REPLICAOF) without going through a connection pool. Private to the test kit.

use std::io;
use std::net::SocketAddr;
use std::time::Duration;

use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::TcpStream;

/// A RESP2 reply.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Reply {
    Simple(String),
    Error(String),
    Integer(i64),
    Bulk(Option<Vec<u8>>),
    Array(Option<Vec<Reply>>),
}

impl Reply {
    /// The reply as text (simple string or bulk string).
    pub(crate) fn text(&self) -> Option<String> {
        match self {
            Reply::Simple(s) => Some(s.clone()),
            Reply::Bulk(Some(b)) => Some(String::from_utf8_lossy(b).into_owned()),
            _ => None,
        }
    }
}

/// Maximum nesting and sizes accepted, so a confused peer cannot make us allocate wildly.
const MAX_DEPTH: usize = 8;
const MAX_LEN: i64 = 64 * 1024 * 1024;

/// Sends one command on a fresh connection and reads one reply, all within `timeout`.
pub(crate) async fn command(
    addr: SocketAddr,
    args: &[&str],
    timeout: Duration,
) -> io::Result<Reply> {
    let fut = async {
        let stream = TcpStream::connect(addr).await?;
        stream.set_nodelay(true)?;
        let mut stream = BufReader::new(stream);
        let mut req = format!("*{}\r\n", args.len()).into_bytes();
        for a in args {
            req.extend_from_slice(format!("${}\r\n", a.len()).as_bytes());
            req.extend_from_slice(a.as_bytes());
            req.extend_from_slice(b"\r\n");
        }
        stream.get_mut().write_all(&req).await?;
        read_reply(&mut stream, 0).await
    };
    match tokio::time::timeout(timeout, fut).await {
        Ok(r) => r,
        Err(_) => Err(io::Error::new(
            io::ErrorKind::TimedOut,
            format!(
                "{addr} did not answer {:?} within {timeout:?}",
                args.first()
            ),
        )),
    }
}

fn bad(msg: impl Into<String>) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, msg.into())
}

async fn read_line(r: &mut BufReader<TcpStream>) -> io::Result<String> {
    let mut line = Vec::new();
    let n = (&mut *r)
        .take(MAX_LEN as u64)
        .read_until(b'\n', &mut line)
        .await?;
    if n == 0 {
        return Err(io::Error::new(
            io::ErrorKind::UnexpectedEof,
            "connection closed",
        ));
    }
    if !line.ends_with(b"\r\n") {
        return Err(bad("reply line not terminated by CRLF"));
    }
    line.truncate(line.len() - 2);
    String::from_utf8(line).map_err(|_| bad("reply line is not UTF-8"))
}

fn read_reply(
    r: &mut BufReader<TcpStream>,
    depth: usize,
) -> std::pin::Pin<Box<dyn Future<Output = io::Result<Reply>> + Send + '_>> {
    Box::pin(async move {
        if depth > MAX_DEPTH {
            return Err(bad("reply nested too deeply"));
        }
        let line = read_line(r).await?;
        let (kind, rest) = line
            .split_at_checked(1)
            .ok_or_else(|| bad("empty reply line"))?;
        let int = |s: &str| {
            s.parse::<i64>()
                .map_err(|_| bad(format!("bad length {s:?}")))
        };
        Ok(match kind {
            "+" => Reply::Simple(rest.to_owned()),
            "-" => Reply::Error(rest.to_owned()),
            ":" => Reply::Integer(int(rest)?),
            "$" => {
                let len = int(rest)?;
                if len < 0 {
                    Reply::Bulk(None)
                } else if len > MAX_LEN {
                    return Err(bad("bulk reply too large"));
                } else {
                    let mut data = vec![0u8; len as usize + 2];
                    r.read_exact(&mut data).await?;
                    data.truncate(len as usize);
                    Reply::Bulk(Some(data))
                }
            }
            "*" => {
                let len = int(rest)?;
                if len < 0 {
                    Reply::Array(None)
                } else if len > 1_000_000 {
                    return Err(bad("array reply too large"));
                } else {
                    let mut items = Vec::with_capacity(len as usize);
                    for _ in 0..len {
                        items.push(read_reply(r, depth + 1).await?);
                    }
                    Reply::Array(Some(items))
                }
            }
            other => return Err(bad(format!("unknown reply type {other:?}"))),
        })
    })
}
