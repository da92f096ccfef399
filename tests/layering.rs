//! The library's layering, checked from its source text (no Redis, no network).
//!
//! The library's code is in one folder per layer, lowest first:
//!
//! ```text
//!   locks     rwlock, semaphore, watchdog            (lock kinds built on the client)
//!   client    Redlock, config, acquire, lock, wait…  (the mutex)
//!   io        node, fanout, notifier, extender…      (sockets, tasks, timers)
//!   base      resource, token, error, time…          (plain data and arithmetic)
//!   protocol  tally, verdict, reply…                 (the pure rules)
//! ```
//!
//! The rule: **a file in folder X names only folders at or below X**. Every `crate::…`
//! (and `$crate::…`) path of every file under `src/<folder>/` is read from its tokens
//! (comments and string literals are not code), and its first segment mapped to a
//! folder: a folder's own name, or a name the crate root re-exports (`crate::Error` is in
//! `base`, as `lib.rs` says `pub use base::error::…`). A file outside every layer (the
//! simulator, `sim`) may use everything. Two more rules name words a folder must not use:
//! the protocol names nothing of I/O or the clock, and nothing above `io` names `redis`
//! (it sees typed replies only); a duration becomes a request's millisecond argument
//! only in `io/node`.
//!
//! `a_violation_fails` runs the checker on a small tree that breaks each rule.

use std::collections::BTreeMap;
use std::path::Path;

use proc_macro2::{TokenStream, TokenTree};

/// The layers' folders under `src/`, lowest first.
const LAYERS: &[&str] = &["protocol", "base", "io", "client", "locks"];

/// Folders outside the layers, which may use every layer.
const TOOLS: &[&str] = &["sim"];

/// Words that may appear only in some places: (word, the path prefixes under `src/`
/// allowed to name it, why).
const CONFINED: &[(&str, &[&str], &str)] = &[
    (
        "tokio",
        &["base", "io", "client", "locks", "sim"],
        "the protocol is pure",
    ),
    (
        "futures",
        &["base", "io", "client", "locks", "sim"],
        "the protocol is pure",
    ),
    (
        "rand",
        &["base", "io", "client", "locks", "sim"],
        "the protocol is pure",
    ),
    (
        "Instant",
        &["base", "io", "client", "locks", "sim"],
        "the protocol reads no clock",
    ),
    (
        "SystemTime",
        &["base", "io", "client", "locks", "sim"],
        "the protocol reads no clock",
    ),
    (
        "UNIX_EPOCH",
        &["base", "io", "client", "locks", "sim"],
        "the protocol reads no clock",
    ),
    (
        "redis",
        &["base", "io", "sim"],
        "above io, replies are typed",
    ),
    (
        "millis_ceil",
        &["io/node", "sim"],
        "durations become request arguments in io/node",
    ),
    (
        "as_millis",
        &["io/node", "base/time.rs", "sim"],
        "durations become request arguments in io/node",
    ),
];

/// One source file: its path under `src/`, its tokens (comments and literals are not
/// code), every identifier among them, and the first segment of each `crate::` path.
struct File {
    path: String,
    tokens: Vec<TokenTree>,
    idents: Vec<String>,
    heads: Vec<String>,
}

fn file(path: &str, text: &str) -> Result<File, String> {
    let stream: TokenStream = text.parse().map_err(|e| format!("{path}: {e:?}"))?;
    let tokens: Vec<TokenTree> = stream.into_iter().collect();
    let (mut idents, mut heads) = (Vec::new(), Vec::new());
    walk(&tokens, &mut idents, &mut heads);
    Ok(File {
        path: path.to_owned(),
        tokens,
        idents,
        heads,
    })
}

fn ident(t: Option<&TokenTree>) -> Option<String> {
    match t {
        Some(TokenTree::Ident(i)) => Some(i.to_string()),
        _ => None,
    }
}

fn punct(t: Option<&TokenTree>, c: char) -> bool {
    matches!(t, Some(TokenTree::Punct(p)) if p.as_char() == c)
}

