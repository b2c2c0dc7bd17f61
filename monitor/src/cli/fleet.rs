//! `monitor fleet`: the fleet's view from NATS JetStream (docs/fleet.md): which peers enough
//! live observers hold down, every observer's view of one peer, the observers themselves,
//! and the fleet's events as they happen.

use std::{path::PathBuf, process::ExitCode, time::Duration};

use clap::{Args, Subcommand};
use monitor::fleet::{
    FleetError, Init, NatsAuth,
    consumer::{self, EventStart, Fleet},
    permissions,
    quorum::{Convictions, FleetChange, FleetView, Quorum, Rule},
    unix_ms,
};
use serde_json::{Value, json};

#[derive(Debug, Args)]
pub struct FleetArgs {
    /// NATS server URLs (comma-separated); any server of the cluster will do.
    #[arg(
        long,
        value_name = "URL",
        value_delimiter = ',',
        default_value = "nats://127.0.0.1:4222"
    )]
    nats: Vec<String>,
    /// NATS credentials file (user JWT and NKey seed).
    #[arg(long, value_name = "FILE")]
    nats_creds: Option<PathBuf>,
    /// NATS user (with --nats-password-file; docs/fleet.md "Security").
    #[arg(long, value_name = "NAME", requires = "nats_password_file")]
    nats_user: Option<String>,
    /// File holding the --nats-user's password; readable by its owner only (chmod 600).
    #[arg(long, value_name = "FILE", requires = "nats_user")]
    nats_password_file: Option<PathBuf>,
    /// Print JSON (one object per reply or event line) instead of tables.
    #[arg(long, global = true)]
    json: bool,
    #[command(subcommand)]
    command: FleetCommand,
}

#[derive(Debug, Subcommand)]
enum FleetCommand {
    /// Ask about the fleet's current view.
    Query {
        #[command(subcommand)]
        what: Query,
    },
    /// Follow the fleet: a `down` event when a peer reaches the quorum, `up` when it no
    /// longer does (live observers' verdicts only); with --events, every observer's events.
    Watch(WatchArgs),
    /// Create the event stream and the verdict bucket (with credentials that may: the
    /// admin's), so that observers need no permission to create them; an existing bucket
    /// that allows rollups is updated not to.
    Init {
        /// Replicas of the stream and the bucket (3 on a 3-node cluster).
        #[arg(long, value_name = "N", default_value_t = 1, value_parser = clap::value_parser!(u8).range(1..=5))]
        replicas: u8,
    },
    /// Print the `permissions` block of nats-server's configuration for one observer's user
    /// (it may write only its own events and keys) or for a reader; connects to nothing.
    Permissions {
        /// The observer's name (as its `monitor run --observer`).
        #[arg(
            long,
            value_name = "NAME",
            conflicts_with = "reader",
            required_unless_present = "reader"
        )]
        observer: Option<String>,
        /// A reader's permissions (`monitor fleet query` and `watch`): it writes nothing.
        #[arg(long)]
        reader: bool,
    },
}

#[derive(Debug, Clone, Copy, Args)]
struct RuleArgs {
    /// Live observers that must agree: a count, or `majority` (more than half of the live
    /// observers).
    #[arg(long, value_name = "K", default_value = "majority")]
    quorum: Quorum,
    /// The level (phi threshold) each of them must have reached.
    #[arg(long, value_name = "L", default_value_t = 8.0, value_parser = positive)]
    level: f64,
}

impl RuleArgs {
    fn rule(self) -> Rule {
        Rule {
            quorum: self.quorum,
            level: self.level,
        }
    }
}

fn positive(text: &str) -> Result<f64, String> {
    match text.parse::<f64>() {
        Ok(v) if v.is_finite() && v > 0.0 => Ok(v),
        _ => Err(format!("{text:?} is not a positive number")),
    }
}

