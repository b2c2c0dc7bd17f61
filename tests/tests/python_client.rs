//! The Python package (python/heartbeat_monitor) against the real agent: its unittest suite
//! (python/tests) runs with the agent's socket in HB_SOCKET and, in HB_SENDER, the command of a
//! sender of peer HB_PEER that the tests start and kill to see a suspicion and a recovery.
//! PYTHONPATH points at python/, so nothing is installed.

use std::{
    path::Path,
    process::{Command, Stdio},
};

use integration_tests::{
    agent_process::{AgentProcess, TempDir, sender},
    netns::NetnsPair,
    require_root,
};

#[test]
fn the_python_client_passes_its_tests_against_the_agent() {
    require_root();
    let pair = NetnsPair::named(47, ["hbpya", "hbpyb"], ["hbpyva", "hbpyvb"]);
    let dir = TempDir::new("hbpyclient");
    let peers = dir.peers_file([1]);
    let agent = AgentProcess::start(&pair, &["--peers", &peers]);

    let send = sender(&pair, 1, "20ms", &[]);
    let argv: Vec<String> = std::iter::once(send.get_program())
        .chain(send.get_args())
        .map(|a| a.to_string_lossy().into_owned())
        .collect();
    let python = Path::new(env!("CARGO_MANIFEST_DIR")).join("../python");
    let out = Command::new("python3")
        .args(["-m", "unittest", "discover", "-v", "-s"])
        .arg(python.join("tests"))
        .env("PYTHONPATH", &python)
        .env("HB_SOCKET", agent.socket())
        .env("HB_SENDER", serde_json::to_string(&argv).unwrap())
        .env("HB_PEER", "1")
        .env("PYTHONDONTWRITEBYTECODE", "1")
        .stdin(Stdio::null())
        .output()
        .expect("spawn python3");
    let text = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "python tests failed:\n{text}");
    assert!(!text.contains("skipped"), "python tests skipped:\n{text}");
}
