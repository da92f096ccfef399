//! Exhaustive model checking of the lock and fencing protocol in small cases.
//!
//! `tests/model/mod.rs` models 3 nodes, 2 clients and one resource in discrete time:
//! crashes and restarts (with persistence, or empty after at least the TTL), delayed,
//! reordered and lost messages, node clocks that run fast within the drift allowance,
//! wall clocks that disagree, and clients that pause for any number of ticks. Time is
//! relative in the model, so there is no horizon: every schedule of any length within the
//! fault budgets is explored.
//!
//! Every reachable state is checked against three safety properties (mutual exclusion of
//! believed holds, fencing tokens that rise in the order acquisitions return,
//! `remaining()` backed by a quorum) and each scope must also reach its witnesses (a
//! client acquires, both clients hold in turn, ...), so a model that cannot acquire fails.
//!
//! Each known-unsafe variant (a quorum of N/2, no drift allowance, extensions that can
//! shorten, an immediate restart without persistence, a release that does not check the
//! token, a fencing token without its commit round) must produce a counterexample: a
//! checker that cannot fail proves nothing.
//!
//! The one-round direct hand-off (`tests/model/handoff.rs`: queue entries on every node,
//! release with transfer, announcements, counting with confirmation times, the fallback
//! claim and retiring a token) is checked the same way, with three mutations of its rules
//! that must each be flagged (counting a retired token, `s_i` from the latest request sent,
//! re-adding a popped token).
//!
//! The default sizes fit a debug build; `QUORUMLOCK_MODEL_DEEP=1` explores larger ones
//! (best with `--release`). docs/testing.md lists both, with state counts and times.

mod model;

use std::collections::BTreeSet;
use std::time::Instant;

use model::handoff::{self, Handoff, HandoffModel};
use model::{
    Action, Client, Key, LockModel, MAJORITY, MUTUAL_EXCLUSION, Node, Phase, Protocol, Queue,
    REMAINING_BACKED, Req, State, TOKENS_RISE, Vote,
};
use stateright::{Checker, HasDiscoveries, Model};

const SAFETY: [&str; 3] = [MUTUAL_EXCLUSION, TOKENS_RISE, REMAINING_BACKED];

/// Whether to explore the larger sizes.
fn deep() -> bool {
    std::env::var("QUORUMLOCK_MODEL_DEEP").is_ok_and(|v| v == "1")
}

/// Explores `protocol` completely: no safety property may be violated, and every witness
/// (a `sometimes` property) must be reached.
fn check_in_contract(name: &str, protocol: Protocol) {
    let model = LockModel(protocol);
    let witnesses: Vec<&str> = model
        .properties()
        .iter()
        .map(|p| p.name)
        .filter(|n| !SAFETY.contains(n))
        .collect();
    let started = Instant::now();
    let checker = model.checker().spawn_bfs().join();
    println!(
        "{name}{}: {} states, {} unique, depth {}, {:.2?}",
        if deep() { " (deep)" } else { "" },
        checker.state_count(),
        checker.unique_state_count(),
        checker.max_depth(),
        started.elapsed()
    );
    assert!(checker.is_done(), "{name}: the exploration did not finish");
    for property in SAFETY {
        if let Some(path) = checker.discovery(property) {
            print_path(&path.into_vec());
            panic!("{name}: {property:?} violated (path above)");
        }
    }
    for witness in witnesses {
        let Some(path) = checker.discovery(witness) else {
            panic!("{name}: no state reaches the witness {witness:?}: the model cannot do it");
        };
        println!("  witness {witness:?}: {} steps", path.into_actions().len());
    }
}

/// Explores `protocol` until `property` is violated and asserts that it is; prints the
/// counterexample (found breadth-first, so it is among the shortest).
fn find_counterexample(name: &str, protocol: Protocol, property: &'static str) {
    let model = LockModel(protocol);
    let started = Instant::now();
    let checker = model
        .checker()
        .finish_when(HasDiscoveries::AnyOf(BTreeSet::from([property])))
        .spawn_bfs()
        .join();
    let elapsed = started.elapsed();
    let Some(path) = checker.discovery(property) else {
        panic!(
            "{name}: no counterexample to {property:?} in {} states: the checker cannot see this bug",
            checker.unique_state_count()
        );
    };
    let steps = path.clone().into_vec();
    println!(
        "{name}: counterexample to {property:?} in {} steps, after {} states ({} unique), {elapsed:.2?}",
        steps.len() - 1,
        checker.state_count(),
        checker.unique_state_count(),
    );
    print_path(&steps);
    let last = path.last_state();
    let holds = match property {
        MUTUAL_EXCLUSION => model::mutual_exclusion(last),
        TOKENS_RISE => model::tokens_rise(last),
        _ => model::remaining_backed(last),
    };
    assert!(
        !holds,
        "{name}: the counterexample's last state satisfies {property:?}"
    );
}