#[derive(Debug, Subcommand)]
enum Query {
    /// Peers at least K live observers hold at level L or higher.
    Suspects(RuleArgs),
    /// Every observer's view of one peer.
    Peer {
        /// Peer id, decimal or 0x hex.
        #[arg(value_parser = monitor::agent::peers_file::parse_peer_id)]
        id: u64,
    },
    /// Every observer with a liveness record: live or not, and its publishing counters.
    Observers,
}

#[derive(Debug, Args)]
struct WatchArgs {
    #[command(flatten)]
    rule: RuleArgs,
    /// Follow every observer's raw events on the stream instead (suspect, recover, admit,
    /// forget, resync, ...), each with its observer and sequence number.
    #[arg(long)]
    events: bool,
    /// With --events: from the first event the stream holds, not from now.
    #[arg(long, requires = "events")]
    from_start: bool,
}

pub fn fleet(args: FleetArgs) -> anyhow::Result<ExitCode> {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    let json = args.json;
    match runtime.block_on(run(args)) {
        Ok(code) => Ok(code),
        Err(e) if json => {
            println!("{}", json!({"ok": false, "error": e.to_string()}));
            Ok(ExitCode::FAILURE)
        }
        Err(e) => Err(e.into()),
    }
}

async fn run(args: FleetArgs) -> Result<ExitCode, FleetError> {
    let auth = NatsAuth {
        creds: args.nats_creds,
        user: args.nats_user,
        password_file: args.nats_password_file,
    };
    match &args.command {
        FleetCommand::Permissions { observer, reader } => {
            let p = match observer {
                Some(name) if !reader => permissions::observer(name)?,
                _ => permissions::reader(),
            };
            if args.json {
                println!(
                    "{}",
                    json!({"ok": true, "publish": {"allow": p.publish},
                           "subscribe": {"allow": p.subscribe}})
                );
            } else {
                println!("{}", p.to_config());
            }
            return Ok(ExitCode::SUCCESS);
        }
        FleetCommand::Init { replicas } => {
            let (stream, bucket) =
                monitor::fleet::init(&args.nats, &auth, (*replicas).into()).await?;
            let word = |i: Init| match i {
                Init::Created => "created",
                Init::Updated => "updated (rollups no longer allowed)",
                Init::Existed => "already there",
            };
            if args.json {
                println!(
                    "{}",
                    json!({"ok": true, "stream": word(stream), "bucket": word(bucket)})
                );
            } else {
                println!("stream {}: {}", monitor::fleet::STREAM, word(stream));
                println!("bucket {}: {}", monitor::fleet::BUCKET, word(bucket));
            }
            return Ok(ExitCode::SUCCESS);
        }
        _ => {}
    }
    let fleet = Fleet::connect(&args.nats, &auth).await?;
    match args.command {
        FleetCommand::Init { .. } | FleetCommand::Permissions { .. } => unreachable!(),
        FleetCommand::Query { what } => query(&fleet, what, args.json).await,
        FleetCommand::Watch(w) if w.events => events(&fleet, w.from_start, args.json).await,
        FleetCommand::Watch(w) => watch(&fleet, w.rule.rule(), args.json).await,
    }
}

fn warn_malformed(malformed: &[String]) {
    for e in malformed {
        eprintln!("monitor fleet: skipped: {e}");
    }
}

fn level_text(level: Option<f64>) -> String {
    level.map_or("-".into(), |l| format!("{l}"))
}

