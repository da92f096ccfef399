//! Running a script as Redis 7.0 runs it: the crate's own Lua source, in Lua 5.1, its
//! `redis.call` answered by the command model ([`Store`]).
//!
//! What Redis does around a script, and what this module does the same way:
//!
//! * **Compilation.** The source is compiled once, as chunk `@user_script` (so a runtime
//!   error reads `user_script:<line>: …`), and every run calls the compiled function with
//!   `KEYS` and `ARGV` set as globals. Reading an undefined global is an error
//!   (`Script attempted to access nonexistent global variable`), so is creating one.
//! * **Arguments of `redis.call`.** Strings go as they are; numbers are printed with C's
//!   `%.17g` (Redis formats them itself: Lua's own `%.14g` would round a millisecond
//!   timestamp past 10^14); anything else is the error `Lua redis lib command arguments
//!   must be strings or integers`.
//! * **Replies into Lua.** An integer is a number, a bulk string a string, nil is `false`,
//!   a status `{ok = …}`, an array a table (its nils `false`), an error `{err = …}`: raised
//!   by `redis.call` (the script stops; the writes it made stay, Redis has no rollback),
//!   returned by `redis.pcall`.
//! * **The script's result into a reply.** A number is truncated to an integer, `true` is
//!   1, `false` and `nil` are nil, a string is a bulk string, a table with a string `err`
//!   is an error, with a string `ok` a status, otherwise an array up to its first nil.
//! * **Errors that end the script** (raised by `redis.call`, by `error`, or by Lua itself)
//!   answer `<error> script: <sha1>, on @user_script:<line>.`, with `ERR ` in front of a
//!   message that has no code of its own.
//!
//! The interpreter is one per thread, shared by every simulated node of that thread: a
//! script run moves the node's [`Store`] into a thread-local slot, which `redis.call`
//! uses, and back afterwards. Nothing here reads a clock: `TIME` answers the node's clock
//! given to [`eval`].

use std::cell::RefCell;
use std::collections::HashMap;

use mlua::{Function, Lua, MultiValue, StdLib, Table, Value as LuaValue};

use super::lua::{format_number, to_integer_reply};
use super::node::Reply;
use super::redis::{Fault, Store};

/// A script ready to run: its SHA1 (the compiled function's key, and its name in error
/// texts) and its source.
pub(crate) struct Source<'a> {
    pub(crate) sha: &'a str,
    pub(crate) code: &'a str,
}

struct Vm {
    lua: Lua,
    /// `pcall(f)` in Lua, which keeps the error value itself (a table raised by
    /// `redis.call`).
    runner: Function,
    compiled: HashMap<String, Function>,
}

/// The node's data while its script runs, and the node's clock.
struct Running {
    store: Store,
    now_us: u64,
}

thread_local! {
    static VM: RefCell<Option<Vm>> = const { RefCell::new(None) };
    static RUNNING: RefCell<Option<Running>> = const { RefCell::new(None) };
}

/// Runs `script` on `store` at the node's clock `now_us`, as `EVAL` does.
pub(crate) fn eval(
    store: &mut Store,
    now_us: u64,
    script: &Source<'_>,
    keys: &[Vec<u8>],
    args: &[Vec<u8>],
) -> Reply {
    let data = std::mem::take(store);
    RUNNING.with(|r| {
        *r.borrow_mut() = Some(Running {
            store: data,
            now_us,
        })
    });
    let reply = VM.with(|vm| {
        let mut vm = vm.borrow_mut();
        if vm.is_none() {
            match new_vm() {
                Ok(v) => *vm = Some(v),
                Err(e) => return Reply::Error(format!("ERR simulator: no Lua state: {e}")),
            }
        }
        match vm.as_mut() {
            Some(vm) => run(vm, script, keys, args),
            None => Reply::Error("ERR simulator: no Lua state".to_owned()),
        }
    });
    if let Some(r) = RUNNING.with(|r| r.borrow_mut().take()) {
        *store = r.store;
    }
    reply
}