fn print_path(steps: &[(State, Option<Action>)]) {
    for (state, action) in steps {
        if let Some(action) = action {
            println!("    {action}");
        } else {
            println!("    final: {}", model::describe(state));
        }
    }
}

// --- The real protocol inside the deployment contract ---------------------------------

/// Delays and reordering (replies too), pauses, every node's clock fast; one attempt per
/// client (two when deep).
#[test]
fn lock_with_delays_reordering_pauses_and_fast_clocks() {
    let mut p = Protocol::in_contract();
    p.reply_delay = true;
    if deep() {
        p.attempts = 2;
    }
    check_in_contract("lock: delays, reordering, pauses, fast clocks", p);
}

/// One lost request, replies delayed and reordered too; when deep, two lost requests and
/// any number (0 to 3) of nodes with a fast clock.
#[test]
fn lock_with_a_lost_request() {
    let mut p = Protocol::in_contract();
    p.losses = 1;
    p.reply_delay = true;
    if deep() {
        p.losses = 2;
        p.fast_nodes = &[0, 1, 2, 3];
    }
    check_in_contract("lock: a lost request", p);
}

/// One crash: the node keeps its data, or comes back empty after the TTL; when deep, two
/// crashes, a lost request and reply delays.
#[test]
fn lock_with_a_crash_and_restart() {
    let mut p = Protocol::in_contract();
    p.crashes = 1;
    if deep() {
        p.crashes = 2;
        p.reply_delay = true;
        p.losses = 1;
    }
    check_in_contract(
        "lock: a crash, persisted or restarted empty after the TTL",
        p,
    );
}

/// TTL 3, one extension per hold asking for 2 (shorter than what is left) or 3; when
/// deep, two extensions per hold and a crash.
#[test]
fn lock_with_extensions() {
    let mut p = Protocol::in_contract();
    p.ttl = 3;
    p.restart_delay = 3;
    p.extends = 1;
    p.extend_ttls = &[2, 3];
    if deep() {
        p.extends = 2;
        p.crashes = 1;
    }
    check_in_contract("lock: extensions (TTL 2 or 3 of 3)", p);
}

/// Fencing tokens under delays, pauses, fast clocks and a node whose wall clock is ahead;
/// when deep, replies delayed and reordered too.
#[test]
fn fenced_lock_with_delays_pauses_and_clock_offsets() {
    let mut p = Protocol::in_contract();
    p.fencing = true;
    if deep() {
        p.reply_delay = true;
    }
    check_in_contract("fenced lock: delays, pauses, clock offsets", p);
}

/// Fencing tokens when a node loses its counter (restarted empty after the TTL), its
/// clock being the only floor; when deep, also persisted crashes, a wall clock ahead and
/// a lost request.
#[test]
fn fenced_lock_with_a_crash_and_restart() {
    let mut p = Protocol::in_contract();
    p.fencing = true;
    p.crashes = 1;
    p.crash_kinds = &[false];
    p.offset = [0, 0, 0];
    if deep() {
        p.crash_kinds = &[true, false];
        p.offset = [1, 0, 0];
        p.losses = 1;
    }
    check_in_contract("fenced lock: a crash, restarted empty after the TTL", p);
}

// --- Mutations: each must produce a counterexample ------------------------------------

#[test]
fn mutation_quorum_of_half_breaks_mutual_exclusion() {
    let mut p = Protocol::in_contract();
    p.quorum = model::N / 2;
    find_counterexample("quorum N/2", p, MUTUAL_EXCLUSION);
}

#[test]
fn mutation_no_drift_allowance_breaks_mutual_exclusion() {
    let mut p = Protocol::in_contract();
    p.drift = 0;
    find_counterexample("no drift allowance", p, MUTUAL_EXCLUSION);
}

#[test]
fn mutation_extension_that_can_shorten_breaks_remaining() {
    let mut p = Protocol::in_contract();
    p.ttl = 3;
    p.extends = 1;
    p.extend_ttls = &[2, 3];
    p.extend_gt = false;
    find_counterexample("extension without GT", p, handoff_broken());
}

#[test]
fn mutation_immediate_restart_without_persistence_breaks_mutual_exclusion() {
    let mut p = Protocol::in_contract();
    p.crashes = 1;
    p.crash_kinds = &[false];
    p.restart_delay = 0;
    find_counterexample("immediate empty restart", p, MUTUAL_EXCLUSION);
}

