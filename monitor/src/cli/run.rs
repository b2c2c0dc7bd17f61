use std::{path::PathBuf, process::ExitCode};

use std::time::Duration;

use clap::Args;
use monitor::{
    DEFAULT_SOCKET,
    agent::admission::AdmissionPolicy,
    agent::{self, AgentConfig},
    detector::{
        levels::Levels,
        model::{DetectorParams, Model},
    },
    kernel::program::{AttachMode, Hook},
};

use super::parse_duration;
use monitor::detector::spec::parse_spec;
use monitor::serving::limits;
use monitor_common::{
    maps::{DEFAULT_CAPACITY, MAX_WINDOW},
    wire::DEFAULT_PORT,
};

/// `--model`: the detector's models as clap values, named and described as `Model` names and
/// describes them (the clap glue lives here, not in detector/). `budget` is chosen by
/// `--budget`, which also says the budget.
fn model_parser() -> impl clap::builder::TypedValueParser<Value = Model> {
    use clap::builder::{PossibleValue, PossibleValuesParser, TypedValueParser};
    PossibleValuesParser::new(
        Model::ALL
            .into_iter()
            .filter(|&m| m != Model::Budget)
            .map(|m| match m.about() {
                Some(about) => PossibleValue::new(m.name()).help(about),
                None => PossibleValue::new(m.name()),
            }),
    )
    .map(|name| Model::from_name(&name).expect("one of the possible values"))
}

