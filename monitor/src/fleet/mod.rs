//! Fleet: many monitors, one view, on NATS JetStream (docs/fleet.md).
//!
//! Each `monitor run --nats URL --observer NAME` publishes its events to the stream
//! `HEARTBEAT_EVENTS` (subject `heartbeat.events.<observer>`), keeps its current verdict on
//! every suspected peer in the bucket `heartbeat-verdicts` (`<peer>.<observer>`) and its own
//! liveness there (`observers.<observer>`, every second). `monitor fleet` reads the bucket
//! and the stream and judges agreement: a peer is down when at least K live observers have it
//! at level L or higher.
//!
//! One job per file: [`wire`] (the JSON on the wire and its validation), [`quorum`] (the
//! agreement logic, pure), [`publisher`] (the agent's side), [`consumer`] (reading the
//! fleet).

pub mod consumer;
pub mod permissions;
pub mod publisher;
pub mod quorum;
pub mod wire;

use std::{path::PathBuf, time::Duration};

use async_nats::{
    ConnectOptions,
    jetstream::{self, stream},
};

pub use publisher::{FleetTask, start};

/// The event stream.
pub const STREAM: &str = "HEARTBEAT_EVENTS";
/// The verdict and liveness bucket.
pub const BUCKET: &str = "heartbeat-verdicts";
/// How long the stream keeps events.
pub const STREAM_MAX_AGE: Duration = Duration::from_secs(24 * 3600);
/// How large the stream may grow before the oldest events go (1 GiB).
pub const STREAM_MAX_BYTES: i64 = 1 << 30;
/// Window in which the stream drops a re-sent event (same message id) after a reconnect.
pub const DUPLICATE_WINDOW: Duration = Duration::from_secs(120);
/// Events an observer holds while NATS is unreachable; past it the oldest are dropped and
/// the whole state is re-published on reconnect.
pub const DEFAULT_BUFFER: usize = 200_000;

/// How an agent publishes to the fleet (`monitor run --nats ...`).
#[derive(Debug, Clone, PartialEq)]
pub struct FleetConfig {
    /// NATS server URLs (any of them; the client fails over between them).
    pub urls: Vec<String>,
    /// This monitor's name in the fleet.
    pub observer: String,
    /// How this observer authenticates to NATS.
    pub auth: NatsAuth,
    /// Replicas of the stream and the bucket when this observer creates them.
    pub replicas: usize,
    /// Events held while NATS is unreachable.
    pub buffer: usize,
}

impl FleetConfig {
    /// Checks names and URLs (before anything starts).
    pub fn validate(&self) -> Result<(), FleetError> {
        wire::validate_observer(&self.observer)?;
        validate_urls(&self.urls)?;
        self.auth.validate()?;
        if !(1..=5).contains(&self.replicas) {
            return Err(FleetError::Config(format!(
                "--nats-replicas {}: JetStream allows 1 to 5",
                self.replicas
            )));
        }
        if self.buffer == 0 {
            return Err(FleetError::Config(
                "--nats-buffer must be at least 1".into(),
            ));
        }
        Ok(())
    }

    /// The flags whose value differs between two configurations (for SIGHUP: each needs a
    /// restart).
    pub fn changed(a: &Option<Self>, b: &Option<Self>) -> Vec<&'static str> {
        let field = |f: fn(&Self) -> String| a.as_ref().map(f) != b.as_ref().map(f);
        let mut out = Vec::new();
        if field(|c| c.urls.join(",")) {
            out.push("nats");
        }
        if field(|c| c.observer.clone()) {
            out.push("observer");
        }
        if field(|c| format!("{:?}", c.auth.creds)) {
            out.push("nats-creds");
        }
        if field(|c| format!("{:?}", c.auth.user)) {
            out.push("nats-user");
        }
        if field(|c| format!("{:?}", c.auth.password_file)) {
            out.push("nats-password-file");
        }
        if field(|c| c.replicas.to_string()) {
            out.push("nats-replicas");
        }
        if field(|c| c.buffer.to_string()) {
            out.push("nats-buffer");
        }
        out
    }
}