async fn query(fleet: &Fleet, what: Query, json_out: bool) -> Result<ExitCode, FleetError> {
    let consumer::Snapshot {
        view,
        malformed,
        as_of_ms: now,
    } = fleet.snapshot().await?;
    if !json_out {
        warn_malformed(&malformed);
    }
    let reply = match what {
        Query::Suspects(r) => {
            let rule = r.rule();
            let live = view.live_count(now);
            let suspects = view.suspects(now, rule);
            if !json_out {
                println!(
                    "{} peers down: quorum {} of {live} live observers at level {} or higher",
                    suspects.len(),
                    rule.quorum,
                    rule.level
                );
                println!("{:>20}  {:>6}  observers", "id", "level");
                for s in &suspects {
                    println!("{:>20}  {:>6}  {}", s.id, s.level, s.observers.join(","));
                }
                return Ok(ExitCode::SUCCESS);
            }
            json!({"ok": true, "quorum": rule.quorum.to_string(), "level": rule.level,
                   "live_observers": live, "suspects": suspects, "malformed": malformed.len()})
        }
        Query::Peer { id } => {
            let views = view.peer(id, now);
            if !json_out {
                println!(
                    "{:<24} {:>5} {:>6} {:>10} {:>12}",
                    "observer", "live", "level", "phi", "silent_s"
                );
                for v in &views {
                    println!(
                        "{:<24} {:>5} {:>6} {:>10} {:>12}",
                        v.observer,
                        v.live,
                        level_text(v.level),
                        v.phi.map_or("-".into(), |p| format!("{p:.2}")),
                        v.since
                            .map_or("-".into(), |s| format!("{:.1}", (now - s) / 1000.0)),
                    );
                }
                return Ok(ExitCode::SUCCESS);
            }
            json!({"ok": true, "peer": id, "observers": views, "malformed": malformed.len()})
        }
        Query::Observers => {
            let observers = view.observers(now);
            if !json_out {
                println!(
                    "{:<24} {:>5} {:>8} {:>9} {:>10} {:>10} {:>8} {:>8}",
                    "observer",
                    "live",
                    "age_s",
                    "suspects",
                    "events",
                    "published",
                    "dropped",
                    "resyncs"
                );
                for o in &observers {
                    let l = &o.liveness;
                    println!(
                        "{:<24} {:>5} {:>8.1} {:>9} {:>10} {:>10} {:>8} {:>8}",
                        o.observer,
                        o.live,
                        o.age_ms / 1000.0,
                        l.suspects,
                        l.events,
                        l.published,
                        l.dropped,
                        l.resyncs
                    );
                }
                return Ok(ExitCode::SUCCESS);
            }
            json!({"ok": true, "observers": observers, "malformed": malformed.len()})
        }
    };
    println!("{reply}");
    Ok(ExitCode::SUCCESS)
}

fn print_malformed(json_out: bool, source: &str, error: &str, count: u64) {
    if json_out {
        println!(
            "{}",
            json!({"event": "malformed", "source": source, "error": error, "count": count})
        );
    } else {
        eprintln!("monitor fleet: skipped ({count} so far): {error}");
    }
}

fn print_change(change: &FleetChange, json_out: bool) {
    if json_out {
        println!("{}", serde_json::to_value(change).unwrap_or(Value::Null));
        return;
    }
    match change {
        FleetChange::Down { suspect, at } => println!(
            "{at} down {} level {} by {}",
            suspect.id,
            suspect.level,
            suspect.observers.join(",")
        ),
        FleetChange::Up { id, at } => println!("{at} up {id}"),
    }
}

