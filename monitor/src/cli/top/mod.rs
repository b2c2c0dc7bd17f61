//! `monitor top`: a live terminal view of a running agent (ratatui on crossterm).
//!
//! The screen: the agent's facts and kernel counters (`stats`); how many peers are below the
//! first level and at each level; a table of peers sorted by phi, worst first; the followed
//! peer's `peer` reply with its QoS; the latest events of a `subscribe` connection; one line of
//! key help. Rows and events are coloured by the level reached: the terminal's own colour below
//! the first level (its count is green), yellow at the first, magenta at the levels between,
//! bold red at the highest; recoveries are green.
//!
//! Keys: `q` (or Esc, or Ctrl-C) quits; `s` cycles the sort column (phi, id, silence, lost;
//! each starts worst first, ids ascending) and `r` reverses it; `1`..`9` keep the peers at or
//! above that level (`3` with levels 1,3,8: phi >= 8), `0` shows all; `/`, digits, Enter follow
//! a peer (Esc leaves it, then Esc quits); `p` pauses: no request is sent and the header, counts
//! and table stay as they were, while events keep arriving in their pane.
//!
//! Threads, so that nothing the agent does can block the keys or the drawing: the UI thread
//! only draws and reads keys (waking every 50 ms to take what arrived); a refresher thread
//! sends the requests on one connection and hands over whole snapshots, starting the next
//! refresh `--interval` after the previous one started, or once it finished if it took longer
//! (refreshes never pile up); an events thread reads the `subscribe` stream and reconnects
//! every second if the agent goes away.
//!
//! Cost at scale. `peers` returns every peer, about 480 bytes of JSON each. Measured on this
//! project's 2-core machine (release builds, 50,000 peers sending at 2 Hz from `monitor
//! loadgen` on the same cores, 500 of them dead), with `monitor query --json`: a `peers` reply
//! was 24 MB and took 1.6 to 2.7 s, longer than the default refresh, to show the few dozen
//! rows a terminal holds; a `suspects` reply at phi >= 1 was 240 KB and took 15 to 35 ms. An operator watching a large fleet wants the peers that are
//! suspected, and how many are fine. So while the agent watches at most `--all-peers-up-to`
//! peers (2000 by default) each refresh asks `peers` and the table holds every peer; above that
//! it asks `suspects` at the first level and the table holds those (the title says so), the
//! peers below the first level being counted from `stats`. In a mass failure every peer is a
//! suspect and the reply is as large as `peers`: the refresher then takes longer (the status
//! line shows how long each refresh took) and the UI stays responsive. The table draws only
//! the rows that fit.
//!
//! The terminal is restored on quit, on an error (a guard's drop) and on a panic (a hook
//! installed before the terminal is touched). An agent that cannot be reached at start is one
//! error message and a non-zero exit, before the terminal is touched; once running, a lost
//! agent is shown in the status line and retried each interval.

mod event_line;
mod state;
mod ui;

use std::{
    io::{IsTerminal, Stdout},
    path::{Path, PathBuf},
    process::ExitCode,
    sync::{
        Arc, Mutex,
        atomic::{AtomicBool, Ordering},
        mpsc::{self, Receiver, RecvTimeoutError, Sender, TryRecvError},
    },
    time::{Duration, Instant},
};

use anyhow::Context;
use clap::Args;
use crossterm::{
    cursor,
    event::{self, Event},
    execute,
    terminal::{self, EnterAlternateScreen, LeaveAlternateScreen},
};
use monitor::{
    DEFAULT_SOCKET,
    serving::client::Client,
    serving::protocol::{PeerReply, PeersReply, StatsReply, SuspectsReply, into_result},
};
use ratatui::{Terminal, backend::CrosstermBackend};
use serde::de::DeserializeOwned;
use serde_json::{Value, json};

use state::{Action, App, Snapshot, Source};

#[derive(Debug, Args)]
pub struct TopArgs {
    /// Path of the agent's Unix socket.
    #[arg(long, short, default_value = DEFAULT_SOCKET)]
    socket: PathBuf,
    /// Time between refreshes of the header, counts and table (`500ms`, `2s`, ...).
    #[arg(long, default_value = "1s", value_parser = super::parse_duration)]
    interval: Duration,
    /// Most rows in the peer table (default: as many as the terminal fits).
    #[arg(long)]
    limit: Option<usize>,
    /// List every peer (the `peers` request) while the agent watches at most this many; above
    /// that the table holds only the peers at or above the first level (`suspects`), which
    /// stays cheap at any scale. 0: always only those.
    #[arg(long, default_value_t = 2000)]
    all_peers_up_to: usize,
}

