//! The NATS permissions of each fleet role, so that no observer can write another's verdicts
//! or events (docs/fleet.md, "Security"): `monitor fleet permissions` prints them in the
//! server's configuration syntax, and the tests build their server's configuration from them.
//!
//! Every subject below was found needed by running the monitor against nats-server 2.9.10
//! with exactly these allow lists (a missing one shows as `Publish Violation` in its log):
//!
//! - an observer publishes its events (`heartbeat.events.<observer>`) and writes its own
//!   bucket keys: `<peer>.<observer>` and `observers.<observer>`, both `*.<observer>`
//!   (a key whose first token is neither a peer id nor `observers` is skipped as malformed);
//! - it looks the stream and the bucket up (`STREAM.INFO`) and, to re-publish its state,
//!   reads its own keys through a push consumer of the bucket (`CONSUMER.CREATE`, and the
//!   replies to the server's flow control, `$JS.FC.<stream>.>`);
//! - a reader (`monitor fleet`) does the same lookups and reads both through consumers;
//! - both receive replies and deliveries on `_INBOX.>`, and may subscribe to nothing else.
//!
//! Nobody but the admin (`monitor fleet init`) may create, update, purge or delete a stream,
//! nor ask for a message directly (`DIRECT.GET`, `STREAM.MSG.GET`): a direct get's reply
//! carries the stored message, and a reply subject is not checked by the server, so a direct
//! get with another observer's key as its reply subject would copy a stored verdict there.

use super::{BUCKET, FleetError, STREAM, kv_stream, wire};

/// The subjects one NATS user may publish to and subscribe to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Permissions {
    pub publish: Vec<String>,
    pub subscribe: Vec<String>,
}

/// Lookups and reads through consumers of `streams`.
fn reading(streams: &[&str]) -> Vec<String> {
    let mut out = Vec::new();
    for s in streams {
        out.push(format!("$JS.API.STREAM.INFO.{s}"));
    }
    for s in streams {
        // async-nats asks for an ephemeral consumer on `CONSUMER.CREATE.<stream>`, a named
        // one with a filter on `CONSUMER.CREATE.<stream>.<name>.<filter>`.
        out.push(format!("$JS.API.CONSUMER.CREATE.{s}"));
        out.push(format!("$JS.API.CONSUMER.CREATE.{s}.>"));
    }
    for s in streams {
        out.push(format!("$JS.FC.{s}.>"));
    }
    out
}

/// What the observer `observer` may do: write its own events and keys, read its own keys.
pub fn observer(observer: &str) -> Result<Permissions, FleetError> {
    wire::validate_observer(observer)?;
    let mut publish = vec![
        format!("{}{observer}", wire::EVENT_SUBJECT_PREFIX),
        format!("$KV.{BUCKET}.*.{observer}"),
    ];
    publish.extend(reading(&[&kv_stream()]));
    // The stream is looked up before publishing to it.
    publish.insert(2, format!("$JS.API.STREAM.INFO.{STREAM}"));
    Ok(Permissions {
        publish,
        subscribe: vec!["_INBOX.>".into()],
    })
}

/// What a reader (`monitor fleet query` and `watch`) may do: read the bucket and the stream.
pub fn reader() -> Permissions {
    Permissions {
        publish: reading(&[&kv_stream(), STREAM]),
        subscribe: vec!["_INBOX.>".into()],
    }
}

impl Permissions {
    /// The `permissions` block of a user in nats-server's configuration (JSON values, which
    /// the configuration syntax accepts).
    pub fn to_config(&self) -> String {
        let list = |v: &[String]| {
            v.iter()
                .map(|s| serde_json::Value::String(s.clone()).to_string())
                .collect::<Vec<_>>()
                .join(", ")
        };
        format!(
            "permissions: {{\n  publish: {{ allow: [{}] }},\n  subscribe: {{ allow: [{}] }}\n}}",
            list(&self.publish),
            list(&self.subscribe)
        )
    }

    /// A user of nats-server's `authorization { users = [...] }` with these permissions
    /// (the password as given: a bcrypt hash, or plain text).
    pub fn user_config(&self, user: &str, password: &str) -> String {
        let q = |s: &str| serde_json::Value::String(s.into()).to_string();
        format!(
            "{{ user: {}, password: {}, {} }}",
            q(user),
            q(password),
            self.to_config().replace('\n', " ")
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_observer_may_write_only_its_own_subjects() {
        let p = observer("obs-a").unwrap();
        assert!(p.publish.contains(&"heartbeat.events.obs-a".to_string()));
        assert!(
            p.publish
                .contains(&"$KV.heartbeat-verdicts.*.obs-a".to_string())
        );
        for s in &p.publish {
            assert!(!s.contains("obs-b"), "{s}");
            for refused in [
                "STREAM.CREATE",
                "CREATE.HEARTBEAT_EVENTS",
                "DIRECT",
                "MSG.GET",
            ] {
                assert!(!s.contains(refused), "{s}");
            }
            let wildcard = s.ends_with(".>") || s.ends_with(".*");
            let reading = s.starts_with("$JS.API.CONSUMER.CREATE.KV_") || s.starts_with("$JS.FC.");
            assert!(!wildcard || reading, "{s}");
        }
        assert_eq!(p.subscribe, vec!["_INBOX.>"]);
        assert!(observer("a.b").is_err());
        assert!(observer("*").is_err());
    }

    #[test]
    fn a_reader_writes_nothing() {
        let p = reader();
        assert!(p.publish.iter().all(|s| s.starts_with("$JS.")), "{p:?}");
        assert!(!p.publish.iter().any(|s| s.contains("DIRECT")));
        let config = p.to_config();
        assert!(
            config.contains(r#""$JS.API.STREAM.INFO.HEARTBEAT_EVENTS""#),
            "{config}"
        );
        let user = p.user_config("reader", "pw");
        assert!(user.starts_with(r#"{ user: "reader", password: "pw", permissions: {"#));
        assert!(!user.contains('\n'));
    }
}
