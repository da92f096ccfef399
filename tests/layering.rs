//! The library's layering, checked from its source text (no Redis, no network).
//!
//! ```text
//!   tools     testkit, sim                                   (may use everything)
//!   top       watchdog                                       (kept locks, scoped use)
//!   client    client, config, shared, lock, acquire, fencing, groups, wait, transfer, inspect,
//!             rwlock, semaphore, spanning
//!   io        node, fanout, background, notifier, extender   (sockets, tasks, timers)
//!   base      addr, error, metrics, resource, slot, token, time (plain data and arithmetic; metrics)
//!   protocol  protocol::*                                    (the pure core)
//! ```
//!
//! Every `crate::…`, `$crate::…`, `super::…` reference and every `use` of a module's own
//! children is read from `src/**/*.rs` (comments and string literals removed) and
//! resolved to the file that defines it, through re-exports. The checks:
//!
//! 1. `protocol/` refers to no other module of the crate and names nothing of tokio,
//!    redis, futures, rand, `Instant` or `SystemTime`: replies and time are its inputs;
//! 2. a module refers only to modules of its own layer or below, and every module has a
//!    layer (a new file must be placed);
//! 3. there is no import cycle among the library's modules (the cycle is printed);
//! 4. no function in `protocol/` or in an io-layer file is longer than [`MAX_FN_LINES`]
//!    lines (signature to closing brace), except the allow-listed ones, each with a reason;
//! 5. a duration becomes a request's millisecond argument only in `node.rs`
//!    (`millis_ceil` is named nowhere else, `as_millis` only there and in `time.rs`);
//! 6. nothing above the io layer names `redis`: raw Redis values are decoded in `node.rs`,
//!    and the client layer sees typed replies only.
//!
//! `checks_can_fail` runs the same checks on small in-memory fixtures that break each rule.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

/// The longest function allowed in `protocol/` and the io layer.
const MAX_FN_LINES: usize = 60;

/// Functions allowed to be longer, with the reason: (file, function, reason).
const LONG_FN_ALLOWED: &[(&str, &str, &str)] = &[];

/// Layers, lowest first. A module is in the layer of its longest listed prefix.
const LAYERS: &[(&str, &[&str])] = &[
    ("protocol", &["protocol"]),
    (
        "base",
        &[
            "addr", "error", "metrics", "resource", "slot", "token", "time",
        ],
    ),
    (
        "io",
        &[
            "node",
            "fanout",
            "background",
            "notifier",
            "extender",
            "groupmap",
            "peek",
        ],
    ),
    (
        "client",
        &[
            "client",
            "config",
            "shared",
            "lock",
            "acquire",
            "fencing",
            "groups",
            "wait",
            "transfer",
            "inspect",
            "rwlock",
            "semaphore",
            "spanning",
        ],
    ),
    ("top", &["watchdog"]),
    ("tools", &["testkit", "sim"]),
];

/// Files whose functions must stay short: the pure core and the io layer.
fn length_checked(module: &str) -> bool {
    matches!(layer_of(module), Some((0, _)) | Some((2, _)))
}

/// Words the pure core must not contain.
const IMPURE: &[&str] = &[
    "tokio",
    "redis",
    "futures",
    "rand",
    "Instant",
    "SystemTime",
    "UNIX_EPOCH",
];

// ---------------------------------------------------------------------------------------
// Reading the sources.

/// One library file: its module path (`""` for the crate root, `protocol::tally`), its
/// file name relative to `src/`, and its code without comments or literals.
struct Source {
    module: String,
    file: String,
    code: String,
}

fn module_of(file: &str) -> String {
    let f = file.trim_end_matches(".rs");
    let f = f.strip_suffix("/mod").unwrap_or(f);
    if f == "lib" {
        String::new()
    } else {
        f.replace('/', "::")
    }
}

fn source(file: &str, text: &str) -> Source {
    Source {
        module: module_of(file),
        file: file.to_owned(),
        code: strip(text),
    }
}