/// The Lua state with Redis's `redis` table and the global protection.
fn new_vm() -> mlua::Result<Vm> {
    let lua = Lua::new_with(
        StdLib::TABLE | StdLib::STRING | StdLib::MATH,
        mlua::LuaOptions::default(),
    )?;
    let raw = lua.create_function(|lua, args: MultiValue| call(lua, args))?;
    let redis = lua.create_table()?;
    redis.set("pcall", raw.clone())?;
    redis.set(
        "error_reply",
        lua.create_function(|lua, msg: mlua::String| {
            let t = lua.create_table()?;
            let text = msg.as_bytes();
            let text = text.strip_prefix(b"-").unwrap_or(&text).to_vec();
            t.set("err", lua.create_string(&text)?)?;
            Ok(t)
        })?,
    )?;
    redis.set(
        "status_reply",
        lua.create_function(|lua, msg: mlua::String| {
            let t = lua.create_table()?;
            t.set("ok", msg)?;
            Ok(t)
        })?,
    )?;
    let globals = lua.globals();
    globals.set("redis", redis)?;
    // `redis.call` raises what `redis.pcall` returns as an error table.
    let wrap: Function = lua
        .load(
            "local raw = ...\n\
             return function(...)\n\
               local r = raw(...)\n\
               if type(r) == 'table' and type(r.err) == 'string' then error(r) end\n\
               return r\n\
             end",
        )
        .set_name("=redis")
        .into_function()?;
    let call_fn: Function = wrap.call(raw)?;
    let redis: Table = globals.get("redis")?;
    redis.set("call", call_fn)?;
    // Redis's global protection: no undefined global is read, none is created.
    let protect: Function = lua
        .load(
            "setmetatable(_G, {\n\
               __index = function(_, name)\n\
                 error(\"Script attempted to access nonexistent global variable '\" .. tostring(name) .. \"'\", 2)\n\
               end,\n\
               __newindex = function() error('Attempt to modify a readonly table', 2) end,\n\
             })",
        )
        .set_name("=protect")
        .into_function()?;
    protect.call::<()>(())?;
    let runner = lua
        .load("local f = ... return pcall(f)")
        .set_name("=eval")
        .into_function()?;
    Ok(Vm {
        lua,
        runner,
        compiled: HashMap::new(),
    })
}

fn run(vm: &mut Vm, script: &Source<'_>, keys: &[Vec<u8>], args: &[Vec<u8>]) -> Reply {
    let funcname = script.sha;
    let f = match vm.compiled.get(script.sha) {
        Some(f) => f.clone(),
        None => match vm
            .lua
            .load(script.code)
            .set_name("@user_script")
            .into_function()
        {
            Ok(f) => {
                vm.compiled.insert(script.sha.to_owned(), f.clone());
                f
            }
            Err(e) => {
                return Reply::Error(format!(
                    "ERR Error compiling script (new function): {}",
                    first_line(&e.to_string())
                ));
            }
        },
    };
    let set = |lua: &Lua| -> mlua::Result<()> {
        let g = lua.globals();
        g.raw_set("KEYS", strings(lua, keys)?)?;
        g.raw_set("ARGV", strings(lua, args)?)?;
        Ok(())
    };
    if let Err(e) = set(&vm.lua) {
        return Reply::Error(format!("ERR simulator: {e}"));
    }
    let outcome = vm.runner.call::<MultiValue>(f);
    match outcome {
        Err(e) => Reply::Error(format!("ERR simulator: {}", first_line(&e.to_string()))),
        Ok(values) => {
            let mut it = values.into_iter();
            match (it.next(), it.next()) {
                (Some(LuaValue::Boolean(true)), result) => to_reply(result.as_ref()),
                (_, err) => raised(err.as_ref(), funcname),
            }
        }
    }
}

fn first_line(s: &str) -> &str {
    s.lines().next().unwrap_or(s)
}

fn strings(lua: &Lua, items: &[Vec<u8>]) -> mlua::Result<Table> {
    let t = lua.create_table_with_capacity(items.len(), 0)?;
    for (i, v) in items.iter().enumerate() {
        t.raw_set(i + 1, lua.create_string(v)?)?;
    }
    Ok(t)
}

/// The reply to a script that ended with an error (`err`, the value raised).
fn raised(err: Option<&LuaValue>, funcname: &str) -> Reply {
    let (msg, line) = match err {
        Some(LuaValue::Table(t)) => {
            let msg = match t.raw_get::<LuaValue>("err") {
                Ok(LuaValue::String(s)) => s.to_string_lossy(),
                _ => "ERR unknown error".to_owned(),
            };
            let line = t.raw_get::<i64>("line").ok();
            (msg, line)
        }
        Some(LuaValue::String(s)) => {
            let text = s.to_string_lossy();
            // "user_script:<line>: <message>"
            let line = text
                .strip_prefix("user_script:")
                .and_then(|rest| rest.split(':').next())
                .and_then(|n| n.parse::<i64>().ok());
            (format!("ERR {text}"), line)
        }
        _ => ("ERR unknown error".to_owned(), None),
    };
    match line {
        Some(line) => Reply::Error(format!("{msg} script: {funcname}, on @user_script:{line}.")),
        None => Reply::Error(msg),
    }
}

