//! `quorumlock inspect RESOURCE...`: shows, node by node, who holds each name's mutex (a
//! token prefix), the remaining TTL, the fence counter and, on the name's two herald
//! nodes, the wait queue's length; below a node, the readers, writer and waiting writers
//! of the read-write lock and the permits of the semaphore of the same name, when it has
//! any; then one verdict line per kind that is not free (or one `free` line). It reads
//! with [`Redlock::inspect_many`](quorumlock::Redlock::inspect_many): read-only commands,
//! nothing is taken or changed.
//!
//! ```text
//! orders:42 on 5 nodes (quorum 3)
//!   redis://127.0.0.1:7001  held by 3f2a9c1b…  ttl 8.2s    fence 1796077923605324  queued 2
//!   redis://127.0.0.1:7002  held by 3f2a9c1b…  ttl 8.2s    fence 1796077923605324
//!   redis://127.0.0.1:7003  failed: connection refused
//! verdict: held by 3f2a9c1b… on 4/5 nodes (quorum 3), 8.2s left
//!
//! catalog on 3 nodes (quorum 2)
//!   redis://127.0.0.1:7001  free                            queued 0
//!       read-write: readers 2 (5d41c2e0… 8.2s, 9b07aa31… 9.6s); writers waiting 1 (77f1e2d3… 2.9s)
//!   ...
//! verdict: read-held by 2 readers on 3/3 nodes (quorum 2), 9.6s left; 1 writer waiting
//! ```
//!
//! With `--json`, one JSON object on one line instead (hand-written, no JSON library; the
//! schema is in [`JSON_HELP`] and is stable: fields are only ever added).
//!
//! Exits 0, or [`exit::UNAVAILABLE`] when, for some resource,
//! fewer than a quorum of nodes answered (its verdict is then "unknown").

use std::fmt::Write as _;
use std::time::Duration;

use quorumlock::Redlock;
use quorumlock::inspect::{
    Entry, Inspection, NodeInspection, NodeReading, NodeState, RwVerdict, SemaphoreVerdict, Verdict,
};

use crate::exit;

/// The `--json` schema, shown in `inspect --help`.
pub const JSON_HELP: &str = "\
JSON output (--json): one object on one line; every field is always present (null when
it does not apply), and fields are only ever added:
  {\"nodes\": N, \"quorum\": Q, \"resources\": [{
     \"resource\": \"orders:42\",
     \"verdict\": \"held\" | \"free\" | \"unknown\",
     \"holder\": \"3f2a9c1b\" | null,    token prefix (never the whole token), when held
     \"holder_nodes\": 4 | null,       nodes with the holder's key, when held
     \"free_nodes\": 5 | null,         nodes without a key, when free
     \"ttl_ms\": 8200 | null,          how long the holder stays on a quorum (null: free,
                                     unknown, or keys without expiry)
     \"answered\": 5, \"fence\": 17 | null, \"queued\": 2 | null,
     (the fields above are the mutex's; the read-write lock and the semaphore of the
     same name follow)
     \"all_free\": true,                 every kind free on a quorum, no writer waiting
     \"rw\": {\"verdict\": \"write_held\" | \"read_held\" | \"free\" | \"unknown\",
            \"writer\": \"3f2a9c1b\" | null, \"readers\": 2 | null, \"held_nodes\": 5 | null,
            \"free_nodes\": 5 | null, \"ttl_ms\": 8200 | null, \"waiting_writers\": 1},
     \"semaphore\": {\"verdict\": \"held\" | \"free\" | \"unknown\", \"holders\": 2 | null,
            \"permits\": 2 | null, \"quorum\": 4, \"free_nodes\": 5 | null,
            \"ttl_ms\": 29000 | null, \"config\": \"2:2:4:5\" | null},
     \"nodes\": [{\"node\": \"redis://host:port\", \"herald\": true,
                \"state\": \"answered\" | \"failed\" | \"timed_out\", \"error\": \"…\" | null,
                \"holder\": \"3f2a9c1b\" | null, \"ttl_ms\": 8200 | null,
                \"fence\": 17 | null, \"queued\": 2 | null,
                \"rw\": {\"writer\": \"3f2a9c1b\" | null, \"writer_ttl_ms\": 8200 | null,
                        \"readers\": [{\"id\": \"5d41c2e0\", \"ttl_ms\": 8200}, …],
                        \"waiting_writers\": [{\"id\": …, \"ttl_ms\": …}, …]} | null,
                \"semaphore\": {\"holders\": [{\"id\": …, \"ttl_ms\": …}, …], \"count\": 2,
                        \"limit\": 2 | null, \"config\": \"2:2:4:5\" | null} | null
               }, …]}, …]}
  (rw and semaphore of a node are null when it did not answer)";

