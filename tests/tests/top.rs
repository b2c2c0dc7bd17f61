//! `monitor top` on a real agent, used as a person would: in a tmux pane, keys typed with
//! `send-keys`, the screen read with `capture-pane`. Every check waits for what the screen
//! shows (polling), never for a fixed time.

use std::{
    path::PathBuf,
    process::{Command, Output},
    time::{Duration, Instant},
};

use integration_tests::{
    agent_process::{AgentProcess, TempDir, sender, spawn},
    monitor_bin,
    netns::NetnsPair,
    require_root, unique_name,
};
use serde_json::json;

const LIVE: u64 = 4101;
const DEAD: u64 = 4102;
const WAIT: Duration = Duration::from_secs(20);

/// A detached tmux session on a tmux server of its own (its socket in a temporary directory),
/// killed on drop (also when a test panics). Panes stay after their process exits
/// (`remain-on-exit`), so the screen left behind can be read.
struct Tmux {
    server: PathBuf,
    session: String,
    /// Where the pane's shell writes the command's exit status (see `start`).
    status: PathBuf,
    _dir: TempDir,
}

impl Tmux {
    fn start(width: u16, height: u16, command: &str) -> Self {
        let dir = TempDir::new("hbmtmux");
        let conf = dir.0.join("tmux.conf");
        // In the configuration, so it holds before the pane's process can exit.
        std::fs::write(&conf, "set -g remain-on-exit on\n").expect("write tmux.conf");
        let status = dir.0.join("status");
        // The command's exit status, written by the pane's shell once the command has ended.
        // tmux's own #{pane_dead_status} is not used: under some parents (CI) tmux marks the
        // pane dead without ever collecting the status, and it stays empty.
        let command = format!(
            "{command}; echo $? > '{}.tmp' && mv '{0}.tmp' '{0}'",
            status.display()
        );
        let tmux = Self {
            server: dir.0.join("tmux.sock"),
            session: unique_name("hbmtop"),
            status,
            _dir: dir,
        };
        let out = tmux.run(&[
            "-f",
            conf.to_str().unwrap(),
            "new-session",
            "-d",
            "-s",
            &tmux.session,
            "-x",
            &width.to_string(),
            "-y",
            &height.to_string(),
            &command,
        ]);
        assert!(
            out.status.success(),
            "tmux new-session: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        tmux
    }

    fn run(&self, args: &[&str]) -> Output {
        Command::new("tmux")
            .arg("-S")
            .arg(&self.server)
            .args(args)
            .output()
            .expect("running tmux (cargo xtask setup installs it)")
    }

    fn screen(&self) -> String {
        let out = self.run(&["capture-pane", "-p", "-t", &self.session]);
        assert!(
            out.status.success(),
            "capture-pane: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    fn keys(&self, keys: &[&str]) {
        let mut args = vec!["send-keys", "-t", &self.session];
        args.extend_from_slice(keys);
        let out = self.run(&args);
        assert!(out.status.success(), "send-keys {keys:?}");
    }

    /// Polls the screen until `done` holds for it; panics with the last screen after `WAIT`.
    fn wait_for(&self, what: &str, done: impl Fn(&str) -> bool) -> String {
        let deadline = Instant::now() + WAIT;
        loop {
            let screen = self.screen();
            if done(&screen) {
                return screen;
            }
            assert!(
                Instant::now() < deadline,
                "waited {WAIT:?} for {what}; the screen:\n{screen}"
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// `Some(exit status)` once the pane's command has exited.
    fn exit_status(&self) -> Option<i32> {
        let text = std::fs::read_to_string(&self.status).ok()?;
        Some(
            text.trim()
                .parse()
                .unwrap_or_else(|_| panic!("exit status {text:?}")),
        )
    }

    fn wait_exit(&self) -> i32 {
        let deadline = Instant::now() + WAIT;
        loop {
            if let Some(status) = self.exit_status() {
                return status;
            }
            assert!(
                Instant::now() < deadline,
                "monitor top still running {WAIT:?} after q; the screen:\n{}",
                self.screen()
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }
}

impl Drop for Tmux {
    fn drop(&mut self) {
        let _ = self.run(&["kill-session", "-t", &self.session]);
    }
}

/// The words of the table row of peer `id` (the line whose first word is the id), with the
/// row's line number.
fn row(screen: &str, id: u64) -> Option<(usize, Vec<String>)> {
    let id = id.to_string();
    screen.lines().enumerate().find_map(|(y, line)| {
        let words: Vec<String> = line
            .trim_start_matches(['│', ' '])
            .split_whitespace()
            .map(str::to_string)
            .collect();
        (words.first() == Some(&id)).then_some((y, words))
    })
}

/// The row's LEVEL column (ID ADDR PHI LEVEL ...).
fn level(screen: &str, id: u64) -> Option<String> {
    row(screen, id).and_then(|(_, words)| words.get(3).cloned())
}

#[test]
fn top_shows_a_suspected_peer_and_answers_keys() {
    require_root();
    let pair = NetnsPair::new(81);
    let dir = TempDir::new("hbmpeers");
    let agent = AgentProcess::start(&pair, &["--peers", &dir.peers_file([LIVE, DEAD])]);
    let _live = spawn(sender(&pair, LIVE, "50ms", &[]));
    let dead = spawn(sender(&pair, DEAD, "50ms", &[]));
    // Both heard from before the view starts.
    let deadline = Instant::now() + WAIT;
    while agent.ask(json!({"op": "peers"}))["peers"]
        .as_array()
        .unwrap()
        .iter()
        .any(|p| p["heartbeats"].as_u64().unwrap() < 5)
    {
        assert!(Instant::now() < deadline, "senders not heard");
        std::thread::sleep(Duration::from_millis(50));
    }

    let command = format!(
        "'{}' top --socket '{}' --interval 300ms",
        monitor_bin().display(),
        agent.socket().display()
    );
    let tmux = Tmux::start(160, 48, &command);
    // Both peers in the table, and the event stream connected, before one of them dies.
    tmux.wait_for("both peers and a live event stream", |s| {
        row(s, LIVE).is_some() && row(s, DEAD).is_some() && s.contains("Events (live")
    });

    drop(dead);
    let screen = tmux.wait_for("the dead peer at level 8 and its suspect event", |s| {
        level(s, DEAD).as_deref() == Some("8")
            && s.contains(&format!("suspect  peer {DEAD} reached level 8"))
            && s.contains("level 8: 1")
    });
    assert!(row(&screen, LIVE).is_some(), "{screen}");
    assert!(screen.contains("levels 1,3,8"), "{screen}");
    assert!(screen.contains("peers 2/65536"), "{screen}");
    assert!(screen.contains("kernel  heartbeats "), "{screen}");
    // Sorted by phi, worst first.
    assert!(
        row(&screen, DEAD).unwrap().0 < row(&screen, LIVE).unwrap().0,
        "{screen}"
    );

    // `3`: the third level (phi >= 8) and above: only the dead peer is left.
    tmux.keys(&["3"]);
    tmux.wait_for("only the dead peer under filter 3", |s| {
        s.contains("filter level >= 8") && row(s, DEAD).is_some() && row(s, LIVE).is_none()
    });
    // `0` shows all again; `s` sorts by id, ascending.
    tmux.keys(&["0", "s"]);
    let screen = tmux.wait_for("both peers sorted by id", |s| {
        s.contains("sort id asc") && row(s, LIVE).is_some() && row(s, DEAD).is_some()
    });
    assert!(
        row(&screen, LIVE).unwrap().0 < row(&screen, DEAD).unwrap().0,
        "{screen}"
    );
    // `r` reverses it.
    tmux.keys(&["r"]);
    let screen = tmux.wait_for("the id order reversed", |s| s.contains("sort id desc"));
    assert!(
        row(&screen, DEAD).unwrap().0 < row(&screen, LIVE).unwrap().0,
        "{screen}"
    );

    // `/`, the id, Enter: the detail pane of the dead peer, with its QoS.
    tmux.keys(&["/", &DEAD.to_string()]);
    tmux.wait_for("the typed id", |s| {
        s.contains(&format!("follow peer: {DEAD}_"))
    });
    tmux.keys(&["Enter"]);
    tmux.wait_for("the followed peer's detail", |s| {
        s.contains(&format!("Peer {DEAD} (Esc leaves)"))
            && s.contains("QoS at the highest level")
            && s.contains("S-transitions")
            && s.contains("query accuracy")
            && s.contains("(level 8)")
    });
    // Esc leaves the peer (and does not quit).
    tmux.keys(&["Escape"]);
    tmux.wait_for("the detail pane gone", |s| {
        !s.contains("Esc leaves") && row(s, DEAD).is_some()
    });
    assert_eq!(tmux.exit_status(), None, "Esc with a followed peer quit");

    tmux.keys(&["q"]);
    assert_eq!(tmux.wait_exit(), 0, "{}", tmux.screen());
    // The terminal is back: the alternate screen is gone with the table on it.
    let screen = tmux.screen();
    assert!(!screen.contains("q quit"), "{screen}");
    assert!(row(&screen, DEAD).is_none(), "{screen}");
    drop(tmux);

    // A terminal too small for the layout says so, and q still quits.
    let tiny = Tmux::start(30, 6, &command);
    tiny.wait_for("the too-small notice", |s| s.contains("too small"));
    tiny.keys(&["q"]);
    assert_eq!(tiny.wait_exit(), 0, "{}", tiny.screen());
}

#[test]
fn top_without_an_agent_is_one_clear_error() {
    let dir = TempDir::new("hbmtopnone");
    let socket = dir.0.join("none.sock");
    let out = Command::new(monitor_bin())
        .args(["top", "--socket"])
        .arg(&socket)
        .output()
        .expect("run monitor top");
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(err.contains(&socket.display().to_string()), "{err}");
    assert!(err.contains("is `monitor run` running?"), "{err}");
    assert_eq!(err.matches("os error").count(), 1, "{err}");
}
