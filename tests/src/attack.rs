//! One row of the attack suite's table (`cargo xtask attack`, docs/security.md): what an attack
//! test measured, printed as one line the xtask collects. Each test asserts its bounds itself;
//! the row only reports what it saw.

use serde::Serialize;

/// What one attack did to the agent. `None`: not what this attack is about (shown as "-").
#[derive(Debug, Default, Serialize)]
pub struct AttackRow {
    pub attack: &'static str,
    /// How hard and how long, in words: "2,000 first heartbeats from one source, 8 s".
    pub load: String,
    /// Heartbeats of live (or signed) peers the kernel did not record.
    pub heartbeats_lost: Option<u64>,
    /// Live peers suspected at the highest level, or dead ones revived.
    pub wrongly_convicted: Option<u64>,
    /// Real peers from an allowed network refused a slot.
    pub real_peers_refused: Option<u64>,
    /// Another client's query p99 during the attack, ms.
    pub query_p99_ms: Option<f64>,
    /// The agent's resident memory during the attack, MiB.
    pub agent_rss_mib: Option<f64>,
    /// Its resident memory before the attack, MiB.
    pub idle_rss_mib: Option<f64>,
}

/// The prefix of the line the xtask looks for.
pub const PREFIX: &str = "attack-row ";

impl AttackRow {
    /// Prints the row for `cargo xtask attack` (run with --nocapture; otherwise unseen).
    pub fn report(&self) {
        println!(
            "{PREFIX}{}",
            serde_json::to_string(self).expect("a row serializes")
        );
    }
}

/// The resident memory of process `pid`, MiB (VmRSS).
pub fn rss_mib(pid: u32) -> f64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).expect("proc status");
    let kib: f64 = status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .expect("VmRSS");
    kib / 1024.0
}