/// Arguments of `quorumlock inspect`.
#[derive(Debug, clap::Args)]
#[command(after_help = format!("{JSON_HELP}\n\n{}", exit::HELP))]
pub struct InspectArgs {
    /// The resources to inspect.
    #[arg(required = true, num_args = 1.., value_name = "RESOURCE")]
    resources: Vec<String>,
    #[command(flatten)]
    nodes: crate::Nodes,
    /// Per-node timeout (connect and read).
    #[arg(long, default_value = "1s", value_parser = crate::parse_duration)]
    timeout: Duration,
    /// Print one JSON object instead of text (schema below).
    #[arg(long)]
    json: bool,
}

/// Runs `quorumlock inspect`; returns the exit code.
pub async fn inspect(args: InspectArgs) -> u8 {
    if args.timeout.is_zero() {
        eprintln!("quorumlock: --timeout must be above zero");
        return exit::USAGE;
    }
    let builder = match args.nodes.builder() {
        Ok(builder) => builder,
        Err(e) => {
            eprintln!("quorumlock: {e}");
            return exit::USAGE;
        }
    };
    let locks = match builder
        .node_timeout(args.timeout)
        .connect_timeout(args.timeout)
        .build()
        .await
    {
        Ok(locks) => locks,
        Err(e) => {
            eprintln!("quorumlock: {e}");
            return exit::for_error(&e);
        }
    };
    let seen = match locks.inspect_many(&args.resources).await {
        Ok(seen) => seen,
        Err(e) => {
            eprintln!("quorumlock: {e}");
            return exit::for_error(&e);
        }
    };
    if args.json {
        println!("{}", json(&locks, &seen));
    } else {
        for (i, s) in seen.iter().enumerate() {
            if i > 0 {
                println!();
            }
            print!("{}", text(s, args.timeout));
        }
    }
    if seen.iter().any(|s| s.answered() < s.quorum()) {
        exit::UNAVAILABLE
    } else {
        0
    }
}

/// The text form of one inspection.
fn text(seen: &Inspection, timeout: Duration) -> String {
    let n = seen.nodes().len();
    let q = seen.quorum();
    let mut out = format!("{} on {n} nodes (quorum {q})\n", seen.resource());
    let shown: Vec<String> = seen.nodes().iter().map(|s| s.addr().to_string()).collect();
    let width = shown.iter().map(|s| s.chars().count()).max().unwrap_or(0);
    for (addr, node) in shown.iter().zip(seen.nodes()) {
        let _ = writeln!(out, "  {addr:<width$}  {}", node_line(node, timeout));
        if let Some(r) = node.reading() {
            for line in kind_lines(r) {
                let _ = writeln!(out, "      {line}");
            }
        }
    }
    for verdict in seen.verdict_lines() {
        let _ = writeln!(out, "verdict: {verdict}");
    }
    out
}

/// The read-write lock's and the semaphore's part of one node, when it holds any.
fn kind_lines(r: &NodeReading) -> Vec<String> {
    let list = |entries: &[Entry]| {
        entries
            .iter()
            .map(|e| format!("{} {}", e.id(), ms(e.ttl())))
            .collect::<Vec<_>>()
            .join(", ")
    };
    let mut lines = Vec::new();
    let rw = r.rw();
    let mut parts = Vec::new();
    match (rw.writer(), rw.writer_ttl()) {
        (Some(w), Some(t)) => parts.push(format!("writer {w} ttl {}", ms(t))),
        (Some(w), None) => parts.push(format!("writer {w} no expiry")),
        (None, _) => {}
    }
    if !rw.readers().is_empty() {
        parts.push(format!(
            "readers {} ({})",
            rw.readers().len(),
            list(rw.readers())
        ));
    }
    if !rw.waiting_writers().is_empty() {
        parts.push(format!(
            "writers waiting {} ({})",
            rw.waiting_writers().len(),
            list(rw.waiting_writers())
        ));
    }
    if !parts.is_empty() {
        lines.push(format!("read-write: {}", parts.join("; ")));
    }
    let sem = r.semaphore();
    if !sem.holders().is_empty() || sem.config().is_some() {
        let mut line = format!("semaphore: permits {}", sem.holders().len());
        if let Some(c) = sem.config() {
            let _ = write!(line, "/{} per node", c.per_node_limit());
        }
        if !sem.holders().is_empty() {
            let _ = write!(line, " ({})", list(sem.holders()));
        }
        if let Some(c) = sem.config() {
            let _ = write!(line, ", stored {c}");
        }
        lines.push(line);
    }
    lines
}