#[derive(Debug, Args)]
pub struct RunArgs {
    /// Read settings from this TOML file: one key per long flag, spelled the same
    /// (`iface = "eth0"`, `levels = [1, 3, 8]`, `metrics-addr = "127.0.0.1:9464"`); flags on
    /// the command line override it. SIGHUP re-reads it (docs/operations.md).
    #[arg(long, value_name = "FILE", help_heading = "Configuration")]
    config: Option<PathBuf>,
    /// Print the effective configuration (file, flags, defaults) as TOML that --config
    /// accepts, and exit.
    #[arg(long, help_heading = "Configuration")]
    print_config: bool,
    /// Network interface whose incoming heartbeats are watched.
    #[arg(long, short)]
    iface: String,
    /// UDP destination port of heartbeats.
    #[arg(long, short, default_value_t = DEFAULT_PORT)]
    port: u16,
    /// Path of the Unix socket that serves queries.
    #[arg(long, short, default_value = DEFAULT_SOCKET)]
    socket: PathBuf,
    /// Group (name or gid) that may use the socket besides root and the agent's user; the
    /// socket is mode 0660.
    #[arg(long)]
    socket_group: Option<String>,
    /// Socket connections served at once, all clients together. An eighth of them is kept
    /// for root and the agent's user; a connection over a cap is told so at once and closed.
    #[arg(long, value_name = "N", default_value_t = limits::DEFAULT_MAX_CLIENTS, value_parser = clap::builder::RangedU64ValueParser::<usize>::new().range(1..=1_000_000))]
    socket_max_clients: usize,
    /// Socket connections each user other than root and the agent's may hold at once.
    #[arg(long, value_name = "N", default_value_t = limits::DEFAULT_MAX_PER_UID, value_parser = clap::builder::RangedU64ValueParser::<usize>::new().range(1..=1_000_000))]
    socket_max_per_uid: usize,
    /// A socket connection that sends no request for this long is closed (subscriptions and
    /// recordings are never idle).
    #[arg(long, value_name = "D", default_value = "60s", value_parser = parse_duration)]
    socket_idle_timeout: Duration,
    /// A socket client that does not take a whole reply, or a batch of events, within this
    /// long is cut off.
    #[arg(long, value_name = "D", default_value = "10s", value_parser = parse_duration)]
    socket_write_timeout: Duration,
    /// File listing peer ids to admit at start: one per line, decimal or 0x hex, # comments.
    #[arg(long)]
    peers: Option<PathBuf>,
    /// XDP attach mode: native (driver), skb (generic), or auto (native, else skb). In skb
    /// mode a batch of heartbeats in one packet (UDP GSO over a veth, UDP GRO) is one frame,
    /// and each heartbeat in it is recorded.
    #[arg(long, value_enum, default_value_t = AttachMode::Auto)]
    xdp_mode: AttachMode,
    /// Where heartbeats are caught: xdp (first and cheapest; the interface's one XDP program),
    /// or tc (TC ingress, a TCX link on kernel 6.6+: runs beside another XDP program on the
    /// interface, e.g. Cilium, Katran or a firewall, after it). --persist needs xdp.
    #[arg(long, value_enum, default_value_t = Hook::Xdp)]
    hook: Hook,
    /// Most peers watched at once (kernel memory is reserved for all of them at start).
    #[arg(long, default_value_t = DEFAULT_CAPACITY, value_parser = clap::value_parser!(u32).range(1..=16_777_216))]
    capacity: u32,
    /// Inter-arrival samples kept per peer (the statistics window).
    #[arg(long, default_value_t = MAX_WINDOW as u32, value_parser = clap::value_parser!(u32).range(2..=MAX_WINDOW as i64))]
    window: u32,
    /// Do not admit peers on their first heartbeat; only those in --peers are watched (and BFD
    /// sessions and UDP flows, which no peers file can list, from --admit-from ranges only).
    #[arg(long)]
    no_auto_admit: bool,
    /// Admit on a first heartbeat only from these source ranges (CIDR, comma-separated), or
    /// from anywhere (`any`). Default: the networks of the interface's own addresses
    /// (10.211.5.1/24 admits 10.211.5.0/24; IPv6 and link-local alike), followed as they
    /// change.
    #[arg(long, value_name = "CIDR", value_delimiter = ',', value_parser = clap::value_parser!(monitor::agent::admission::AdmitFromValue))]
    admit_from: Vec<monitor::agent::admission::AdmitFromValue>,
    /// Peers admitted on a first heartbeat from one source address, at most, while they are
    /// watched (forgotten or expired ones give their room back). `unlimited` (or 0) lifts it,
    /// for benchmarks and hosts that run many peers behind one address.
    #[arg(long, value_name = "N", default_value_t = monitor::agent::admission::DEFAULT_PER_SOURCE, value_parser = monitor::agent::admission::parse_per_source)]
    admit_per_source: u32,
    /// Forget a peer silent for longer than this, with a `forget` event, so its slot is
    /// reused (default: never).
    #[arg(long, value_parser = parse_duration)]
    expire_after: Option<Duration>,
    /// Admissions on a first heartbeat per second, at most (a burst of one second's worth);
    /// also how many reports of unknown peers each CPU's XDP program may send the agent per
    /// second. The default admits 50,000 peers that start at once within a few seconds; with
    /// untrusted senders and no --auth-key-file or --admit-from, lower it (docs/security.md).
    #[arg(long, default_value_t = DEFAULT_ADMIT_RATE, value_parser = clap::value_parser!(u32).range(1..=10_000_000))]
    admit_rate: u32,
    /// Pass heartbeats on to the network stack after recording them (default: consume them).
    #[arg(long)]
    pass_heartbeats: bool,
    /// Also watch BFD sessions passively (RFC 5880 control packets to UDP 3784 and 4784, IPv4
    /// and IPv6): each session (source address, My Discriminator) is a peer, admitted like a
    /// heartbeat peer, with a `bfd_down` event when it reports Down. The packets are always
    /// passed on to the host's BFD daemon (docs/passive.md).
    #[arg(long, help_heading = "Passive sources")]
    bfd: bool,
    /// Also count every UDP datagram to these ports (comma-separated, at most 4) as a heartbeat
    /// of its flow (source address, source port), admitted like a heartbeat peer; the
    /// datagrams are always passed on to their service (docs/passive.md).
    #[arg(long, value_name = "PORT", value_delimiter = ',', value_parser = clap::value_parser!(u16).range(1..), help_heading = "Passive sources")]
    udp_port: Vec<u16>,
    /// Record only heartbeats addressed to these destination addresses (comma-separated,
    /// IPv4 or IPv6); others, e.g. heartbeats this host routes to another one, are passed
    /// untouched and counted as not_local. Default: the interface's own addresses, followed as
    /// they change. `any` records every destination. A multicast group or broadcast address
    /// counts only when listed here (docs/wire-format.md).
    #[arg(long, value_name = "ADDR", value_delimiter = ',', value_parser = clap::value_parser!(monitor::kernel::destination::ListenAddr))]
    listen_addr: Vec<monitor::kernel::destination::ListenAddr>,
    /// Require heartbeats signed with the 128-bit key in this file (32 hex digits, mode 0600).
    /// SIGHUP re-reads it: the new key is current, the old one accepted for --auth-grace.
    #[arg(long, help_heading = "Security")]
    auth_key_file: Option<PathBuf>,
    /// Keep the program attached and recording when the agent stops or dies: pin it and its
    /// maps (under /sys/fs/bpf/heartbeat-monitor/IFACE unless --pin-path says), and adopt
    /// what is pinned there at start, windows and all; a build whose program differs swaps its
    /// own into the pinned link without a gap, every map kept (docs/operations.md). `monitor
    /// detach` removes it.
    #[arg(long, help_heading = "Restarts")]
    persist: bool,
    /// Where to pin (implies --persist); must be on a bpf filesystem.
    #[arg(long, help_heading = "Restarts")]
    pin_path: Option<PathBuf>,
    /// How long the previous key stays valid after a rotation.
    #[arg(long, default_value = "60s", value_parser = parse_duration, help_heading = "Security")]
    auth_grace: Duration,
    /// The whole detector as one spec, in `monitor replay`'s grammar (e.g.
    /// `phi:model=loss,min_std_ms=10`): what replay judged best on a recorded trace runs here
    /// unchanged. Replaces --model and the other detector flags, which then may not be given.
    #[arg(long, value_parser = parse_spec, help_heading = "Detector",
          conflicts_with_all = ["model", "window", "min_std_ms", "pause_ms", "first_interval_ms",
                                "max_interval_ms", "outage_factor", "timeout_ms"])]
    detector: Option<DetectorParams>,
    /// Meet this mean detection time per peer (e.g. 500ms, 1.5s): each peer gets, from its own
    /// window, the deadline rule with the fewest mistakes among those whose deadlines average
    /// the budget (a timeout, or one anchored on the sender's schedule), re-chosen whenever its
    /// estimate is refreshed. phi reaches the highest of --levels at the deadline and the
    /// lower levels before it (docs/tuning.md, "A detection budget"). A peer whose own
    /// heartbeats come slower than the budget (most of its last 8 intervals, from its first)
    /// cannot meet it
    /// without being convicted at every heartbeat: it is convicted just past its schedule
    /// instead, and its `peer` view says `budget_unmet`. Replaces --model.
    #[arg(long, value_parser = parse_budget, value_name = "DURATION", help_heading = "Detector",
          conflicts_with_all = ["detector", "model", "pause_ms", "timeout_ms"])]
    budget: Option<Duration>,
    /// How phi is computed: normal (exact normal tail), akka (Akka's approximation),
    /// exponential (Cassandra's), fixed (a plain timeout, --timeout-ms), loss (normal, aware
    /// of lost heartbeats), chen (expected arrival plus a 150 ms margin, binary), bertier
    /// (expected arrival plus Jacobson's margin, binary), empirical (the window's empirical
    /// tail), 2w (the lower phi of the window and its newest 5 intervals). Margins and the
    /// short window are set through --detector (`alpha_ms`, `window_short`).
    #[arg(long, value_parser = model_parser(), default_value = DetectorParams::DEFAULT.model.name(),
          help_heading = "Detector")]
    model: Model,
    /// Suspicion levels (phi thresholds), ascending: one event each time phi crosses one.
    #[arg(long, default_value_t = Levels::default(), help_heading = "Detector")]
    levels: Levels,
    /// Floor on the standard deviation of intervals, ms (normal, akka).
    #[arg(long, default_value_t = DetectorParams::DEFAULT.min_std_ms, value_parser = non_negative, help_heading = "Detector")]
    min_std_ms: f64,
    /// Acceptable pause added to the mean interval, ms.
    #[arg(long, default_value_t = DetectorParams::DEFAULT.pause_ms, value_parser = non_negative, help_heading = "Detector")]
    pause_ms: f64,
    /// Expected interval before any is measured, ms: the window starts with two samples
    /// around it (as Akka bootstraps). 0 disables.
    #[arg(long, default_value_t = DetectorParams::DEFAULT.first_interval_ms, value_parser = non_negative, help_heading = "Detector")]
    first_interval_ms: f64,
    /// Intervals longer than this are not counted, ms (as Cassandra caps them). Default: none.
    #[arg(long, value_parser = positive, help_heading = "Detector")]
    max_interval_ms: Option<f64>,
    /// An interval longer than this many times the window's mean is an outage (a crash, a
    /// restart, a partition), not a sample of the path, and is not counted; a run of more
    /// than three is the path's new normal and counts. 0 counts every interval.
    #[arg(long, default_value_t = DetectorParams::DEFAULT.outage_factor, value_parser = outage_factor, help_heading = "Detector")]
    outage_factor: u32,
    /// Timeout of the fixed model, ms.
    #[arg(long, default_value_t = DetectorParams::DEFAULT.timeout_ms, value_parser = positive, help_heading = "Detector")]
    timeout_ms: f64,
    /// Serve Prometheus metrics (OpenMetrics text) on this address, at /metrics. Off unless
    /// given; e.g. 127.0.0.1:9464 (the port is only a suggestion).
    #[arg(long, value_name = "HOST:PORT", help_heading = "Metrics")]
    metrics_addr: Option<std::net::SocketAddr>,
    /// Give this peer series of its own (phi, silence, level); repeat or comma-separate.
    #[arg(long = "metrics-peer", value_name = "ID", value_delimiter = ',', value_parser = monitor::agent::peers_file::parse_peer_id, help_heading = "Metrics")]
    metrics_peers: Vec<u64>,
    /// Give the K peers with the highest phi at each scrape series of their own (with
    /// --metrics-peer, at most 1000 in all).
    #[arg(long, value_name = "K", default_value_t = 0, help_heading = "Metrics")]
    metrics_top: usize,
    /// What the XDP program logs on its cold paths, shown among the agent's lines under the
    /// target `kernel`: warn (malformed heartbeats, authentication failures), debug (also
    /// unknown peers and busy slots). Off costs nothing: disabled lines are removed when the
    /// program is verified.
    #[arg(long, value_enum, default_value_t = monitor::kernel::program::KernelLog::Off)]
    kernel_log: monitor::kernel::program::KernelLog,
    /// How often every peer's last-heard word is scanned; a deadline that falls before the
    /// next scan is armed and raised at its time (docs/tuning.md, "Events at their deadline").
    #[arg(long, default_value = "50ms", value_parser = parse_duration, help_heading = "Detector")]
    sweep_interval: Duration,
    /// If the agent itself is not scheduled for longer than this, new suspicions are held for
    /// as long as the stall lasted (its view of time cannot be trusted yet).
    #[arg(long, default_value = "1s", value_parser = parse_duration, help_heading = "Detector")]
    stall_bound: Duration,
    /// While the interface's link is down (it lost carrier, or was set down), and for this
    /// long after it came back, new suspicions are held: every peer falls silent at once and
    /// none of them failed. A `link_down` and a `link_up` event say so. Longer than the longest
    /// heartbeat interval among the peers, so each is heard again before its silence counts.
    #[arg(long, default_value = "2s", value_parser = parse_duration, help_heading = "Detector")]
    link_grace: Duration,
    /// Publish every event, the current verdict on every suspected peer and this monitor's
    /// liveness to a fleet on NATS JetStream at these server URLs (comma-separated, e.g.
    /// nats://10.0.0.5:4222,nats://10.0.0.6:4222); `monitor fleet` reads the fleet's view.
    /// Off unless given (docs/fleet.md).
    #[arg(
        long,
        value_name = "URL",
        value_delimiter = ',',
        help_heading = "Fleet"
    )]
    nats: Vec<String>,
    /// This monitor's name in the fleet: letters, digits, '-' and '_' (default: the host
    /// name's first label).
    #[arg(long, value_name = "NAME", requires = "nats", help_heading = "Fleet")]
    observer: Option<String>,
    /// NATS credentials file (user JWT and NKey seed) for --nats.
    #[arg(long, value_name = "FILE", requires = "nats", help_heading = "Fleet")]
    nats_creds: Option<PathBuf>,
    /// NATS user for --nats (with --nats-password-file; docs/fleet.md "Security").
    #[arg(
        long,
        value_name = "NAME",
        requires = "nats_password_file",
        help_heading = "Fleet"
    )]
    nats_user: Option<String>,
    /// File holding the --nats-user's password; readable by its owner only (chmod 600).
    #[arg(
        long,
        value_name = "FILE",
        requires = "nats_user",
        help_heading = "Fleet"
    )]
    nats_password_file: Option<PathBuf>,
    /// Replicas of the event stream and the verdict bucket when this monitor creates them
    /// (3 on a 3-node JetStream cluster; existing ones are used as they are).
    #[arg(long, value_name = "N", default_value_t = 1, value_parser = clap::value_parser!(u8).range(1..=5), help_heading = "Fleet")]
    nats_replicas: u8,
    /// Events held while NATS is unreachable; beyond it the oldest are dropped and the whole
    /// state is re-published on reconnect.
    #[arg(long, value_name = "N", default_value_t = monitor::fleet::DEFAULT_BUFFER, value_parser = clap::builder::RangedU64ValueParser::<usize>::new().range(1..=10_000_000), help_heading = "Fleet")]
    nats_buffer: usize,
}