/// Reads every library file under `src/` (not the binary).
fn read_tree(src: &Path) -> Vec<Source> {
    let mut out = Vec::new();
    let mut dirs = vec![src.to_path_buf()];
    while let Some(dir) = dirs.pop() {
        let mut entries: Vec<_> = std::fs::read_dir(&dir)
            .expect("read src")
            .map(|e| e.expect("entry").path())
            .collect();
        entries.sort();
        for p in entries {
            let rel = p.strip_prefix(src).expect("under src");
            let rel = rel.to_string_lossy().replace('\\', "/");
            if rel == "bin" || rel.starts_with("bin/") {
                continue;
            }
            if p.is_dir() {
                dirs.push(p);
            } else if rel.ends_with(".rs") {
                let text = std::fs::read_to_string(&p).expect("read file");
                out.push(source(&rel, &text));
            }
        }
    }
    out
}

/// The code with comments, string and character literals blanked out (newlines kept,
/// so line numbers stay right).
fn strip(text: &str) -> String {
    let c: Vec<char> = text.chars().collect();
    let mut out = String::with_capacity(text.len());
    let mut i = 0;
    let blank = |out: &mut String, ch: char| out.push(if ch == '\n' { '\n' } else { ' ' });
    while i < c.len() {
        let at = |k: usize| c.get(k).copied().unwrap_or('\0');
        if at(i) == '/' && at(i + 1) == '/' {
            while i < c.len() && c[i] != '\n' {
                out.push(' ');
                i += 1;
            }
        } else if at(i) == '/' && at(i + 1) == '*' {
            let mut depth = 0;
            while i < c.len() {
                if at(i) == '/' && at(i + 1) == '*' {
                    depth += 1;
                    out.push_str("  ");
                    i += 2;
                } else if at(i) == '*' && at(i + 1) == '/' {
                    depth -= 1;
                    out.push_str("  ");
                    i += 2;
                    if depth == 0 {
                        break;
                    }
                } else {
                    blank(&mut out, c[i]);
                    i += 1;
                }
            }
        } else if (at(i) == 'r' || (at(i) == 'b' && at(i + 1) == 'r'))
            && !ident_char(at(i.wrapping_sub(1)))
            && {
                let s = if at(i) == 'b' { i + 2 } else { i + 1 };
                let mut k = s;
                while at(k) == '#' {
                    k += 1;
                }
                at(k) == '"'
            }
        {
            // A raw string: r"…", r#"…"#, br"…".
            let s = if at(i) == 'b' { i + 2 } else { i + 1 };
            let mut k = s;
            while at(k) == '#' {
                k += 1;
            }
            let hashes = k - s;
            for _ in i..=k {
                out.push(' ');
            }
            i = k + 1;
            while i < c.len() {
                if c[i] == '"' && (1..=hashes).all(|h| at(i + h) == '#') {
                    for _ in 0..=hashes {
                        out.push(' ');
                    }
                    i += hashes + 1;
                    break;
                }
                blank(&mut out, c[i]);
                i += 1;
            }
        } else if at(i) == '"' {
            out.push(' ');
            i += 1;
            while i < c.len() && c[i] != '"' {
                if c[i] == '\\' {
                    blank(&mut out, c[i]);
                    i += 1;
                }
                if i < c.len() {
                    blank(&mut out, c[i]);
                    i += 1;
                }
            }
            out.push(' ');
            i += 1;
        } else if at(i) == '\'' {
            // A character literal ('a', '\n', '\u{1F600}'), or a lifetime ('a).
            if at(i + 1) == '\\' {
                let mut k = i + 2;
                while k < c.len() && c[k] != '\'' {
                    k += 1;
                }
                for _ in i..=k.min(c.len() - 1) {
                    out.push(' ');
                }
                i = k + 1;
            } else if at(i + 2) == '\'' {
                out.push_str("   ");
                i += 3;
            } else {
                out.push('\'');
                i += 1;
            }
        } else {
            out.push(c[i]);
            i += 1;
        }
    }
    out
}

fn ident_char(ch: char) -> bool {
    ch.is_alphanumeric() || ch == '_'
}

// ---------------------------------------------------------------------------------------
// References.

/// The inline `mod name { … }` blocks of a file: (name, byte range of the body).
fn inline_mods(code: &str) -> Vec<(String, std::ops::Range<usize>)> {
    let b = code.as_bytes();
    let mut out = Vec::new();
    let mut i = 0;
    while let Some(p) = code[i..].find("mod ") {
        let at = i + p;
        i = at + 4;
        if at > 0 && ident_char(b[at - 1] as char) {
            continue;
        }
        let rest = &code[at + 4..];
        let name: String = rest.chars().take_while(|c| ident_char(*c)).collect();
        let after = rest[name.len()..].trim_start();
        if name.is_empty() || !after.starts_with('{') {
            continue;
        }
        let open = at + 4 + name.len() + (rest.len() - name.len() - after.len());
        let mut depth = 0;
        let mut end = code.len();
        for (k, ch) in code[open..].char_indices() {
            match ch {
                '{' => depth += 1,
                '}' => {
                    depth -= 1;
                    if depth == 0 {
                        end = open + k;
                        break;
                    }
                }
                _ => {}
            }
        }
        out.push((name, open..end));
    }
    out
}

