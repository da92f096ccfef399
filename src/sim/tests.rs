//! Unit tests of the simulated node: no I/O.