/// Fleet events: judged afresh on every bucket change of a peer, and for every peer four
/// times a second (observers go stale without any write). An interrupted bucket watch (a
/// NATS node lost, the consumer with it) reads the whole bucket again and goes on; the
/// peers held down are kept meanwhile, so only real changes are reported.
async fn watch(fleet: &Fleet, rule: Rule, json_out: bool) -> Result<ExitCode, FleetError> {
    let mut convictions = Convictions::default();
    let mut malformed = 0u64;
    loop {
        // The snapshot is judged as of when its read began (see `consumer::Snapshot`).
        let (mut reader, read_from) = loop {
            let read_from = unix_ms();
            match fleet.bucket(">", true).await {
                Ok(Some(reader)) => break (reader, read_from),
                Ok(None) => {}
                Err(e) => eprintln!("monitor fleet: {e}; trying again"),
            }
            tokio::time::sleep(RESUME_PAUSE).await;
        };
        let mut view = FleetView::default();
        // Until the snapshot is read, changes are not reported one by one.
        let mut started = reader.current();
        if started {
            for c in convictions.update_all(&view, read_from, rule) {
                print_change(&c, json_out);
            }
        }
        let mut tick = tokio::time::interval(Duration::from_millis(250));
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                entry = reader.next() => {
                    let entry = match entry {
                        None => return Err(FleetError::JetStream("the bucket watch ended".into())),
                        Some(Err(e)) => {
                            eprintln!("monitor fleet: {e}; reading the bucket again");
                            break;
                        }
                        Some(Ok(entry)) => entry,
                    };
                    match consumer::apply(&mut view, &entry) {
                        Ok(change) if started => {
                            let changes = match change {
                                monitor::fleet::quorum::Change::Peer(id) =>
                                    convictions.update_peers(&view, [id], unix_ms(), rule),
                                monitor::fleet::quorum::Change::Observer(_) =>
                                    convictions.update_all(&view, unix_ms(), rule),
                            };
                            for c in changes {
                                print_change(&c, json_out);
                            }
                        }
                        Ok(_) => {}
                        Err(e) => {
                            malformed += 1;
                            print_malformed(json_out, "bucket", &e, malformed);
                        }
                    }
                    if !started && reader.current() {
                        started = true;
                        for c in convictions.update_all(&view, read_from, rule) {
                            print_change(&c, json_out);
                        }
                    }
                }
                _ = tick.tick() => {
                    // The snapshot may also end with no entry: the consumer's idle heartbeat.
                    let at = if started {
                        unix_ms()
                    } else if reader.current() {
                        started = true;
                        read_from
                    } else {
                        continue;
                    };
                    for c in convictions.update_all(&view, at, rule) {
                        print_change(&c, json_out);
                    }
                }
            }
        }
        tokio::time::sleep(RESUME_PAUSE).await;
    }
}

/// Every observer's events from the stream, validated; malformed ones are counted and
/// skipped. An interrupted stream (a NATS node lost, the consumer gone with it) is resumed
/// after the last event shown, so nothing is skipped or shown twice; the watch only ends when
/// interrupted.
async fn events(fleet: &Fleet, from_start: bool, json_out: bool) -> Result<ExitCode, FleetError> {
    let mut start = if from_start {
        EventStart::First
    } else {
        EventStart::New
    };
    let mut malformed = 0u64;
    loop {
        let mut reader = match fleet.events_from(start).await {
            Ok(reader) => reader,
            Err(e) => {
                eprintln!("monitor fleet: {e}; trying again");
                tokio::time::sleep(RESUME_PAUSE).await;
                continue;
            }
        };
        while let Some(raw) = reader.next().await {
            let raw = match raw {
                Ok(raw) => raw,
                Err(e) => {
                    eprintln!("monitor fleet: {e}; resuming the stream");
                    break;
                }
            };
            if raw.stream_seq > 0 {
                start = EventStart::After(raw.stream_seq);
            }
            match raw.parse() {
                Ok(event) if json_out => println!("{}", event.body),
                Ok(event) => println!(
                    "{} {} #{} {}{}",
                    event.body["at"].as_u64().unwrap_or(0),
                    event.observer,
                    event.seq,
                    event.kind,
                    event.id.map_or(String::new(), |id| format!(" {id}"))
                        + &event.level.map_or(String::new(), |l| format!(" level {l}")),
                ),
                Err(e) => {
                    malformed += 1;
                    print_malformed(
                        json_out,
                        "stream",
                        &format!("subject {:?}: {e}", raw.subject),
                        malformed,
                    );
                }
            }
        }
        tokio::time::sleep(RESUME_PAUSE).await;
    }
}

/// How long an interrupted event stream waits before it is followed again.
const RESUME_PAUSE: std::time::Duration = std::time::Duration::from_millis(500);
