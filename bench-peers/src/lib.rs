//! Benchmarks of kxarray against its peers, in a crate of their own so the
//! library's dev-dependencies stay lean. The benches live in `benches/`;
//! this library holds what they share.