#[test]
fn mutation_immediate_restart_without_persistence_breaks_fencing() {
    let mut p = Protocol::in_contract();
    p.fencing = true;
    p.crashes = 1;
    p.crash_kinds = &[false];
    p.restart_delay = 0;
    p.offset = [0, 0, 0];
    find_counterexample("immediate empty restart, fenced", p, TOKENS_RISE);
}

#[test]
fn mutation_release_without_token_check_breaks_remaining() {
    let mut p = Protocol::in_contract();
    p.release_checks_token = false;
    find_counterexample("release without token check", p, handoff_broken());
}

/// The clock assumption: a wall clock ahead by the restart delay (node 0, 2 ticks) puts
/// tokens ahead of the floor a node restarted empty after that delay reads.
#[test]
#[ignore = "deep: QUORUMLOCK_MODEL_DEEP=1 cargo test --release --test model_check -- --include-ignored"]
fn mutation_clock_ahead_by_the_restart_delay_breaks_fencing() {
    let mut p = Protocol::in_contract();
    p.fencing = true;
    p.crashes = 1;
    p.crash_kinds = &[false];
    p.offset = [2, 0, 0];
    find_counterexample("a clock ahead by the restart delay", p, TOKENS_RISE);
}

#[test]
fn mutation_token_without_commit_round_breaks_fencing() {
    let mut p = Protocol::in_contract();
    p.fencing = true;
    p.fence_commit = false;
    find_counterexample("fencing without the commit round", p, TOKENS_RISE);
}

// --- The property predicates on hand-built states -------------------------------------

fn idle() -> Client {
    Client {
        phase: Phase::Idle,
        tok: 0,
        attempts_left: 0,
        ever_held: false,
    }
}

fn holding(tok: u8, deadline: u8) -> Client {
    Client {
        phase: Phase::Held {
            deadline,
            extended: false,
            extends_left: 0,
            ext: None,
        },
        tok,
        attempts_left: 0,
        ever_held: true,
    }
}

fn node(key: Option<Key>) -> Node {
    Node {
        down: 0,
        key,
        counter: -1,
        wiped: false,
        fast: true,
        offset: 0,
    }
}

fn key(tok: u8, left: u8) -> Option<Key> {
    Some(Key { tok, left })
}

fn state(clients: [Client; 2], nodes: [Node; 3]) -> State {
    model::canonical(State {
        clients,
        nodes,
        queues: Default::default(),
        max_token: -1,
        fence_regressed: false,
        crashes_left: 0,
        losses_left: 0,
        fp: 0,
    })
}

#[test]
fn mutual_exclusion_predicate_flags_two_believers() {
    let keys = [node(key(1, 2)), node(key(1, 2)), node(key(2, 2))];
    let both = state([holding(1, 1), holding(2, 1)], keys);
    assert!(!model::mutual_exclusion(&both));
    // A hold whose deadline has passed is not believed.
    let one = state([holding(1, 1), holding(2, 0)], keys);
    assert!(model::mutual_exclusion(&one));
    assert!(model::mutual_exclusion(&state(
        [holding(1, 1), idle()],
        keys
    )));
}

#[test]
fn remaining_predicate_flags_a_hold_backed_by_a_minority() {
    // Believed for 2 more ticks; only node 0 holds the token that long.
    let short = state(
        [holding(1, 2), idle()],
        [node(key(1, 2)), node(key(1, 1)), node(None)],
    );
    assert!(!model::remaining_backed(&short));
    // Another owner's key does not count either.
    let other = state(
        [holding(1, 2), idle()],
        [node(key(1, 2)), node(key(2, 2)), node(None)],
    );
    assert!(!model::remaining_backed(&other));
    let backed = state(
        [holding(1, 2), idle()],
        [node(key(1, 2)), node(key(1, 3)), node(None)],
    );
    assert!(model::remaining_backed(&backed));
    // A crashed node's data counts (it comes back empty only once its keys expired).
    let mut down = backed;
    down.nodes[1].down = 2;
    assert!(model::remaining_backed(&model::canonical(down)));
    assert_eq!(MAJORITY, 2);
}