/// Admissions per second by default: 50,000 peers starting at once are admitted in about
/// 2 s (a burst of 20,000, then 20,000 a second; the rest re-reported by their next heartbeat).
const DEFAULT_ADMIT_RATE: u32 = 20_000;

/// A `--budget`: a duration (humantime) of at least 1 ms and at most the longest interval a
/// window holds.
fn parse_budget(text: &str) -> Result<Duration, String> {
    let budget = parse_duration(text)?;
    monitor::detector::models::budget::check_budget_ms(budget.as_secs_f64() * 1000.0)?;
    Ok(budget)
}

fn outage_factor(text: &str) -> Result<u32, String> {
    monitor::detector::spec::parse_outage_factor(text)
}

fn number(text: &str) -> Result<f64, String> {
    match text.parse::<f64>() {
        Ok(v) if v.is_finite() => Ok(v),
        _ => Err(format!("{text:?} is not a finite number")),
    }
}

fn non_negative(text: &str) -> Result<f64, String> {
    let v = number(text)?;
    if v < 0.0 {
        return Err("must not be negative".into());
    }
    Ok(v)
}

fn positive(text: &str) -> Result<f64, String> {
    let v = number(text)?;
    if v <= 0.0 {
        return Err("must be greater than 0".into());
    }
    Ok(v)
}