/// Collects every identifier, and the first segment after every `crate::` (`$crate::`
/// too): the next identifier, or in `crate::{a::x, b}` the first of each braced path.
/// Groups (blocks, macro calls, `use` trees) are read the same way, recursively.
fn walk(tokens: &[TokenTree], idents: &mut Vec<String>, heads: &mut Vec<String>) {
    for (i, t) in tokens.iter().enumerate() {
        match t {
            TokenTree::Group(g) => {
                let inner: Vec<TokenTree> = g.stream().into_iter().collect();
                walk(&inner, idents, heads);
            }
            TokenTree::Ident(id) => idents.push(id.to_string()),
            _ => {}
        }
        let after_crate = ident(Some(t)).as_deref() == Some("crate")
            && punct(tokens.get(i + 1), ':')
            && punct(tokens.get(i + 2), ':');
        match tokens.get(i + 3) {
            Some(TokenTree::Ident(head)) if after_crate => heads.push(head.to_string()),
            Some(TokenTree::Group(g)) if after_crate => {
                let inner: Vec<TokenTree> = g.stream().into_iter().collect();
                let mut first = true;
                for x in &inner {
                    if first && let Some(head) = ident(Some(x)) {
                        heads.push(head);
                    }
                    first = punct(Some(x), ',');
                }
            }
            _ => {}
        }
    }
}

/// The names the crate root re-exports, with the folder each comes from: from
/// `pub use <folder>::…;` and `pub use <re-exported module>::…;` in `lib.rs`.
fn root_names(lib: &File) -> BTreeMap<String, String> {
    let mut names: BTreeMap<String, String> = BTreeMap::new();
    let t = &lib.tokens;
    for i in 0..t.len() {
        if ident(t.get(i)).as_deref() != Some("pub")
            || ident(t.get(i + 1)).as_deref() != Some("use")
        {
            continue;
        }
        let Some(head) = ident(t.get(i + 2)) else {
            continue;
        };
        let folder = if LAYERS.contains(&head.as_str()) {
            head
        } else if let Some(f) = names.get(&head) {
            f.clone()
        } else {
            continue;
        };
        let end = t[i..]
            .iter()
            .position(|x| punct(Some(x), ';'))
            .map_or(t.len(), |e| i + e);
        let (mut leaves, mut unused) = (Vec::new(), Vec::new());
        walk(&t[i + 3..end], &mut leaves, &mut unused);
        for name in leaves {
            names.insert(name, folder.clone());
        }
    }
    names
}

/// The folder of a file (`io` for `io/node/direct.rs`), `None` at the crate root.
fn folder(path: &str) -> Option<&str> {
    path.split_once('/').map(|(f, _)| f)
}

/// Every violation of the rules, as `path: what`.
fn violations(files: &[File]) -> Vec<String> {
    let layer = |f: &str| LAYERS.iter().position(|l| *l == f);
    let roots = files
        .iter()
        .find(|f| f.path == "lib.rs")
        .map(root_names)
        .unwrap_or_default();
    let mut bad = Vec::new();
    for f in files {
        let Some(own) = folder(&f.path) else {
            continue; // lib.rs declares and re-exports everything
        };
        if TOOLS.contains(&own) {
            continue;
        }
        let Some(mine) = layer(own) else {
            bad.push(format!(
                "{}: folder `{own}` is not a layer: add it to LAYERS",
                f.path
            ));
            continue;
        };
        for head in &f.heads {
            let named = layer(head)
                .map(|_| head.as_str())
                .or(roots.get(head).map(String::as_str));
            if let Some(to) = named
                && layer(to).is_some_and(|l| l > mine)
            {
                bad.push(format!(
                    "{}: `crate::{head}` is in `{to}`, above `{own}`",
                    f.path
                ));
            }
            if TOOLS.contains(&head.as_str()) {
                bad.push(format!(
                    "{}: `crate::{head}` is a tool, not for the library",
                    f.path
                ));
            }
        }
        for (word, allowed, why) in CONFINED {
            let here = allowed.iter().any(|a| f.path.starts_with(a));
            if !here && f.idents.iter().any(|i| i == word) {
                bad.push(format!("{}: names `{word}` ({why})", f.path));
            }
        }
    }
    bad
}