/// The fencing check lives in the transition that returns a token: drive one.
#[test]
fn tokens_predicate_flags_a_token_not_above_the_last_one_returned() {
    let model = LockModel(Protocol {
        fencing: true,
        ..Protocol::in_contract()
    });
    // Client 0 committed t = 1 on node 0 and waits for node 1's confirmation; the token
    // returned before it is `max_token`.
    let committing = |max_token: i8| {
        let mut s = State {
            clients: [
                Client {
                    phase: Phase::Commit {
                        age: 0,
                        t: 1,
                        cleanup: [model::Cleanup::Now; 3],
                        votes: [Vote::Granted, Vote::Pending, Vote::Refused],
                    },
                    tok: 1,
                    attempts_left: 0,
                    ever_held: false,
                },
                idle(),
            ],
            nodes: [node(key(1, 1)), node(key(1, 1)), node(key(2, 1))],
            queues: Default::default(),
            max_token,
            fence_regressed: false,
            crashes_left: 0,
            losses_left: 0,
            fp: 0,
        };
        s.queues[0][1] = Queue([
            Some(Req::Commit { tok: 1, t: 1 }),
            None,
            None,
            None,
            None,
            None,
            None,
            None,
        ]);
        s
    };
    let deliver = Action::Deliver { client: 0, node: 1 };
    for (max_token, rises) in [(0, true), (1, false), (2, false)] {
        let s = committing(max_token);
        assert!(model::tokens_rise(&s));
        let next = model
            .next_state(&s, deliver)
            .expect("the commit is delivered");
        assert!(
            (0..2).any(|c| model::believes(&next, c)),
            "the commit quorum makes a holder"
        );
        assert_eq!(model::tokens_rise(&next), rises, "max_token {max_token}");
    }
}

/// The symmetry reduction maps every renaming of nodes and clients of a reachable state
/// to the same representative, and that representative is one of the renamings.
#[test]
fn symmetry_reduction_is_a_function_of_the_class() {
    let mut p = Protocol::in_contract();
    p.fencing = true;
    p.crashes = 1;
    p.reply_delay = true;
    let model = LockModel(p);
    let mut frontier = model.init_states();
    let mut seen = std::collections::HashSet::new();
    let mut checked = 0;
    while let Some(s) = frontier.pop() {
        if checked >= 3_000 || !seen.insert(s) {
            continue;
        }
        checked += 1;
        let want = model::canonical(s);
        assert_eq!(want, s, "a reachable state is its own representative");
        for renamed in model::renamings(&s) {
            assert_eq!(model::canonical(renamed), want);
        }
        let mut actions = Vec::new();
        model.actions(&s, &mut actions);
        frontier.extend(actions.into_iter().filter_map(|a| model.next_state(&s, a)));
    }
    assert_eq!(checked, 3_000);
}

// --- The one-round direct hand-off (transfer) -----------------------------------------

/// The real protocol inside the deployment contract with the hand-off on.
fn handoff_protocol() -> Protocol {
    let mut p = Protocol::in_contract();
    p.handoff = Some(Handoff::design());
    p
}

/// Explores the hand-off model of `protocol` completely: no safety property may be
/// violated, and every witness must be reached.
fn check_handoff(name: &str, protocol: Protocol) {
    let model = HandoffModel::new(protocol);
    let safety = [MUTUAL_EXCLUSION, REMAINING_BACKED];
    let witnesses: Vec<&str> = model
        .properties()
        .iter()
        .map(|p| p.name)
        .filter(|n| !safety.contains(n))
        .collect();
    let started = Instant::now();
    let checker = model.checker().spawn_bfs().join();
    println!(
        "{name}{}: {} states, {} unique, depth {}, {:.2?}",
        if deep() { " (deep)" } else { "" },
        checker.state_count(),
        checker.unique_state_count(),
        checker.max_depth(),
        started.elapsed()
    );
    assert!(checker.is_done(), "{name}: the exploration did not finish");
    for property in safety {
        if let Some(path) = checker.discovery(property) {
            print_handoff_path(&path.into_vec());
            panic!("{name}: {property:?} violated (path above)");
        }
    }
    for witness in witnesses {
        let Some(path) = checker.discovery(witness) else {
            panic!("{name}: no state reaches the witness {witness:?}: the model cannot do it");
        };
        println!("  witness {witness:?}: {} steps", path.into_actions().len());
    }
}

/// Explores the hand-off model of `protocol` until `property` is violated and asserts
/// that it is.
fn handoff_counterexample(name: &str, protocol: Protocol, property: &'static str) {
    let model = HandoffModel::new(protocol);
    let started = Instant::now();
    let checker = model
        .checker()
        .finish_when(HasDiscoveries::AnyOf(BTreeSet::from([property])))
        .spawn_bfs()
        .join();
    let elapsed = started.elapsed();
    let Some(path) = checker.discovery(property) else {
        panic!(
            "{name}: no counterexample to {property:?} in {} states: the checker cannot see this bug",
            checker.unique_state_count()
        );
    };
    let steps = path.clone().into_vec();
    println!(
        "{name}: counterexample to {property:?} in {} steps, after {} states ({} unique), {elapsed:.2?}",
        steps.len() - 1,
        checker.state_count(),
        checker.unique_state_count(),
    );
    print_handoff_path(&steps);
    let last = path.last_state();
    let holds = match property {
        MUTUAL_EXCLUSION => handoff::mutual_exclusion(last),
        _ => handoff::remaining_backed(last),
    };
    assert!(
        !holds,
        "{name}: the counterexample's last state satisfies {property:?}"
    );
}