pub fn run(args: RunArgs) -> anyhow::Result<ExitCode> {
    let reload = args.config.clone().map(|source| {
        // The same command line, with the file read afresh: what a restart would run.
        let argv: Vec<std::ffi::OsString> = std::env::args_os().collect();
        agent::Reload {
            source,
            read: std::sync::Arc::new(move || {
                let argv = super::with_config_file(argv.clone()).map_err(anyhow::Error::msg)?;
                let matches =
                    <super::Cli as clap::CommandFactory>::command().try_get_matches_from(argv)?;
                match <super::Cli as clap::FromArgMatches>::from_arg_matches(&matches)?.command {
                    super::Command::Run(args) => agent_config(*args),
                    _ => anyhow::bail!("the command line is no longer `monitor run`"),
                }
            }),
        }
    });
    let config = AgentConfig {
        reload,
        ..agent_config(args)?
    };
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    runtime.block_on(async {
        // Handlers first, before the socket exists: a client that sees the agent answer may
        // signal it at once, and the default action would kill it mid-way.
        use tokio::signal::unix::{SignalKind, signal};
        let mut term = signal(SignalKind::terminate())?;
        let mut int = signal(SignalKind::interrupt())?;
        let shutdown = async move {
            tokio::select! {
                _ = term.recv() => {}
                _ = int.recv() => {}
            }
        };
        agent::run(config, shutdown).await
    })?;
    Ok(ExitCode::SUCCESS)
}