/// Parses a `use` tree (or a plain path) starting at `s`: every leaf path, as segments.
fn use_tree(s: &str) -> Vec<Vec<String>> {
    fn tree(s: &[char], i: &mut usize, prefix: &[String], out: &mut Vec<Vec<String>>) {
        let skip_ws = |i: &mut usize| {
            while *i < s.len() && s[*i].is_whitespace() {
                *i += 1;
            }
        };
        let mut path = prefix.to_vec();
        loop {
            skip_ws(i);
            if *i < s.len() && s[*i] == '{' {
                *i += 1;
                loop {
                    skip_ws(i);
                    if *i >= s.len() || s[*i] == '}' {
                        *i += 1;
                        return;
                    }
                    tree(s, i, &path, out);
                    skip_ws(i);
                    if *i < s.len() && s[*i] == ',' {
                        *i += 1;
                    }
                }
            }
            let start = *i;
            while *i < s.len() && (ident_char(s[*i]) || s[*i] == '$' || s[*i] == '*') {
                *i += 1;
            }
            if *i == start {
                out.push(path);
                return;
            }
            path.push(s[start..*i].iter().collect());
            skip_ws(i);
            if *i + 1 < s.len() && s[*i] == ':' && s[*i + 1] == ':' {
                *i += 2;
                continue;
            }
            // `as name` and anything else end the path.
            out.push(path);
            while *i < s.len() && !matches!(s[*i], ',' | '}' | ';') {
                *i += 1;
            }
            return;
        }
    }
    let chars: Vec<char> = s.chars().collect();
    let mut out = Vec::new();
    let mut i = 0;
    tree(&chars, &mut i, &[], &mut out);
    out
}

/// Every path a file names that starts at `crate`, `$crate`, `super` or `self`, and every
/// `use` path (which may start at a child module), with the module it was named in
/// (inline modules included, e.g. `node::tests`).
fn raw_paths(src: &Source) -> Vec<(String, Vec<String>)> {
    let code = &src.code;
    let mods = inline_mods(code);
    let scope = |at: usize| -> String {
        let mut m = src.module.clone();
        for (name, range) in &mods {
            if range.contains(&at) {
                m = if m.is_empty() {
                    name.clone()
                } else {
                    format!("{m}::{name}")
                };
            }
        }
        m
    };
    let mut out = Vec::new();
    let b = code.as_bytes();
    for (idx, _) in code.match_indices("use ") {
        if idx > 0 && ident_char(b[idx - 1] as char) {
            continue;
        }
        let end = code[idx..].find(';').map_or(code.len(), |e| idx + e);
        for p in use_tree(&code[idx + 4..end]) {
            out.push((scope(idx), p));
        }
    }
    for head in ["$crate::", "crate::", "super::"] {
        for (idx, _) in code.match_indices(head) {
            let prev = if idx > 0 { b[idx - 1] as char } else { ' ' };
            if ident_char(prev) || prev == '$' || (prev == ':' && head != "$crate::") {
                continue;
            }
            for p in use_tree(&code[idx..]).into_iter().take(1) {
                out.push((scope(idx), p));
            }
        }
    }
    out
}

/// The modules defined by the files, and the names each re-exports (name → module).
struct Tree {
    modules: BTreeSet<String>,
    reexports: BTreeMap<(String, String), String>,
}

fn join(a: &str, b: &str) -> String {
    if a.is_empty() {
        b.to_owned()
    } else {
        format!("{a}::{b}")
    }
}

fn parent(m: &str) -> String {
    m.rsplit_once("::")
        .map_or(String::new(), |(p, _)| p.to_owned())
}

