//! Benchmark probes for `cargo xtask bench` (`integration_tests::bench::probes`).

fn main() {
    integration_tests::bench::probes::main();
}