/// The agent's configuration from the parsed flags (also what SIGHUP re-makes).
fn agent_config(args: RunArgs) -> anyhow::Result<AgentConfig> {
    if args.sweep_interval.is_zero() {
        anyhow::bail!("--sweep-interval must be greater than zero");
    }
    if args.socket_idle_timeout.is_zero() || args.socket_write_timeout.is_zero() {
        anyhow::bail!("--socket-idle-timeout and --socket-write-timeout must be greater than zero");
    }
    if args.stall_bound <= args.sweep_interval {
        anyhow::bail!("--stall-bound must be longer than --sweep-interval");
    }
    let detector = match args.detector {
        Some(spec) => DetectorParams {
            threshold: args.levels.highest(),
            ..spec
        },
        None => DetectorParams {
            model: if args.budget.is_some() {
                Model::Budget
            } else {
                args.model
            },
            budget_ms: args.budget.map_or(DetectorParams::DEFAULT.budget_ms, |b| {
                b.as_secs_f64() * 1000.0
            }),
            threshold: args.levels.highest(),
            window: args.window,
            min_std_ms: args.min_std_ms,
            pause_ms: args.pause_ms,
            first_interval_ms: args.first_interval_ms,
            max_interval_ms: args.max_interval_ms,
            outage_factor: args.outage_factor,
            timeout_ms: args.timeout_ms,
            ..DetectorParams::DEFAULT
        },
    };
    let metrics_peers = monitor::serving::metrics::PeerSeries {
        ids: args.metrics_peers,
        top: args.metrics_top,
    };
    metrics_peers
        .validate()
        .map_err(|e| anyhow::anyhow!("--metrics-peer/--metrics-top: {e}"))?;
    if args.metrics_addr.is_none() && (!metrics_peers.ids.is_empty() || metrics_peers.top > 0) {
        anyhow::bail!("--metrics-peer and --metrics-top need --metrics-addr");
    }
    let fleet = if args.nats.is_empty() {
        None
    } else {
        let fleet = monitor::fleet::FleetConfig {
            urls: args.nats,
            observer: args
                .observer
                .unwrap_or_else(monitor::fleet::default_observer),
            auth: monitor::fleet::NatsAuth {
                creds: args.nats_creds,
                user: args.nats_user,
                password_file: args.nats_password_file,
            },
            replicas: args.nats_replicas.into(),
            buffer: args.nats_buffer,
        };
        fleet.validate()?;
        Some(fleet)
    };
    if args.hook == Hook::Tc && (args.persist || args.pin_path.is_some()) {
        anyhow::bail!(
            "--persist and --pin-path need --hook xdp: with --hook tc the attachment ends with the agent"
        );
    }
    let listen = monitor::kernel::destination::Listen::from_args(&args.listen_addr)
        .map_err(anyhow::Error::msg)?;
    let passive = monitor::agent::PassiveSources::new(args.bfd, &args.udp_port, args.port)
        .map_err(|e| anyhow::anyhow!("--udp-port: {e}"))?;
    let pin_path = match (args.pin_path, args.persist) {
        (Some(path), _) => Some(path),
        (None, true) => Some(monitor::kernel::pinning::default_pin_path(&args.iface)),
        (None, false) => None,
    };
    Ok(AgentConfig {
        iface: args.iface,
        port: args.port,
        socket: args.socket,
        peers_file: args.peers,
        mode: args.xdp_mode,
        hook: args.hook,
        capacity: args.capacity,
        admission: AdmissionPolicy {
            auto: !args.no_auto_admit,
            from: monitor::agent::admission::AdmitFrom::from_args(&args.admit_from)
                .map_err(anyhow::Error::msg)?,
            rate_per_sec: args.admit_rate,
            per_source: args.admit_per_source,
        },
        pass_heartbeats: args.pass_heartbeats,
        passive,
        listen,
        // One knob: the kernel reports at most what the agent may admit, per CPU.
        unknown_reports_per_sec: args.admit_rate,
        detector,
        levels: args.levels,
        sweep_interval: args.sweep_interval,
        auth_key_file: args.auth_key_file,
        auth_grace: args.auth_grace,
        pin_path,
        socket_group: args.socket_group,
        socket_limits: limits::Limits {
            max_clients: args.socket_max_clients,
            max_per_uid: args.socket_max_per_uid,
            idle_timeout: args.socket_idle_timeout,
            write_timeout: args.socket_write_timeout,
        },
        expire_after: args.expire_after,
        stall_bound: args.stall_bound,
        link_grace: args.link_grace,
        metrics_addr: args.metrics_addr,
        metrics_peers,
        reload: None,
        fleet,
        kernel_log: args.kernel_log,
    })
}