fn print_handoff_path(steps: &[(handoff::State, Option<handoff::Action>)]) {
    for (state, action) in steps {
        println!("      {}", handoff::describe(state));
        if let Some(action) = action {
            println!("    {action}");
        }
    }
}

/// Hand-off under delays, reordering, pauses and fast clocks: client 0 acquires once,
/// client 1 queues once, renews once and claims once; when deep, client 0 acquires twice
/// and an entry may lapse.
#[test]
fn handoff_with_delays_reordering_pauses_and_fast_clocks() {
    let mut p = handoff_protocol();
    if deep() {
        p.attempts = 2;
        p.handoff = Some(Handoff {
            lapses: 1,
            ..Handoff::design()
        });
    }
    check_handoff("hand-off: delays, reordering, pauses, fast clocks", p);
}

// --- Hand-off mutations: each must produce a counterexample -------------------------

/// The design with one change (`mutate`), in the smallest scope that shows it.
fn handoff_mutation(mutate: impl FnOnce(&mut Handoff)) -> Protocol {
    let mut p = handoff_protocol();
    let mut h = Handoff::design();
    mutate(&mut h);
    p.handoff = Some(h);
    if deep() {
        p.attempts = 2;
    }
    p
}

/// The property a hand-off mutation breaks first: `remaining()` backed by a quorum (the
/// waiter believes longer than a quorum holds its token); when deep, with a second attempt
/// of the holder, mutual exclusion itself.
fn handoff_broken() -> &'static str {
    if deep() {
        MUTUAL_EXCLUSION
    } else {
        REMAINING_BACKED
    }
}

/// (a) A retired token's announcements are still counted: a transfer announced before
/// the clean-up ran on its node but heard after it.
#[test]
fn handoff_mutation_counting_a_retired_token_breaks_mutual_exclusion() {
    let p = handoff_mutation(|h| {
        h.count_retired = true;
        h.renewals = 0;
    });
    handoff_counterexample("hand-off: counting a retired token", p, handoff_broken());
}

/// (b) `s_i` taken from the latest request sent, which may have left after the transfer.
#[test]
fn handoff_mutation_s_from_the_latest_request_sent_breaks_mutual_exclusion() {
    let p = handoff_mutation(|h| {
        h.s_from_latest_sent = true;
        h.renewals = 2;
        h.claims = 0;
    });
    handoff_counterexample(
        "hand-off: s_i from the latest request sent",
        p,
        handoff_broken(),
    );
}

/// (c) A renewal re-adds a popped token: a late announcement of the first transfer is
/// counted with an `s_i` confirmed after it.
#[test]
fn handoff_mutation_re_adding_a_popped_token_breaks_mutual_exclusion() {
    let p = handoff_mutation(|h| {
        h.readd_gone = true;
        h.renewals = 2;
        h.claims = 0;
    });
    handoff_counterexample("hand-off: re-adding a popped token", p, handoff_broken());
}

/// A lost request, reply or announcement (one in all); when deep, two, and a second token
/// for the waiter.
#[test]
fn handoff_with_a_lost_message() {
    let mut p = handoff_protocol();
    p.losses = 1;
    p.handoff = Some(Handoff {
        claims: 0,
        ..Handoff::design()
    });
    if deep() {
        p.losses = 2;
        p.handoff = Some(Handoff {
            joins: 2,
            ..Handoff::design()
        });
    }
    check_handoff("hand-off: a lost message", p);
}

/// A crash, with persistence or restarted empty after the TTL; when deep, with a lost
/// message and two renewals.
#[test]
fn handoff_with_a_crash_and_restart() {
    let mut p = handoff_protocol();
    p.crashes = 1;
    p.handoff = Some(Handoff {
        claims: 0,
        renewals: 0,
        ..Handoff::design()
    });
    if deep() {
        p.losses = 1;
        p.handoff = Some(Handoff {
            renewals: 2,
            ..Handoff::design()
        });
    }
    check_handoff(
        "hand-off: a crash, persisted or restarted empty after the TTL",
        p,
    );
}