/// What the refresher asks for, set by the UI.
#[derive(Debug, Clone, Copy, Default)]
struct Plan {
    follow: Option<u64>,
    paused: bool,
}

/// What the events thread hands over.
enum Stream {
    Connected,
    Event(Value),
    Lost(String),
}

pub fn top(args: TopArgs) -> anyhow::Result<ExitCode> {
    if args.interval < Duration::from_millis(10) {
        anyhow::bail!("--interval must be at least 10ms");
    }
    // The agent must answer before the terminal is touched; its error is one plain message
    // (the client's error already names the OS error, so no source chain is added).
    let mut client = None;
    let first = fetch(&mut client, &args.socket, args.all_peers_up_to, None)
        .map_err(|e| anyhow::anyhow!("{e}"))?;
    if !std::io::stdout().is_terminal() {
        anyhow::bail!(
            "monitor top draws on a terminal and standard output is not one \
             (for scripts: monitor query, monitor watch)"
        );
    }

    let mut app = App::new(
        args.socket.display().to_string(),
        args.interval.as_millis() as u64,
        args.limit,
    );
    app.apply(Ok(first));

    let plan = Arc::new(Mutex::new(Plan::default()));
    let (snapshot_tx, snapshot_rx) = mpsc::channel();
    let (wake_tx, wake_rx) = mpsc::channel();
    {
        let (socket, plan) = (args.socket.clone(), plan.clone());
        let (interval, all_up_to) = (args.interval, args.all_peers_up_to);
        std::thread::Builder::new()
            .name("top-refresh".into())
            .spawn(move || {
                refresher(
                    client,
                    &socket,
                    interval,
                    all_up_to,
                    &plan,
                    &wake_rx,
                    &snapshot_tx,
                )
            })
            .context("starting the refresh thread")?;
    }
    let (stream_tx, stream_rx) = mpsc::channel();
    {
        let socket = args.socket.clone();
        // Never joined: it may sit in a read until the process exits.
        std::thread::Builder::new()
            .name("top-events".into())
            .spawn(move || events(&socket, &stream_tx))
            .context("starting the events thread")?;
    }

    let mut terminal = TerminalGuard::enter()?;
    let mut dirty = true;
    loop {
        if dirty {
            terminal.0.draw(|frame| ui::draw(frame, &app))?;
            dirty = false;
        }
        if event::poll(Duration::from_millis(50))? {
            match event::read()? {
                Event::Key(key) => {
                    dirty = true;
                    match app.handle_key(key) {
                        Action::Quit => break,
                        Action::Replan => {
                            *plan.lock().expect("plan lock") = Plan {
                                follow: app.follow,
                                paused: app.paused,
                            };
                            // The refresher may be mid-request: it then refreshes once done.
                            let _ = wake_tx.send(());
                        }
                        Action::None => {}
                    }
                }
                Event::Resize(..) => dirty = true,
                _ => {}
            }
        }
        loop {
            match snapshot_rx.try_recv() {
                Ok(snapshot) => {
                    app.apply(snapshot);
                    dirty = true;
                }
                Err(TryRecvError::Empty) => break,
                Err(TryRecvError::Disconnected) => anyhow::bail!("the refresh thread stopped"),
            }
        }
        while let Ok(message) = stream_rx.try_recv() {
            match message {
                Stream::Connected => app.stream_connected(),
                Stream::Event(event) => app.push_event(&event),
                Stream::Lost(e) => app.stream_lost(&e),
            }
            dirty = true;
        }
    }
    drop(terminal);
    Ok(ExitCode::SUCCESS)
}

/// Raw mode and the alternate screen while alive; the terminal as it was after.
struct TerminalGuard(Terminal<CrosstermBackend<Stdout>>);

/// Whether the terminal is in raw mode and on the alternate screen (restore once, whether from
/// the guard or the panic hook).
static TERMINAL_TAKEN: AtomicBool = AtomicBool::new(false);

fn restore_terminal() {
    if TERMINAL_TAKEN.swap(false, Ordering::SeqCst) {
        let _ = terminal::disable_raw_mode();
        let _ = execute!(std::io::stdout(), LeaveAlternateScreen, cursor::Show);
    }
}

impl TerminalGuard {
    fn enter() -> anyhow::Result<Self> {
        let previous = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            restore_terminal();
            previous(info);
        }));
        TERMINAL_TAKEN.store(true, Ordering::SeqCst);
        let entered = terminal::enable_raw_mode()
            .and_then(|()| execute!(std::io::stdout(), EnterAlternateScreen, cursor::Hide))
            .and_then(|()| Terminal::new(CrosstermBackend::new(std::io::stdout())));
        match entered {
            Ok(terminal) => Ok(Self(terminal)),
            Err(e) => {
                restore_terminal();
                Err(anyhow::anyhow!("setting up the terminal: {e}"))
            }
        }
    }
}

