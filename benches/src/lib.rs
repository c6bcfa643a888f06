//! Benchmarks live in `benches/`; run them with `cargo bench -p gpujob-benches`.