/// Everything that goes wrong in the fleet module.
#[derive(Debug, thiserror::Error)]
pub enum FleetError {
    #[error("observer name {0:?}: use 1 to 64 letters, digits, '-' or '_'")]
    Observer(String),
    #[error("NATS URL {url:?}: {reason}")]
    Url { url: String, reason: String },
    #[error("{0}")]
    Config(String),
    #[error("NATS credentials file {path}: {source}")]
    Creds {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error(
        "NATS password file {path} is accessible to group or others (mode {mode:04o}); chmod 600 it"
    )]
    PasswordMode { path: PathBuf, mode: u32 },
    #[error("connecting to NATS at {urls}: {reason}")]
    Connect { urls: String, reason: String },
    #[error("JetStream: {0}")]
    JetStream(String),
    #[error("{0}")]
    Wire(#[from] wire::WireError),
}

impl FleetError {
    fn js(what: &str, e: impl std::fmt::Display) -> Self {
        FleetError::JetStream(format!("{what}: {e}"))
    }
}

/// Checks each URL parses as a NATS server address.
pub fn validate_urls(urls: &[String]) -> Result<(), FleetError> {
    if urls.is_empty() {
        return Err(FleetError::Config("no NATS URL given".into()));
    }
    for url in urls {
        url.parse::<async_nats::ServerAddr>()
            .map_err(|e| FleetError::Url {
                url: url.clone(),
                reason: e.to_string(),
            })?;
    }
    Ok(())
}

/// How a client authenticates to NATS: a credentials file (JWT and NKey seed, for servers
/// run with an operator), or a user whose password is read from a file only its owner may
/// read (for `authorization { users = [...] }` in the server's configuration, docs/fleet.md
/// "Security"), or nothing.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct NatsAuth {
    pub creds: Option<PathBuf>,
    pub user: Option<String>,
    pub password_file: Option<PathBuf>,
}

impl NatsAuth {
    /// Checks the combination (the files are read when connecting).
    pub fn validate(&self) -> Result<(), FleetError> {
        match (&self.creds, &self.user, &self.password_file) {
            (Some(_), Some(_), _) | (Some(_), _, Some(_)) => Err(FleetError::Config(
                "--nats-creds and --nats-user/--nats-password-file exclude each other".into(),
            )),
            (None, Some(_), None) => Err(FleetError::Config(
                "--nats-user needs --nats-password-file".into(),
            )),
            (None, None, Some(_)) => Err(FleetError::Config(
                "--nats-password-file needs --nats-user".into(),
            )),
            _ => Ok(()),
        }
    }
}

/// Reads a password file: it must be readable by its owner only (as the peer key file);
/// one trailing newline is not part of the password.
pub fn read_password_file(path: &std::path::Path) -> Result<String, FleetError> {
    use std::os::unix::fs::PermissionsExt;
    let err = |source| FleetError::Creds {
        path: path.into(),
        source,
    };
    let mode = std::fs::metadata(path).map_err(err)?.permissions().mode() & 0o7777;
    if mode & 0o077 != 0 {
        return Err(FleetError::PasswordMode {
            path: path.into(),
            mode,
        });
    }
    let text = std::fs::read_to_string(path).map_err(err)?;
    let password = text
        .strip_suffix('\n')
        .map(|p| p.strip_suffix('\r').unwrap_or(p))
        .unwrap_or(&text);
    if password.is_empty() {
        return Err(err(std::io::Error::new(
            std::io::ErrorKind::InvalidData,
            "the file is empty",
        )));
    }
    Ok(password.to_string())
}

/// Connection options shared by both sides: credentials, a name, quick reconnects.
async fn options(auth: &NatsAuth, name: &str) -> Result<ConnectOptions, FleetError> {
    auth.validate()?;
    let mut options = ConnectOptions::new()
        .name(name)
        .max_reconnects(None)
        // A lost server is replaced quickly: 50 ms, doubling, at most 1 s between tries.
        .reconnect_delay_callback(|attempt| {
            Duration::from_millis(50u64.saturating_mul(1 << attempt.min(5)).min(1000))
        })
        .connection_timeout(Duration::from_secs(2))
        .ping_interval(Duration::from_secs(5));
    if let (Some(user), Some(path)) = (&auth.user, &auth.password_file) {
        options = options.user_and_password(user.clone(), read_password_file(path)?);
    }
    if let Some(path) = &auth.creds {
        options = options
            .credentials_file(path)
            .await
            .map_err(|source| FleetError::Creds {
                path: path.clone(),
                source,
            })?;
    }
    Ok(options)
}

