//! Datagrams of several heartbeats back to back (`monitor loadgen --pack`, docs/wire-format.md):
//! each heartbeat recorded on its own, at the XDP hook in native mode and at the TC hook, in
//! one run of the program a datagram.

use integration_tests::{
    agent_process::{AgentProcess, TempDir},
    batches::{assert_every_heartbeat_counted, send_packed},
    netns::NetnsPair,
    require_root,
};
use serde_json::json;

#[test]
fn packed_datagrams_are_recorded_one_by_one_at_both_hooks() {
    require_root();
    let pair = NetnsPair::named(86, ["hbpka", "hbpkb"], ["hbpva", "hbpvb"]);
    // Run statistics while this fd lives: the program's run count says datagrams carried many.
    let _stats = aya::sys::enable_stats(aya::sys::Stats::RunTime).expect("enable bpf stats");
    let dir = TempDir::new("hbpacked");
    for (hook, mode, name) in [
        ("xdp", "native", "native XDP hook"),
        ("tc", "tc", "TC hook"),
    ] {
        let agent = AgentProcess::start(
            &pair,
            &["--hook", hook, "--peers", &dir.peers_file(1..=500)],
        );
        assert_eq!(
            agent.ask(json!({"op": "stats"}))["stats"]["xdp_mode"],
            json!(mode)
        );
        let sent = send_packed(&pair, 32);
        assert_every_heartbeat_counted(&agent, sent, name);
        drop(agent);
    }
}