/// A script's result as a reply.
fn to_reply(v: Option<&LuaValue>) -> Reply {
    match v {
        Some(LuaValue::String(s)) => Reply::Bulk(s.as_bytes().to_vec()),
        Some(LuaValue::Boolean(true)) => Reply::Int(1),
        Some(LuaValue::Integer(i)) => Reply::Int(*i),
        Some(LuaValue::Number(n)) => Reply::Int(to_integer_reply(*n)),
        Some(LuaValue::Table(t)) => {
            if let Ok(LuaValue::String(e)) = t.raw_get::<LuaValue>("err") {
                return Reply::Error(e.to_string_lossy());
            }
            if let Ok(LuaValue::String(s)) = t.raw_get::<LuaValue>("ok") {
                return Reply::Status(s.to_string_lossy());
            }
            let mut out = Vec::new();
            // Bounded by the table's size: a table ends at its first nil.
            for i in 1..=t.raw_len() + 1 {
                match t.raw_get::<LuaValue>(i) {
                    Ok(LuaValue::Nil) | Err(_) => break,
                    Ok(v) => out.push(to_reply(Some(&v))),
                }
            }
            Reply::Array(out)
        }
        _ => Reply::Nil,
    }
}

/// A reply as `redis.call` hands it to the script.
fn to_lua(lua: &Lua, r: Reply) -> mlua::Result<LuaValue> {
    Ok(match r {
        Reply::Nil => LuaValue::Boolean(false),
        Reply::Int(i) => LuaValue::Number(i as f64),
        Reply::Bulk(b) => LuaValue::String(lua.create_string(&b)?),
        Reply::Status(s) => {
            let t = lua.create_table()?;
            t.set("ok", s)?;
            LuaValue::Table(t)
        }
        Reply::Error(e) => error_table(lua, &e)?,
        Reply::Array(items) => {
            let t = lua.create_table_with_capacity(items.len(), 0)?;
            for (i, item) in items.into_iter().enumerate() {
                t.raw_set(i + 1, to_lua(lua, item)?)?;
            }
            LuaValue::Table(t)
        }
    })
}

/// `{err = msg}`, with the line of the script's call, as Redis builds it.
fn error_table(lua: &Lua, msg: &str) -> mlua::Result<LuaValue> {
    let t = lua.create_table()?;
    t.set("err", msg)?;
    // The script's own frame: the first one from chunk `@user_script`, up the stack.
    for level in 1..=4 {
        let Some(d) = lua.inspect_stack(level) else {
            break;
        };
        if d.source().source.as_deref() == Some("@user_script") {
            t.set("source", "@user_script")?;
            t.set("line", d.curr_line())?;
            break;
        }
    }
    Ok(LuaValue::Table(t))
}

/// `redis.pcall` (and, through its wrapper, `redis.call`).
fn call(lua: &Lua, args: MultiValue) -> mlua::Result<LuaValue> {
    if args.is_empty() {
        return error_table(
            lua,
            "ERR Please specify at least one argument for this redis lib call",
        );
    }
    let mut words = Vec::with_capacity(args.len());
    for a in args {
        match a {
            LuaValue::String(s) => words.push(s.as_bytes().to_vec()),
            LuaValue::Number(n) => words.push(format_number(n).into_bytes()),
            LuaValue::Integer(i) => words.push(format_number(i as f64).into_bytes()),
            _ => {
                return error_table(
                    lua,
                    "ERR Lua redis lib command arguments must be strings or integers",
                );
            }
        }
    }
    let result = RUNNING.with(|r| {
        let mut r = r.borrow_mut();
        match r.as_mut() {
            Some(run) => run.store.command(run.now_us, &words),
            None => Err(Fault::Unknown),
        }
    });
    match result {
        Ok(reply) => to_lua(lua, reply),
        Err(Fault::Unknown) => error_table(lua, "ERR Unknown Redis command called from script"),
        Err(Fault::Arity(_)) => error_table(
            lua,
            "ERR Wrong number of args calling Redis command from script",
        ),
    }
}