impl Tree {
    fn new(sources: &[Source]) -> Tree {
        let modules: BTreeSet<String> = sources.iter().map(|s| s.module.clone()).collect();
        let mut tree = Tree {
            modules,
            reexports: BTreeMap::new(),
        };
        // Re-exports: `pub use …` / `pub(crate) use …` whose leaf is an item.
        for _ in 0..3 {
            for s in sources {
                for (idx, _) in s.code.match_indices("use ") {
                    let before = s.code[..idx].trim_end();
                    if !(before.ends_with("pub") || before.ends_with(')')) {
                        continue;
                    }
                    let end = s.code[idx..].find(';').map_or(s.code.len(), |e| idx + e);
                    for p in use_tree(&s.code[idx + 4..end]) {
                        let Some(name) = p.last().cloned() else {
                            continue;
                        };
                        if let Some(target) = tree.resolve(&s.module, &p)
                            && target != s.module
                        {
                            tree.reexports.insert((s.module.clone(), name), target);
                        }
                    }
                }
            }
        }
        tree
    }

    /// The module (file) a path names, through re-exports; `None` outside the crate.
    fn resolve(&self, at: &str, path: &[String]) -> Option<String> {
        let mut segs = path.iter().peekable();
        let mut m = match segs.peek().map(|s| s.as_str()) {
            Some("crate" | "$crate") => {
                segs.next();
                String::new()
            }
            Some("super") => {
                let mut m = at.to_owned();
                while segs.peek().map(|s| s.as_str()) == Some("super") {
                    segs.next();
                    m = parent(&m);
                }
                m
            }
            Some("self") => {
                segs.next();
                at.to_owned()
            }
            Some(first) if self.modules.contains(&join(at, first)) => at.to_owned(),
            // An inline module's `use child::…` (the file's own children).
            _ => return None,
        };
        // Inline modules (`node::tests`) are part of their file's module.
        while !m.is_empty() && !self.modules.contains(&m) {
            m = parent(&m);
        }
        for seg in segs {
            let child = join(&m, seg);
            if self.modules.contains(&child) {
                m = child;
            } else if let Some(t) = self.reexports.get(&(m.clone(), seg.clone())) {
                return Some(t.clone());
            } else {
                break;
            }
        }
        Some(m)
    }
}

/// The module graph: for each module, the other modules it refers to. A module's own
/// children (declared and re-exported by it) are structure, not dependencies.
fn graph(sources: &[Source]) -> BTreeMap<String, BTreeSet<String>> {
    let tree = Tree::new(sources);
    let mut g: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for s in sources {
        let deps = g.entry(s.module.clone()).or_default();
        for (scope, p) in raw_paths(s) {
            let Some(target) = tree.resolve(&scope, &p) else {
                continue;
            };
            let own_child = target.starts_with(&format!("{}::", s.module)) || s.module.is_empty();
            if target != s.module && !own_child && !target.is_empty() {
                deps.insert(target);
            }
        }
    }
    g
}

// ---------------------------------------------------------------------------------------
// Checks.

fn layer_of(module: &str) -> Option<(usize, &'static str)> {
    let top = module.split("::").next().unwrap_or("");
    LAYERS
        .iter()
        .enumerate()
        .find(|(_, (_, ms))| ms.contains(&top))
        .map(|(i, (name, _))| (i, *name))
}

fn word_at(code: &str, word: &str) -> Option<usize> {
    let b = code.as_bytes();
    code.match_indices(word).map(|(i, _)| i).find(|&i| {
        let before = i == 0 || !ident_char(b[i - 1] as char);
        let after = b
            .get(i + word.len())
            .is_none_or(|c| !ident_char(*c as char));
        before && after
    })
}

fn line_of(code: &str, at: usize) -> usize {
    code[..at].matches('\n').count() + 1
}

/// The pure core names no other module and nothing of I/O or the clock.
fn purity(sources: &[Source], g: &BTreeMap<String, BTreeSet<String>>) -> Vec<String> {
    let mut bad = Vec::new();
    for s in sources
        .iter()
        .filter(|s| layer_of(&s.module) == Some((0, "protocol")))
    {
        for dep in &g[&s.module] {
            if !(dep == "protocol" || dep.starts_with("protocol::")) {
                bad.push(format!(
                    "{}: protocol refers to crate module `{dep}`",
                    s.file
                ));
            }
        }
        for w in IMPURE {
            if let Some(at) = word_at(&s.code, w) {
                let line = line_of(&s.code, at);
                bad.push(format!("{}:{line}: protocol names `{w}`", s.file));
            }
        }
    }
    bad
}