/// Every `.rs` file under `src/`, with its path relative to `src/`.
fn read_tree(src: &Path) -> Result<Vec<File>, String> {
    let mut out = Vec::new();
    let mut dirs = vec![src.to_path_buf()];
    while let Some(dir) = dirs.pop() {
        for entry in std::fs::read_dir(&dir).map_err(|e| format!("{}: {e}", dir.display()))? {
            let p = entry.map_err(|e| e.to_string())?.path();
            if p.is_dir() {
                dirs.push(p);
            } else if p.extension().is_some_and(|e| e == "rs") {
                let rel = p.strip_prefix(src).map_err(|e| e.to_string())?;
                let rel = rel.to_string_lossy().replace('\\', "/");
                let text = std::fs::read_to_string(&p).map_err(|e| format!("{rel}: {e}"))?;
                out.push(file(&rel, &text)?);
            }
        }
    }
    Ok(out)
}

#[test]
fn the_library_is_layered() -> Result<(), String> {
    let files = read_tree(&Path::new(env!("CARGO_MANIFEST_DIR")).join("src"))?;
    for l in LAYERS {
        assert!(
            files.iter().any(|f| folder(&f.path) == Some(l)),
            "no files in src/{l}/"
        );
    }
    let bad = violations(&files);
    assert!(bad.is_empty(), "layering violations:\n{}", bad.join("\n"));
    Ok(())
}

#[test]
fn a_violation_fails() -> Result<(), String> {
    let tree = |files: &[(&str, &str)]| -> Result<Vec<File>, String> {
        files.iter().map(|(p, t)| file(p, t)).collect()
    };
    let lib = "mod base; mod io; mod client;\npub use base::error;\npub use error::{Error, Result};\npub use client::redlock::Redlock;\n";
    // A clean tree: downward paths, and the words named only in comments and strings.
    let clean = tree(&[
        ("lib.rs", lib),
        (
            "protocol/tally.rs",
            "// tokio, crate::client\npub(crate) struct Tally;\nconst S: &str = \"redis crate::io\";\n",
        ),
        (
            "base/error.rs",
            "use crate::protocol::tally::Tally;\npub struct Error;",
        ),
        (
            "io/node.rs",
            "use crate::{base::token, protocol::{Reply, tally}};\nfn f() -> crate::Result<()> { redis::cmd(\"GET\"); Ok(()) }\n",
        ),
        (
            "client/lock.rs",
            "/// Held by a [`Redlock`](crate::Redlock).\npub(crate) struct Lock;\nfn f() { let _ = crate::Redlock::builder; }\n",
        ),
        (
            "sim/net.rs",
            "use crate::client::lock::Lock;\nfn f() { let _ = std::time::Instant::now(); }\n",
        ),
    ])?;
    assert_eq!(violations(&clean), Vec::<String>::new());

    // Each rule broken once.
    let broken = tree(&[
        ("lib.rs", lib),
        (
            "protocol/tally.rs",
            "fn now() -> std::time::Instant { std::time::Instant::now() }\n",
        ),
        (
            "base/error.rs",
            "use crate::{protocol::tally, io::node::Node};\n",
        ),
        (
            "io/fanout.rs",
            "fn f(r: &crate::Redlock) { let _ = crate::sim::World; }\n",
        ),
        (
            "io/peek.rs",
            "macro_rules! m { () => { $crate::client::lock::Lock }; }\n",
        ),
        (
            "client/lock.rs",
            "fn f(d: std::time::Duration) -> u128 { let _ = redis::cmd; d.as_millis() }\n",
        ),
        ("gadgets/x.rs", "fn f() {}\n"),
    ])?;
    let bad = violations(&broken);
    let want = [
        "protocol/tally.rs: names `Instant` (the protocol reads no clock)",
        "base/error.rs: `crate::io` is in `io`, above `base`",
        "io/fanout.rs: `crate::Redlock` is in `client`, above `io`",
        "io/fanout.rs: `crate::sim` is a tool, not for the library",
        "io/peek.rs: `crate::client` is in `client`, above `io`",
        "client/lock.rs: names `redis` (above io, replies are typed)",
        "client/lock.rs: names `as_millis` (durations become request arguments in io/node)",
        "gadgets/x.rs: folder `gadgets` is not a layer: add it to LAYERS",
    ];
    for w in want {
        assert!(bad.iter().any(|b| b == w), "missing {w:?} in {bad:#?}");
    }
    assert_eq!(bad.len(), want.len(), "{bad:#?}");
    Ok(())
}