#[cfg(test)]
mod tests {
    use clap::Parser;

    use super::*;

    fn run_args(flags: &[&str]) -> Result<RunArgs, String> {
        let argv = ["monitor", "run", "--iface", "lo"].iter().chain(flags);
        match super::super::Cli::try_parse_from(argv)
            .map_err(|e| e.to_string())?
            .command
        {
            super::super::Command::Run(args) => Ok(*args),
            _ => unreachable!("a run command line"),
        }
    }

    #[test]
    fn budget_sets_the_model_and_the_top_level() {
        let config =
            agent_config(run_args(&["--budget", "450ms", "--levels", "2,5"]).unwrap()).unwrap();
        let d = &config.detector;
        assert_eq!(
            (d.model, d.budget_ms, d.threshold),
            (Model::Budget, 450.0, 5.0)
        );
        let config = agent_config(run_args(&["--budget", "1.5s"]).unwrap()).unwrap();
        assert_eq!(config.detector.budget_ms, 1500.0);
        // Without --budget the model is --model's, and `budget` is not one of its values.
        let config = agent_config(run_args(&[]).unwrap()).unwrap();
        assert_eq!(config.detector.model, DetectorParams::DEFAULT.model);
        assert!(run_args(&["--model", "budget"]).is_err());
    }

