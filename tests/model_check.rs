//! Exhaustive model checking of the lock and fencing protocol in small cases.
//!
//! `tests/model/mod.rs` models 3 nodes, 2 clients and one resource in discrete time, with
//! crashes and restarts (persisted, or empty after a delay), delayed, reordered and lost
//! messages, fast node clocks and paused clients. Every state reachable within the bounds
//! is checked against three safety properties (mutual exclusion of believed holds, rising
//! fencing tokens, `remaining()` backed by a quorum) and three liveness witnesses, so a
//! model that cannot acquire is caught.
//!
//! Each known-unsafe variant (a quorum of N/2, no drift allowance, extensions that can
//! shorten, an immediate restart without persistence, a release that does not check the
//! token) must produce a counterexample: a checker that cannot fail proves nothing.
//!
//! `QUORUMLOCK_MODEL_DEEP=1` runs the longer exploration (more ticks, attempts and faults).

mod model;

use std::collections::BTreeSet;
use std::time::Instant;

use model::{LockModel, Protocol};
use stateright::{Checker, HasDiscoveries, Model};

/// Explores `protocol` completely and asserts every property: no safety property is
/// violated and every liveness witness is found.
fn check_in_contract(name: &str, protocol: Protocol) {
    let started = Instant::now();
    let checker = LockModel(protocol).checker().spawn_bfs().join();
    println!(
        "{name}: {} states ({} unique), depth {}, {:.1?}",
        checker.state_count(),
        checker.unique_state_count(),
        checker.max_depth(),
        started.elapsed()
    );
    checker.assert_properties();
}

/// Explores `protocol` until `property` is violated and asserts that it is; prints the
/// counterexample.
fn find_counterexample(name: &str, protocol: Protocol, property: &'static str) {
    let started = Instant::now();
    let checker = LockModel(protocol)
        .checker()
        .finish_when(HasDiscoveries::AnyOf(BTreeSet::from([property])))
        .spawn_bfs()
        .join();
    let path = checker.discovery(property);
    println!(
        "{name}: {} states ({} unique), {:.1?}",
        checker.state_count(),
        checker.unique_state_count(),
        started.elapsed()
    );
    let Some(path) = path else {
        panic!("{name}: no counterexample to {property:?}: the checker cannot see this bug");
    };
    let actions = path.clone().into_actions();
    println!(
        "{name}: counterexample to {property:?} in {} steps:",
        actions.len()
    );
    for a in &actions {
        println!("  {a}");
    }
    println!("  final: {:?}", path.last_state());
}

/// The CI sizes: TTL 2 ticks, drift allowance 1, every node's clock 1 tick fast, one
/// attempt per client, ticks 0..=2; the tests below add one kind of fault each.
fn base() -> Protocol {
    Protocol::in_contract()
}

#[test]
fn in_contract_lock_with_delays_and_pauses() {
    let mut p = base();
    p.fencing = false;
    check_in_contract("lock: delays, pauses", p);
}

#[test]
fn in_contract_lock_with_a_lost_message() {
    let mut p = base();
    p.fencing = false;
    p.losses = 1;
    check_in_contract("lock: one lost request", p);
}

#[test]
fn in_contract_fenced_lock_with_delays_and_pauses() {
    let mut p = base();
    p.max_tick = 1;
    check_in_contract("fenced lock: delays, pauses", p);
}

/// The longer explorations: `cargo test --test model_check -- --ignored` (minutes).
#[test]
#[ignore = "long: minutes in a debug build"]
fn deep_in_contract_crash_restart() {
    let mut p = base();
    p.fencing = false;
    p.crashes = 1;
    check_in_contract("lock: one crash, persisted or delayed restart", p);
}

#[test]
#[ignore = "long: minutes in a debug build"]
fn deep_in_contract_extend() {
    let mut p = base();
    p.fencing = false;
    p.extends = 1;
    check_in_contract("lock: one extension (TTL 1 or 2)", p);
}

#[test]
#[ignore = "long: minutes in a debug build"]
fn deep_in_contract_fenced_crash_restart() {
    let mut p = base();
    p.crashes = 1;
    check_in_contract("fenced lock: one crash, persisted or delayed restart", p);
}

#[test]
#[ignore = "long: minutes in a debug build"]
fn deep_in_contract_fenced_two_ticks() {
    check_in_contract("fenced lock: ticks 0..=2", base());
}

#[test]
fn mutation_quorum_of_half_breaks_mutual_exclusion() {
    let mut p = base();
    p.quorum = model::N / 2;
    find_counterexample("quorum N/2", p, "mutual exclusion");
}

#[test]
fn mutation_no_drift_allowance_breaks_mutual_exclusion() {
    let mut p = base();
    p.drift = 0;
    find_counterexample("no drift allowance", p, "mutual exclusion");
}

#[test]
fn mutation_extend_that_can_shorten_breaks_mutual_exclusion() {
    let mut p = base();
    p.extends = 1;
    p.extend_gt = false;
    find_counterexample("extend without GT", p, "mutual exclusion");
}

#[test]
fn mutation_immediate_restart_without_persistence_breaks_mutual_exclusion() {
    let mut p = base();
    p.crashes = 1;
    p.restart_delay = 0;
    find_counterexample("immediate empty restart", p, "mutual exclusion");
}

#[test]
fn mutation_release_without_token_check_breaks_mutual_exclusion() {
    let mut p = base();
    p.release_checks_token = false;
    find_counterexample("release without token check", p, "mutual exclusion");
}

#[test]
#[ignore]
fn probe() {
    let env = |k: &str, d: u8| std::env::var(k).ok().and_then(|v| v.parse().ok()).unwrap_or(d);
    let mut p = Protocol::in_contract();
    p.max_tick = env("T", 5);
    p.attempts = env("A", 2);
    p.crashes = env("CR", 1);
    p.losses = env("L", 1);
    p.extends = env("E", 1);
    p.fencing = env("F", 1) == 1;
    p.reply_delay = env("RD", 0) == 1;
    p.ttl = env("TTL", 3);
    let started = Instant::now();
    let checker = LockModel(p).checker().target_max_depth(env("D", 200).into()).timeout(std::time::Duration::from_secs(env("S", 60).into())).spawn_bfs().join();
    println!(
        "probe: {} states ({} unique), depth {}, {:.1?} done={}",
        checker.state_count(),
        checker.unique_state_count(),
        checker.max_depth(),
        started.elapsed(), checker.is_done()
    );
    for (k, v) in checker.discoveries() { println!("{k}: {} steps", v.into_actions().len()); }
}