/// One node's part of the text form.
fn node_line(node: &NodeInspection, timeout: Duration) -> String {
    let r = match node.state() {
        NodeState::Answered(r) => r,
        NodeState::Failed(e) => return format!("failed: {e}"),
        _ => {
            return format!("no answer within {}", humantime::format_duration(timeout));
        }
    };
    let mut line = match (r.holder(), r.ttl()) {
        (Some(h), Some(t)) => format!(
            "held by {:<10} {:<11}",
            h.to_string(),
            format!("ttl {}", ms(t))
        ),
        (Some(h), None) => format!("held by {:<10} {:<11}", h.to_string(), "no expiry"),
        (None, _) => format!("{:<30}", "free"),
    };
    if let Some(f) = r.fence() {
        let _ = write!(line, " fence {f}");
    }
    if let Some(q) = r.queued() {
        let _ = write!(line, "  queued {q}");
    }
    line.trim_end().to_owned()
}

fn ms(d: Duration) -> String {
    if d >= Duration::from_secs(1) {
        format!("{:.1}s", d.as_secs_f64())
    } else {
        format!("{}ms", d.as_millis())
    }
}

/// The JSON form of every inspection (see [`JSON_HELP`]).
fn json(locks: &Redlock, seen: &[Inspection]) -> String {
    let mut out = String::new();
    let _ = write!(
        out,
        "{{\"nodes\":{},\"quorum\":{},\"resources\":[",
        locks.nodes().len(),
        locks.quorum()
    );
    for (i, s) in seen.iter().enumerate() {
        if i > 0 {
            out.push(',');
        }
        resource_json(&mut out, s);
    }
    out.push_str("]}");
    out
}

fn resource_json(out: &mut String, s: &Inspection) {
    let (verdict, holder, holder_nodes, free_nodes, ttl) = match s.verdict() {
        Verdict::Held { holder, nodes, ttl } => {
            ("held", Some(holder.as_str()), Some(*nodes), None, *ttl)
        }
        Verdict::Free { nodes } => ("free", None, None, Some(*nodes), None),
        _ => ("unknown", None, None, None, None),
    };
    out.push_str("{\"resource\":");
    string(out, s.resource());
    let _ = write!(out, ",\"verdict\":\"{verdict}\",\"holder\":");
    opt_string(out, holder);
    let _ = write!(
        out,
        ",\"holder_nodes\":{},\"free_nodes\":{},\"ttl_ms\":{},\"answered\":{},\"quorum\":{},\"fence\":{},\"queued\":{}",
        num(holder_nodes),
        num(free_nodes),
        num(ttl.map(|t| t.as_millis())),
        s.answered(),
        s.quorum(),
        num(s.fence()),
        num(s.queued()),
    );
    let _ = write!(out, ",\"all_free\":{},\"rw\":", s.is_all_free());
    rw_json(out, s);
    out.push_str(",\"semaphore\":");
    semaphore_json(out, s);
    out.push_str(",\"nodes\":[");
    for (i, node) in s.nodes().iter().enumerate() {
        if i > 0 {
            out.push(',');
        }
        node_json(out, node);
    }
    out.push_str("]}");
}

fn rw_json(out: &mut String, s: &Inspection) {
    let (verdict, writer, readers, held, free, ttl) = match s.rw_verdict() {
        RwVerdict::WriteHeld { writer, nodes, ttl } => (
            "write_held",
            Some(writer.as_str()),
            None,
            Some(*nodes),
            None,
            *ttl,
        ),
        RwVerdict::ReadHeld {
            readers,
            nodes,
            ttl,
        } => (
            "read_held",
            None,
            Some(*readers),
            Some(*nodes),
            None,
            Some(*ttl),
        ),
        RwVerdict::Free { nodes } => ("free", None, None, None, Some(*nodes), None),
        _ => ("unknown", None, None, None, None, None),
    };
    let _ = write!(out, "{{\"verdict\":\"{verdict}\",\"writer\":");
    opt_string(out, writer);
    let _ = write!(
        out,
        ",\"readers\":{},\"held_nodes\":{},\"free_nodes\":{},\"ttl_ms\":{},\"waiting_writers\":{}}}",
        num(readers),
        num(held),
        num(free),
        num(ttl.map(|t| t.as_millis())),
        s.waiting_writers(),
    );
}