impl Drop for TerminalGuard {
    fn drop(&mut self) {
        restore_terminal();
    }
}

fn refresher(
    mut client: Option<Client>,
    socket: &Path,
    interval: Duration,
    all_up_to: usize,
    plan: &Mutex<Plan>,
    wake: &Receiver<()>,
    out: &Sender<Result<Snapshot, String>>,
) {
    // The first snapshot was taken before the UI started.
    let mut started = Instant::now();
    loop {
        match wake.recv_timeout(interval.saturating_sub(started.elapsed())) {
            Ok(()) | Err(RecvTimeoutError::Timeout) => {}
            Err(RecvTimeoutError::Disconnected) => return,
        }
        // Keys pressed while a refresh ran are all served by the next one.
        while wake.try_recv().is_ok() {}
        started = Instant::now();
        let plan = *plan.lock().expect("plan lock");
        if plan.paused {
            continue;
        }
        let snapshot = fetch(&mut client, socket, all_up_to, plan.follow);
        if snapshot.is_err() {
            // Reconnect next time (the agent may have restarted).
            client = None;
        }
        if out.send(snapshot).is_err() {
            return;
        }
    }
}

/// One refresh: `stats`, then `peers` or `suspects`, then the followed peer.
fn fetch(
    client: &mut Option<Client>,
    socket: &Path,
    all_up_to: usize,
    follow: Option<u64>,
) -> Result<Snapshot, String> {
    let started = Instant::now();
    let c = match client {
        Some(c) => c,
        None => client.insert(Client::connect(socket).map_err(|e| e.to_string())?),
    };
    let StatsReply { stats } = ask(c, json!({"op": "stats"}))?;
    let (source, peers) = match stats.levels.first() {
        Some(&first) if stats.peers > all_up_to => {
            let SuspectsReply {
                threshold,
                suspects,
            } = ask(c, json!({"op": "suspects", "threshold": first}))?;
            (Source::Suspects(threshold), suspects)
        }
        _ => {
            let PeersReply { peers } = ask(c, json!({"op": "peers"}))?;
            (Source::All, peers)
        }
    };
    let detail = match follow {
        None => None,
        Some(id) => {
            let reply = c
                .request(&json!({"op": "peer", "id": id}))
                .map_err(|e| e.to_string())?;
            let peer = match into_result(reply) {
                Ok(reply) => Ok(serde_json::from_value::<PeerReply>(reply)
                    .map_err(|e| format!("unexpected reply to peer: {e}"))?
                    .peer),
                // An unknown id is the agent's answer, shown in the pane; not a failed refresh.
                Err(e) => Err(e),
            };
            Some((id, peer))
        }
    };
    Ok(Snapshot {
        stats,
        source,
        peers,
        detail,
        took_ms: started.elapsed().as_secs_f64() * 1000.0,
    })
}

/// One request whose `ok` reply is parsed as `T`; anything else is a message.
fn ask<T: DeserializeOwned>(client: &mut Client, request: Value) -> Result<T, String> {
    let reply = client.request(&request).map_err(|e| e.to_string())?;
    let reply = into_result(reply).map_err(|e| format!("the agent says: {e}"))?;
    serde_json::from_value(reply).map_err(|e| format!("unexpected reply to {request}: {e}"))
}

/// Follows the agent's events, reconnecting every second while it cannot be reached; ends when
/// the UI is gone.
fn events(socket: &Path, out: &Sender<Stream>) {
    loop {
        let message = match subscribe(socket) {
            Ok(mut client) => {
                if out.send(Stream::Connected).is_err() {
                    return;
                }
                loop {
                    let line = match client.read_line() {
                        Ok(line) => line,
                        Err(e) => break Stream::Lost(e.to_string()),
                    };
                    // A line that is not JSON is shown as it came.
                    let event = serde_json::from_str(&line).unwrap_or(Value::String(line));
                    if out.send(Stream::Event(event)).is_err() {
                        return;
                    }
                }
            }
            Err(e) => Stream::Lost(e),
        };
        if out.send(message).is_err() {
            return;
        }
        std::thread::sleep(Duration::from_secs(1));
    }
}

fn subscribe(socket: &Path) -> Result<Client, String> {
    let mut client = Client::connect(socket).map_err(|e| e.to_string())?;
    let reply = client
        .request(&json!({"op": "subscribe"}))
        .map_err(|e| e.to_string())?;
    into_result(reply).map_err(|e| format!("the agent says: {e}"))?;
    client.set_read_timeout(None).map_err(|e| e.to_string())?;
    Ok(client)
}
