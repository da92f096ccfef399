//! The library's scripts exactly as the client sends them (preludes included), read from its
//! one script table through the simulator's API (hence the `sim` feature of the tests that
//! include this file), for tests that run them raw on a node.

/// The source of the library's script `name` (`release_one`, `enqueue`, …); panics, failing
/// the test, if there is none.
pub fn source(name: &str) -> String {
    quorumlock::sim::scripts()
        .iter()
        .find(|s| s.name() == name)
        .map(|s| s.source().to_owned())
        .unwrap_or_else(|| panic!("the library has no script named {name}"))
}