/// Connects with `options`, or fails once no server of `urls` has answered within 5 s (a
/// command's connection; the agent's publisher keeps retrying instead).
async fn connect_or_give_up(
    options: ConnectOptions,
    urls: &[String],
) -> Result<async_nats::Client, FleetError> {
    tokio::time::timeout(Duration::from_secs(5), options.connect(urls.to_vec()))
        .await
        .map_err(|_| "no server answered within 5 s".to_string())
        .and_then(|r| r.map_err(|e| e.to_string()))
        .map_err(|reason| FleetError::Connect {
            urls: urls.join(","),
            reason,
        })
}

/// The stream's configuration as an observer creates it.
fn stream_config(replicas: usize) -> stream::Config {
    stream::Config {
        name: STREAM.into(),
        description: Some("heartbeat-monitor events, one subject per observer".into()),
        subjects: vec![format!("{}>", wire::EVENT_SUBJECT_PREFIX)],
        max_age: STREAM_MAX_AGE,
        max_bytes: STREAM_MAX_BYTES,
        discard: stream::DiscardPolicy::Old,
        storage: stream::StorageType::File,
        num_replicas: replicas,
        duplicate_window: DUPLICATE_WINDOW,
        ..Default::default()
    }
}

/// The bucket as an observer creates it: the stream behind a JetStream key-value bucket, as
/// every NATS client spells it (one value per key, direct gets), but without rollups: a
/// `Nats-Rollup: all` header on a write to an observer's own key would purge every other
/// observer's keys (seen on nats-server 2.9.10), and nothing here rolls up. Made
/// directly: async-nats 0.51's `create_key_value` first asks for account details in a form
/// nats-server 2.9 does not answer.
fn bucket_config(replicas: usize) -> stream::Config {
    stream::Config {
        name: kv_stream(),
        description: Some(
            "heartbeat-monitor verdicts (<peer>.<observer>) and liveness (observers.<observer>)"
                .into(),
        ),
        subjects: vec![format!("$KV.{BUCKET}.>")],
        max_messages_per_subject: 1,
        max_bytes: -1,
        max_message_size: -1,
        storage: stream::StorageType::File,
        allow_rollup: false,
        deny_delete: true,
        deny_purge: false,
        allow_direct: true,
        num_replicas: replicas,
        discard: stream::DiscardPolicy::New,
        duplicate_window: DUPLICATE_WINDOW,
        ..Default::default()
    }
}

const CREATE_STREAM: &str = "the stream HEARTBEAT_EVENTS is missing and could not be created \
    (with fleet permissions observers may not: run `monitor fleet init` with the admin's credentials)";
const CREATE_BUCKET: &str = "the bucket heartbeat-verdicts is missing and could not be created \
    (with fleet permissions observers may not: run `monitor fleet init` with the admin's credentials)";

/// What `monitor fleet init` did to the stream or the bucket.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Init {
    Created,
    /// It existed; rollups were allowed on the bucket and are no longer.
    Updated,
    Existed,
}