/// Every module has a layer and refers only to its own layer or below.
fn layers(g: &BTreeMap<String, BTreeSet<String>>) -> Vec<String> {
    let mut bad = Vec::new();
    for (m, deps) in g {
        if m.is_empty() {
            continue; // the crate root declares and re-exports everything
        }
        let Some((lm, name)) = layer_of(m) else {
            bad.push(format!("module `{m}` has no layer: add it to LAYERS"));
            continue;
        };
        for d in deps {
            if let Some((ld, dname)) = layer_of(d)
                && ld > lm
            {
                bad.push(format!(
                    "`{m}` ({name}) refers to `{d}` ({dname}), a higher layer"
                ));
            }
        }
    }
    bad
}

/// The import cycles: each group of modules that reach one another (a strongly connected
/// component), with one cycle through it, as `a -> b -> … -> a`.
fn cycles(g: &BTreeMap<String, BTreeSet<String>>) -> Vec<String> {
    let reach = |from: &str| -> BTreeSet<String> {
        let mut seen = BTreeSet::new();
        let mut todo = vec![from.to_owned()];
        while let Some(m) = todo.pop() {
            for d in g.get(&m).into_iter().flatten() {
                if seen.insert(d.clone()) {
                    todo.push(d.clone());
                }
            }
        }
        seen
    };
    let mut done = BTreeSet::new();
    let mut out = Vec::new();
    for m in g.keys().filter(|m| !m.is_empty()) {
        if done.contains(m) || !reach(m).contains(m) {
            continue;
        }
        let group: BTreeSet<String> = g
            .keys()
            .filter(|o| *o == m || (reach(m).contains(*o) && reach(o).contains(m)))
            .cloned()
            .collect();
        done.extend(group.iter().cloned());
        // One cycle: a shortest path back to `m` within the group (breadth first).
        let mut prev: BTreeMap<String, String> = BTreeMap::new();
        let mut queue = std::collections::VecDeque::from([m.clone()]);
        let mut last = None;
        while let Some(x) = queue.pop_front() {
            for d in g
                .get(&x)
                .into_iter()
                .flatten()
                .filter(|d| group.contains(*d))
            {
                if d == m {
                    last = Some(x.clone());
                    break;
                }
                if !prev.contains_key(d) {
                    prev.insert(d.clone(), x.clone());
                    queue.push_back(d.clone());
                }
            }
            if last.is_some() {
                break;
            }
        }
        let mut path = vec![m.clone()];
        let mut at = last.unwrap_or_else(|| m.clone());
        while at != *m {
            path.push(at.clone());
            at = prev.get(&at).cloned().unwrap_or_else(|| m.clone());
        }
        path[1..].reverse();
        path.push(m.clone());
        let names: Vec<&str> = group.iter().map(String::as_str).collect();
        out.push(format!(
            "import cycle among {{{}}}: {}",
            names.join(", "),
            path.join(" -> ")
        ));
    }
    out
}

/// Functions longer than [`MAX_FN_LINES`] in the length-checked files: the signature's
/// line to the closing brace at the signature's indentation.
fn long_functions(sources: &[Source]) -> Vec<String> {
    let mut bad = Vec::new();
    for s in sources.iter().filter(|s| length_checked(&s.module)) {
        let lines: Vec<&str> = s.code.lines().collect();
        for (n, line) in lines.iter().enumerate() {
            let Some(name) = fn_name(line) else { continue };
            let t = line.trim_end();
            if t.ends_with(';') || t.ends_with('}') {
                continue; // a declaration, or a one-line body
            }
            let indent = line.len() - line.trim_start().len();
            let close = format!("{}}}", &line[..indent]);
            let Some(end) = lines[n + 1..].iter().position(|l| {
                l.trim_end() == close || l.trim_end().starts_with(&format!("{close};"))
            }) else {
                continue;
            };
            let len = end + 2;
            let allowed = LONG_FN_ALLOWED
                .iter()
                .any(|(f, fname, _)| *f == s.file && *fname == name);
            if len > MAX_FN_LINES && !allowed {
                bad.push(format!(
                    "{}:{}: fn {name} is {len} lines (at most {MAX_FN_LINES})",
                    s.file,
                    n + 1
                ));
            }
        }
    }
    bad
}

