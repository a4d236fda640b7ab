//! The `svcnet` binary: every component behind one command line.
fn main() {}