/// `monitor fleet init`: creates the stream and the bucket (with credentials that may), so
/// that observers need no permission to create streams. An existing bucket that allows
/// rollups (as monitors before the fleet permissions made it) is updated not to.
pub async fn init(
    urls: &[String],
    auth: &NatsAuth,
    replicas: usize,
) -> Result<(Init, Init), FleetError> {
    validate_urls(urls)?;
    let client = connect_or_give_up(options(auth, "monitor fleet init").await?, urls).await?;
    let js = jetstream::ContextBuilder::new()
        .timeout(Duration::from_secs(5))
        .build(client);
    let stream = match js.get_stream(STREAM).await {
        Ok(_) => Init::Existed,
        Err(_) => {
            js.create_stream(stream_config(replicas))
                .await
                .map_err(|e| FleetError::js("creating the stream", e))?;
            Init::Created
        }
    };
    let bucket = match js.get_stream(kv_stream()).await {
        Ok(mut existing) => {
            let info = existing
                .info()
                .await
                .map_err(|e| FleetError::js("reading the bucket's configuration", e))?;
            if info.config.allow_rollup {
                let config = stream::Config {
                    allow_rollup: false,
                    ..info.config.clone()
                };
                js.update_stream(config)
                    .await
                    .map_err(|e| FleetError::js("updating the bucket", e))?;
                Init::Updated
            } else {
                Init::Existed
            }
        }
        Err(_) => {
            js.create_stream(bucket_config(replicas))
                .await
                .map_err(|e| FleetError::js("creating the bucket", e))?;
            Init::Created
        }
    };
    Ok((stream, bucket))
}

/// Makes sure the stream and the bucket exist (an existing one is used as it is).
async fn ensure_stream_and_bucket(
    js: &jetstream::Context,
    replicas: usize,
) -> Result<(), FleetError> {
    if js.get_stream(STREAM).await.is_err() {
        match js.create_stream(stream_config(replicas)).await {
            Ok(_) => log::info!("fleet: created stream {STREAM} ({replicas} replicas)"),
            // Another observer may have created it meanwhile.
            Err(e) => {
                js.get_stream(STREAM)
                    .await
                    .map_err(|_| FleetError::js(CREATE_STREAM, e))?;
            }
        }
    }
    if js.get_stream(kv_stream()).await.is_err() {
        match js.create_stream(bucket_config(replicas)).await {
            Ok(_) => log::info!("fleet: created bucket {BUCKET} ({replicas} replicas)"),
            Err(e) => {
                js.get_stream(kv_stream())
                    .await
                    .map_err(|_| FleetError::js(CREATE_BUCKET, e))?;
            }
        }
    }
    Ok(())
}

/// The subject of one bucket key.
fn kv_subject(key: &str) -> String {
    format!("$KV.{BUCKET}.{key}")
}

/// The bucket's underlying stream.
fn kv_stream() -> String {
    format!("KV_{BUCKET}")
}

/// Unix time in ms with sub-millisecond precision.
pub fn unix_ms() -> f64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0.0, |d| d.as_secs_f64() * 1000.0)
}

/// A server timestamp as Unix ms.
fn datetime_ms(t: async_nats::jetstream::message::Info<'_>) -> f64 {
    t.published.unix_timestamp_nanos() as f64 / 1e6
}

/// The observer name when none is given: this host's name (its first label).
pub fn default_observer() -> String {
    let host = nix::unistd::gethostname().unwrap_or_default();
    wire::observer_from_hostname(&host.to_string_lossy())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    #[test]
    fn a_password_file_must_be_private_and_one_newline_is_dropped() {
        let dir = std::env::temp_dir().join(format!("hbm-pw-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("pw");
        std::fs::write(&path, "s3cret\n").unwrap();
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600)).unwrap();
        assert_eq!(read_password_file(&path).unwrap(), "s3cret");
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o640)).unwrap();
        let e = read_password_file(&path).unwrap_err().to_string();
        assert!(e.contains("mode 0640") && !e.contains("s3cret"), "{e}");
        std::fs::write(&path, "\n").unwrap();
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600)).unwrap();
        assert!(read_password_file(&path).is_err());
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn credentials_combine_one_way_only() {
        let user = NatsAuth {
            user: Some("obs-a".into()),
            password_file: Some("/p".into()),
            ..Default::default()
        };
        assert!(user.validate().is_ok());
        assert!(NatsAuth::default().validate().is_ok());
        let both = NatsAuth {
            creds: Some("/c".into()),
            ..user.clone()
        };
        assert!(both.validate().is_err());
        let half = NatsAuth {
            password_file: None,
            ..user
        };
        assert!(half.validate().is_err());
    }
}