/// The function a line declares, if it starts a `fn` item.
fn fn_name(line: &str) -> Option<String> {
    let mut rest = line.trim_start();
    for q in [
        "pub(crate) ",
        "pub(super) ",
        "pub ",
        "const ",
        "async ",
        "unsafe ",
    ] {
        rest = rest.strip_prefix(q).unwrap_or(rest);
        rest = rest.trim_start();
    }
    for q in ["const ", "async ", "unsafe "] {
        rest = rest.strip_prefix(q).unwrap_or(rest);
    }
    let rest = rest.strip_prefix("fn ")?;
    let name: String = rest.chars().take_while(|c| ident_char(*c)).collect();
    (!name.is_empty()).then_some(name)
}

/// A duration becomes a request argument only in `node.rs`.
fn millis(sources: &[Source]) -> Vec<String> {
    let mut bad = Vec::new();
    for s in sources {
        let lib = s.module.is_empty() || layer_of(&s.module).is_some_and(|(l, _)| l < 5);
        if !lib || s.module == "node" {
            continue;
        }
        if let Some(at) = word_at(&s.code, "millis_ceil") {
            bad.push(format!(
                "{}:{}: millis_ceil outside node.rs",
                s.file,
                line_of(&s.code, at)
            ));
        }
        if s.module != "time"
            && let Some(at) = word_at(&s.code, "as_millis")
        {
            bad.push(format!(
                "{}:{}: as_millis outside node.rs and time.rs",
                s.file,
                line_of(&s.code, at)
            ));
        }
    }
    bad
}

/// Nothing above the io layer names `redis`.
fn typed_only(sources: &[Source]) -> Vec<String> {
    let mut bad = Vec::new();
    for s in sources {
        let above_io = layer_of(&s.module).is_some_and(|(l, _)| (3..5).contains(&l));
        if above_io && let Some(at) = word_at(&s.code, "redis") {
            bad.push(format!(
                "{}:{}: names `redis` above the io layer",
                s.file,
                line_of(&s.code, at)
            ));
        }
    }
    bad
}

/// Every check, with every violation found.
fn violations(sources: &[Source]) -> Vec<String> {
    let g = graph(sources);
    let mut bad = purity(sources, &g);
    bad.extend(layers(&g));
    bad.extend(cycles(&g));
    bad.extend(long_functions(sources));
    bad.extend(millis(sources));
    bad.extend(typed_only(sources));
    bad
}

fn show(g: &BTreeMap<String, BTreeSet<String>>) -> String {
    let mut s = String::new();
    for (m, deps) in g.iter().filter(|(m, _)| !m.is_empty()) {
        let deps: Vec<&str> = deps.iter().map(String::as_str).collect();
        s.push_str(&format!("{m} -> {}\n", deps.join(", ")));
    }
    s
}

#[test]
fn the_library_is_layered() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let sources = read_tree(&src);
    assert!(
        sources.iter().any(|s| s.module == "protocol::tally"),
        "the sources were not found"
    );
    let g = graph(&sources);
    println!("{}", show(&g));
    let bad = violations(&sources);
    assert!(bad.is_empty(), "layering violations:\n{}", bad.join("\n"));
}

// ---------------------------------------------------------------------------------------
// The checks can fail.

fn long_fn(name: &str, lines: usize) -> String {
    let mut s = format!("pub(crate) fn {name}() {{\n");
    for i in 0..lines.saturating_sub(2) {
        s.push_str(&format!("    let _x{i} = {i};\n"));
    }
    s.push_str("}\n");
    s
}

fn fixture(files: &[(&str, &str)]) -> Vec<Source> {
    files.iter().map(|(f, t)| source(f, t)).collect()
}