fn semaphore_json(out: &mut String, s: &Inspection) {
    let (verdict, holders, permits, free, ttl) = match s.semaphore_verdict() {
        SemaphoreVerdict::Held {
            holders,
            permits,
            ttl,
            ..
        } => ("held", Some(*holders), *permits, None, Some(*ttl)),
        SemaphoreVerdict::Free { nodes } => ("free", None, None, Some(*nodes), None),
        _ => ("unknown", None, None, None, None),
    };
    let permits = permits.or(s.semaphore_config().map(|c| c.permits()));
    let _ = write!(
        out,
        "{{\"verdict\":\"{verdict}\",\"holders\":{},\"permits\":{},\"quorum\":{},\"free_nodes\":{},\"ttl_ms\":{},\"config\":",
        num(holders),
        num(permits),
        s.semaphore_quorum(),
        num(free),
        num(ttl.map(|t| t.as_millis())),
    );
    opt_string(out, s.semaphore_config().map(|c| c.to_string()).as_deref());
    out.push('}');
}

/// `[{"id":"5d41c2e0","ttl_ms":8200},…]`.
fn entries_json(out: &mut String, entries: &[Entry]) {
    out.push('[');
    for (i, e) in entries.iter().enumerate() {
        if i > 0 {
            out.push(',');
        }
        out.push_str("{\"id\":");
        string(out, e.id().as_str());
        let _ = write!(out, ",\"ttl_ms\":{}}}", e.ttl().as_millis());
    }
    out.push(']');
}

/// A node's read-write lock and semaphore, or nulls when it did not answer.
fn node_kinds_json(out: &mut String, r: Option<&NodeReading>) {
    let Some(r) = r else {
        out.push_str(",\"rw\":null,\"semaphore\":null");
        return;
    };
    let rw = r.rw();
    out.push_str(",\"rw\":{\"writer\":");
    opt_string(out, rw.writer().map(|w| w.as_str()));
    let _ = write!(
        out,
        ",\"writer_ttl_ms\":{},\"readers\":",
        num(rw.writer_ttl().map(|t| t.as_millis()))
    );
    entries_json(out, rw.readers());
    out.push_str(",\"waiting_writers\":");
    entries_json(out, rw.waiting_writers());
    let sem = r.semaphore();
    out.push_str("},\"semaphore\":{\"holders\":");
    entries_json(out, sem.holders());
    let _ = write!(
        out,
        ",\"count\":{},\"limit\":{},\"config\":",
        sem.holders().len(),
        num(sem.config().map(|c| c.per_node_limit()))
    );
    opt_string(out, sem.config().map(|c| c.to_string()).as_deref());
    out.push('}');
}

fn node_json(out: &mut String, node: &NodeInspection) {
    out.push_str("{\"node\":");
    string(out, &node.addr().to_string());
    let _ = write!(out, ",\"herald\":{}", node.is_herald());
    let (state, error) = match node.state() {
        NodeState::Answered(_) => ("answered", None),
        NodeState::Failed(e) => ("failed", Some(e.as_str())),
        _ => ("timed_out", None),
    };
    let _ = write!(out, ",\"state\":\"{state}\",\"error\":");
    opt_string(out, error);
    let r = node.reading();
    out.push_str(",\"holder\":");
    opt_string(out, r.and_then(|r| r.holder()).map(|h| h.as_str()));
    let _ = write!(
        out,
        ",\"ttl_ms\":{},\"fence\":{},\"queued\":{}",
        num(r.and_then(|r| r.ttl()).map(|t| t.as_millis())),
        num(r.and_then(|r| r.fence())),
        num(r.and_then(|r| r.queued())),
    );
    node_kinds_json(out, r);
    out.push('}');
}

/// A number, or `null`.
fn num<T: std::fmt::Display>(v: Option<T>) -> String {
    v.map_or_else(|| "null".to_owned(), |v| v.to_string())
}

fn opt_string(out: &mut String, s: Option<&str>) {
    match s {
        Some(s) => string(out, s),
        None => out.push_str("null"),
    }
}

/// A JSON string literal: `"`, `\` and control characters escaped.
fn string(out: &mut String, s: &str) {
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            c if u32::from(c) < 0x20 => {
                let _ = write!(out, "\\u{:04x}", u32::from(c));
            }
            c => out.push(c),
        }
    }
    out.push('"');
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn strings_are_escaped() {
        let mut out = String::new();
        string(&mut out, "a\"b\\c\nd\u{1}é");
        assert_eq!(out, r#""a\"b\\c\nd\u0001é""#);
        assert_eq!(num::<u64>(None), "null");
        assert_eq!(num(Some(7u64)), "7");
    }
}