    #[test]
    fn budget_is_a_config_file_key() {
        let dir = std::env::temp_dir().join(format!("budget-config-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("monitor.toml");
        let argv = |text: &str| {
            std::fs::write(&path, text).unwrap();
            let argv = ["monitor", "run", "--iface", "lo", "--config"]
                .map(std::ffi::OsString::from)
                .into_iter()
                .chain([path.clone().into_os_string()])
                .collect();
            super::super::with_config_file(argv)
        };
        let args = argv("budget = \"300ms\"\n").unwrap();
        let cli = super::super::Cli::try_parse_from(args).unwrap();
        let super::super::Command::Run(run) = cli.command else {
            unreachable!()
        };
        assert_eq!(agent_config(*run).unwrap().detector.budget_ms, 300.0);
        let err = argv("budget = \"0s\"\n").unwrap_err();
        assert!(
            err.contains("monitor.toml:1") && err.contains("at least 1 ms"),
            "{err}"
        );
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn bad_budgets_are_refused_with_the_reason() {
        for (flags, expected) in [
            (&["--budget", "0ms"][..], "at least 1 ms"),
            (&["--budget=-5ms"], "invalid value"),
            (&["--budget", "500"], "time unit"),
            (&["--budget", "100h"], "longer than the longest interval"),
            (
                &["--budget", "500ms", "--model", "akka"],
                "cannot be used with",
            ),
            (
                &["--budget", "500ms", "--timeout-ms", "300"],
                "cannot be used with",
            ),
            (
                &["--budget", "500ms", "--detector", "phi"],
                "cannot be used with",
            ),
        ] {
            let err = run_args(flags)
                .map(|_| ())
                .expect_err(&format!("{flags:?}"));
            assert!(err.contains(expected), "{flags:?}: {err}");
        }
        // Shorter than the scan interval: the due passes between scans raise its crossings
        // (tests/tests/budget.rs, `a_budget_shorter_than_the_scan_is_met_between_scans`).
        assert!(agent_config(run_args(&["--budget", "40ms"]).unwrap()).is_ok());
    }
}