#[test]
fn checks_can_fail() {
    // A clean tree: nothing to report.
    let clean = fixture(&[
        ("lib.rs", "mod protocol; mod node; pub use node::Node;"),
        (
            "protocol/mod.rs",
            "pub(crate) mod tally;\npub(crate) use tally::Tally;\n",
        ),
        (
            "protocol/tally.rs",
            "use std::time::Duration;\n// tokio is named only in a comment\npub(crate) struct Tally;\nconst S: &str = \"redis\";\n",
        ),
        (
            "node.rs",
            "use crate::protocol::Tally;\npub struct Node;\nfn f() { let _ = crate::protocol::tally::Tally; }\n",
        ),
    ]);
    assert_eq!(violations(&clean), Vec::<String>::new());
    assert_eq!(
        graph(&clean)["node"],
        BTreeSet::from(["protocol::tally".to_owned()])
    );

    // The pure core names another module and the clock.
    let impure = fixture(&[
        ("protocol/mod.rs", "pub(crate) mod tally;"),
        (
            "protocol/tally.rs",
            "use crate::node::Node;\nfn now() -> std::time::Instant { std::time::Instant::now() }\n",
        ),
        ("node.rs", "pub struct Node;"),
    ]);
    let bad = violations(&impure);
    assert!(
        bad.iter()
            .any(|v| v.contains("refers to crate module `node`")),
        "{bad:?}"
    );
    assert!(bad.iter().any(|v| v.contains("names `Instant`")), "{bad:?}");

    // A cycle, reported as such, and a lower layer using a higher one.
    let cyclic = fixture(&[
        ("node.rs", "use crate::fanout::Round;\npub struct Node;"),
        (
            "fanout.rs",
            "pub struct Round;\nfn f() { let _ = super::node::Node; }",
        ),
        ("error.rs", "use crate::{client::Redlock, node};"),
        ("client.rs", "pub struct Redlock;"),
    ]);
    let bad = violations(&cyclic);
    assert!(
        bad.iter()
            .any(|v| v == "import cycle among {fanout, node}: fanout -> node -> fanout"),
        "{bad:?}"
    );
    assert!(
        bad.iter()
            .any(|v| v.contains("`error` (base) refers to `client` (client)")),
        "{bad:?}"
    );
    assert!(
        bad.iter()
            .any(|v| v.contains("`error` (base) refers to `node` (io)")),
        "{bad:?}"
    );

    // A long function in the io layer and in the core, but not in a client-layer file;
    // a module without a layer; a TTL converted outside node.rs.
    let long = fixture(&[
        ("node.rs", &long_fn("send", 70)),
        (
            "protocol/mod.rs",
            &format!("mod tests {{\n{}}}\n", long_fn("t", 61)),
        ),
        ("client.rs", &long_fn("build", 200)),
        ("gadget.rs", "fn f() {}"),
        (
            "lock.rs",
            "fn f(d: std::time::Duration) -> u128 { d.as_millis() }",
        ),
        ("node.rs", &long_fn("ok", 60)),
    ]);
    let bad = violations(&long);
    assert!(
        bad.iter()
            .any(|v| v.starts_with("node.rs:1: fn send is 70 lines")),
        "{bad:?}"
    );
    assert!(
        bad.iter().any(|v| v.contains("fn t is 61 lines")),
        "{bad:?}"
    );
    assert!(
        !bad.iter()
            .any(|v| v.contains("fn build") || v.contains("fn ok")),
        "{bad:?}"
    );
    assert!(
        bad.iter().any(|v| v.contains("`gadget` has no layer")),
        "{bad:?}"
    );
    assert!(
        bad.iter().any(|v| v.starts_with("lock.rs:1: as_millis")),
        "{bad:?}"
    );
}

#[test]
fn the_reader_resolves_paths() {
    let s = source(
        "wait.rs",
        "use crate::{client::{Inner, acquire_once}, node::{self, Reply as R}};\n\
         use std::time::Duration;\n\
         fn f() { let _ = crate::fanout::spawn(async {}); let _ = '}'; let _ = \"use crate::x::Y;\"; }\n\
         #[cfg(test)]\nmod tests { use super::*; use crate::NodeOutcome; }\n",
    );
    let lib = source("lib.rs", "pub use error::NodeOutcome;\nmod error;");
    let others = ["client.rs", "node.rs", "error.rs", "background.rs"];
    let mut all = vec![s, lib];
    all.extend(others.iter().map(|f| source(f, "")));
    all.push(source(
        "fanout.rs",
        "pub(crate) use crate::background::spawn;",
    ));
    let g = graph(&all);
    let want: BTreeSet<String> = ["client", "node", "background", "error"]
        .iter()
        .map(|s| (*s).to_owned())
        .collect();
    assert_eq!(g["wait"], want);
    assert_eq!(
        use_tree("crate::{a::{b, c as d}, e::*}"),
        vec![
            vec!["crate", "a", "b"],
            vec!["crate", "a", "c"],
            vec!["crate", "e", "*"]
        ]
        .into_iter()
        .map(|p| p.into_iter().map(str::to_owned).collect::<Vec<_>>())
        .collect::<Vec<_>>()
    );
}
