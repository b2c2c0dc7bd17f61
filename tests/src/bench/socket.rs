//! Query latency: `peer` and `suspects` round trips timed by one client, beside the agent's
//! own timing of them from its metrics.

use std::{
    path::Path,
    time::{Duration, Instant},
};

use monitor::serving::client::Client;
use serde::Serialize;
use serde_json::{Value, json};

use super::Percentiles;

#[derive(Debug, Clone, Serialize)]
pub struct SocketLatency {
    /// `peer` round trips, microseconds.
    pub peer_us: Percentiles,
    /// `suspects` round trips (default threshold), microseconds.
    pub suspects_us: Percentiles,
    pub suspects_returned: usize,
    /// The same requests as the agent timed them (`heartbeat_monitor_request_duration_seconds`,
    /// line read to reply written), when its metrics were asked for.
    pub agent_peer_us: Option<BucketQuantiles>,
    pub agent_suspects_us: Option<BucketQuantiles>,
}

/// Quantiles read off a Prometheus histogram: the upper bound of the bucket each falls in.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct BucketQuantiles {
    pub count: u64,
    pub p50_at_most: f64,
    pub p99_at_most: f64,
}

/// The request-duration histogram of `op` in the agent's metrics `text`, in microseconds.
pub fn request_quantiles_us(text: &str, op: &str) -> Option<BucketQuantiles> {
    let prefix = "heartbeat_monitor_request_duration_seconds_bucket{";
    let label = format!("op=\"{op}\"");
    // (upper bound in us, cumulative count), in the order the exposition lists them.
    let buckets: Vec<(f64, u64)> = text
        .lines()
        .filter_map(|line| {
            let rest = line.strip_prefix(prefix)?;
            let (labels, value) = rest.split_once("} ")?;
            if !labels.split(',').any(|l| l == label) {
                return None;
            }
            let le = labels.split(',').find_map(|l| l.strip_prefix("le=\""))?;
            let le = le.trim_end_matches('"');
            let bound = if le == "+Inf" {
                f64::INFINITY
            } else {
                le.parse::<f64>().ok()? * 1e6
            };
            Some((bound, value.trim().parse::<f64>().ok()? as u64))
        })
        .collect();
    let count = buckets.last()?.1;
    if count == 0 {
        return None;
    }
    let at = |q: f64| {
        let rank = (q * count as f64).ceil() as u64;
        buckets
            .iter()
            .find(|&&(_, cumulative)| cumulative >= rank)
            .map_or(f64::INFINITY, |&(bound, _)| bound)
    };
    Some(BucketQuantiles {
        count,
        p50_at_most: at(0.5),
        p99_at_most: at(0.99),
    })
}

/// Most time the `suspects` round trips may take together, once `MIN_SUSPECTS` are done: at
/// 200,000 peers one takes milliseconds, at a million tens, and the scale runs kill peers 4 s
/// after this probe starts (queries still running then would slow the events measured).
const SUSPECTS_BUDGET: Duration = Duration::from_secs(2);
/// Fewest `suspects` round trips a p99 is taken from (then the second largest: a poor p99,
/// and only where one round trip takes 20 ms or more).
const MIN_SUSPECTS: usize = 100;

/// Round trips of `peer` (random admitted ids 1..=peers) and `suspects`, one client, in turn:
/// `requests` of each, fewer `suspects` if they take longer than `SUSPECTS_BUDGET`. With
/// `metrics` (the agent's namespace and metrics address), also the agent's own timing of them.
pub fn socket_latency(
    socket: &Path,
    peers: u64,
    requests: usize,
    metrics: Option<(&str, &str)>,
) -> SocketLatency {
    let mut client = Client::connect(socket).expect("connect");
    let mut rng = fastrand::Rng::with_seed(7);
    let time = |client: &mut Client, request: &Value| {
        let line = request.to_string();
        let t = Instant::now();
        let reply = client.request_line(&line).expect("request");
        (t.elapsed().as_secs_f64() * 1e6, reply)
    };
    let peer_us = (0..requests)
        .map(|_| {
            let (us, reply) = time(
                &mut client,
                &json!({"op": "peer", "id": rng.u64(1..=peers)}),
            );
            assert!(reply.starts_with("{\"ok\":true"), "{reply}");
            us
        })
        .collect();
    let mut returned = 0;
    let started = Instant::now();
    let suspects_us = (0..requests.max(MIN_SUSPECTS))
        .take_while(|&i| i < MIN_SUSPECTS || started.elapsed() < SUSPECTS_BUDGET)
        .map(|_| {
            let (us, reply) = time(&mut client, &json!({"op": "suspects"}));
            let v: Value = serde_json::from_str(&reply).expect("json");
            returned = v["suspects"].as_array().map_or(0, Vec::len);
            us
        })
        .collect();
    let text = metrics.map(
        |(ns, addr)| match crate::http::get_in(ns, addr, "/metrics", &[]) {
            Ok((200, text)) => text,
            other => panic!("GET /metrics from {addr} in {ns}: {other:?}"),
        },
    );
    SocketLatency {
        peer_us: Percentiles::of(peer_us),
        suspects_us: Percentiles::of(suspects_us),
        suspects_returned: returned,
        agent_peer_us: text
            .as_deref()
            .and_then(|t| request_quantiles_us(t, "peer")),
        agent_suspects_us: text
            .as_deref()
            .and_then(|t| request_quantiles_us(t, "suspects")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn request_quantiles_are_read_off_the_buckets() {
        let text = "\
# TYPE heartbeat_monitor_request_duration_seconds histogram
heartbeat_monitor_request_duration_seconds_bucket{le=\"0.00001\",op=\"peer\"} 0
heartbeat_monitor_request_duration_seconds_bucket{le=\"0.00002\",op=\"peer\"} 60
heartbeat_monitor_request_duration_seconds_bucket{le=\"0.00004\",op=\"peer\"} 99
heartbeat_monitor_request_duration_seconds_bucket{le=\"+Inf\",op=\"peer\"} 100
heartbeat_monitor_request_duration_seconds_bucket{le=\"0.00001\",op=\"suspects\"} 0
heartbeat_monitor_request_duration_seconds_bucket{le=\"+Inf\",op=\"suspects\"} 0
";
        let peer = request_quantiles_us(text, "peer").unwrap();
        assert_eq!(peer.count, 100);
        assert!((peer.p50_at_most - 20.0).abs() < 1e-9, "{peer:?}");
        assert!((peer.p99_at_most - 40.0).abs() < 1e-9, "{peer:?}");
        assert_eq!(request_quantiles_us(text, "suspects"), None, "none asked");
        assert_eq!(request_quantiles_us(text, "stats"), None, "no series");
    }
}
