//! What the agent says about one peer: the kernel's record turned into statistics and phi.

use std::net::{IpAddr, Ipv6Addr, SocketAddr};

use monitor_common::{
    maps::{FAMILY_IPV4, FAMILY_IPV6, PeerRecord},
    passive::{SOURCE_BFD, SOURCE_HEARTBEAT, bfd_state_name, source_name},
};
use serde::{Deserialize, Serialize, Serializer};

use crate::detector::{
    model::Estimate, qos::QosReport, tracker::DetectorConfig, window::WindowSums,
};

/// One peer as reported on the socket. The fields (and those of `WindowDetail` and
/// `QosReport`) are declared in the order the wire prints them, by name, so that a list of
/// views is written straight from them (`ListReply`) with the very bytes of a reply built
/// through a `serde_json::Value`, whose keys are sorted
/// (`views_serialize_in_the_order_a_value_prints_them`).
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct PeerView {
    /// Source of the last accepted heartbeat, `ip:port`; null before the first.
    pub addr: Option<String>,
    /// Heartbeats for this id whose authentication failed (with --auth-key-file).
    pub auth_failures: u64,
    /// BFD: the Detect Mult it announces.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bfd_detect_mult: Option<u8>,
    /// BFD: the diagnostic code of its last packet (RFC 5880 4.1).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bfd_diag: Option<u8>,
    /// BFD: the state the session reported last ("up", "init", "down", "admin_down").
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bfd_state: Option<String>,
    /// BFD: the Desired Min TX Interval it announces, ms.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bfd_tx_ms: Option<f64>,
    /// Present (true) when the detector is `--budget` and this peer's own heartbeats come
    /// slower than the budget allows (most of its last 8 intervals are longer, from its
    /// first): no deadline meets the budget without convicting the live peer at most
    /// heartbeats, so it is convicted just past its own schedule instead, later than the budget.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub budget_unmet: bool,
    /// BFD: the session's My Discriminator (with the address, its key).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub discriminator: Option<u32>,
    /// Heartbeats that repeated a sequence number already accepted.
    pub duplicates: u64,
    /// Heartbeats accepted by the kernel.
    pub heartbeats: u64,
    /// Present (true) while the agent holds new suspicions: the monitored interface's link is
    /// down or just back (`link_down`), or the agent itself just stalled. `phi` is the
    /// silence's as ever; `level` does not rise.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub held: bool,
    pub id: u64,
    /// Incarnation (sender epoch) of the last accepted heartbeat.
    pub incarnation: u32,
    /// Sequence number of the last accepted heartbeat.
    pub last_seq: u64,
    /// Highest configured level phi has reached; null below the lowest. While `held`, at most
    /// the level already raised when the hold began.
    pub level: Option<f64>,
    /// Heartbeats counted lost (gaps in the sequence numbers; a late arrival takes one off).
    pub lost: u64,
    /// Mean interval over the window, ms; null with no interval yet.
    pub mean_ms: Option<f64>,
    /// Heartbeats that came after a later one (accepted late, or refused as too old).
    pub out_of_order: u64,
    /// Silences left out of the window as outages (docs/tuning.md, window hygiene).
    #[serde(default)]
    pub outages: u32,
    /// Suspicion now: -log10 P(a live peer stays silent this long). Infinite (the `fixed`
    /// model past its timeout) is written as the largest double, 1.7976931348623157e308.
    #[serde(serialize_with = "finite")]
    pub phi: f64,
    /// Detector quality at the highest level since admission (see docs/tuning.md).
    pub qos: Option<QosReport>,
    /// Sender restarts (new incarnations) seen.
    #[serde(default)]
    pub restarts: u32,
    /// Intervals in the window.
    pub samples: u32,
    /// Time since the last accepted heartbeat (or since admission, before the first), ms.
    pub silence_ms: f64,
    /// What its heartbeats are: "heartbeat" (our wire format), "bfd" (a BFD session watched
    /// with --bfd) or "udp" (a flow to a --udp-port port).
    #[serde(default = "heartbeat_source")]
    pub source: String,
    /// Population standard deviation of the window, ms; null with no interval yet.
    pub std_ms: Option<f64>,
    /// The window itself, when asked for (`peer` with `"window": true`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub window: Option<WindowDetail>,
}

/// A peer's window as the kernel holds it: the intervals, their exact sums, the loss counters.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct WindowDetail {
    pub burst_gaps: u32,
    pub burst_heartbeats: u32,
    /// Intervals in the window, oldest first, µs.
    pub intervals_us: Vec<u32>,
    /// Intervals left out of the window since admission, modulo 2^16 (restarts, outages, over
    /// the cap, across gaps in a gapless window): what advances the last-heard word's count by
    /// 1024 each.
    #[serde(default)]
    pub left_out: u16,
    pub loss_gaps: u32,
    pub loss_heartbeats: u32,
    pub loss_lost: u32,
    /// Which of the 64 sequence numbers below `last_seq` were counted lost and have not
    /// arrived late since (bit i: `last_seq - 1 - i`); only those can still take one off `lost`.
    #[serde(default)]
    pub missing: u64,
    pub outage_run: u16,
    pub sum_sq_us: u64,
    pub sum_us: u64,
}

impl WindowDetail {
    pub fn new(record: &PeerRecord, intervals_us: Vec<u32>) -> Self {
        Self {
            intervals_us,
            sum_us: record.interval_sum_us,
            sum_sq_us: record.interval_sum_sq_us,
            loss_heartbeats: record.loss_heartbeats,
            loss_gaps: record.loss_gaps,
            loss_lost: record.loss_lost,
            burst_heartbeats: record.burst_heartbeats,
            burst_gaps: record.burst_gaps,
            outage_run: record.outage_run,
            missing: record.missing,
            left_out: record.left_out,
        }
    }
}

fn finite<S: Serializer>(value: &f64, s: S) -> Result<S::Ok, S::Error> {
    s.serialize_f64(if value.is_finite() { *value } else { f64::MAX })
}

impl PeerView {
    /// `ring`: the window's intervals, for the models that need them (else empty).
    pub fn new(
        record: &PeerRecord,
        ring: &[u32],
        now_ns: u64,
        detector: &DetectorConfig,
        qos: Option<QosReport>,
    ) -> Self {
        Self::new_after(record, ring, now_ns, detector, qos, None)
    }

    /// As `new`, the estimate made after `previous`, the peer's tracker's, for a model that
    /// carries state from one estimate to the next (`budget`'s allocation over time): made
    /// fresh, it would judge the peer by a new peer's credit, not by the deadline its tracker
    /// raises levels at.
    pub fn new_after(
        record: &PeerRecord,
        ring: &[u32],
        now_ns: u64,
        detector: &DetectorConfig,
        qos: Option<QosReport>,
        previous: Option<&Estimate>,
    ) -> Self {
        let moments = WindowSums::from_record(record).moments_ms();
        let estimate = match previous {
            Some(previous) => detector.estimate_after(record, ring, previous),
            None => detector.estimate(record, ring),
        };
        let phi = detector.phi(&estimate, record.last_arrival_ns, now_ns);
        let bfd = record.source == SOURCE_BFD && record.heartbeats != 0;
        Self {
            id: record.peer_id,
            source: source_name(record.source).into(),
            addr: source_addr(record).map(|a| a.to_string()),
            discriminator: bfd.then_some(record.bfd_my_discriminator),
            bfd_state: bfd.then(|| bfd_state_name(record.bfd_state).into()),
            bfd_diag: bfd.then_some(record.bfd_diag),
            bfd_tx_ms: bfd.then(|| record.bfd_desired_min_tx_us as f64 / 1000.0),
            bfd_detect_mult: bfd.then_some(record.bfd_detect_mult),
            budget_unmet: estimate.budget_unmet(),
            incarnation: record.incarnation,
            heartbeats: record.heartbeats,
            samples: record.samples,
            mean_ms: moments.map(|m| m.0),
            std_ms: moments.map(|m| m.1),
            silence_ms: now_ns.saturating_sub(record.last_arrival_ns) as f64 / 1e6,
            phi,
            level: detector.levels.reached(phi),
            held: false,
            last_seq: record.last_seq,
            lost: record.lost,
            duplicates: record.duplicates,
            out_of_order: record.out_of_order,
            auth_failures: record.auth_failures,
            outages: record.outages,
            restarts: record.restarts,
            qos,
            window: None,
        }
    }

    /// The view while suspicions are held: its level no higher than `raised`, the highest
    /// level raised for the peer before the hold (None: none).
    pub fn hold(&mut self, raised: Option<f64>) {
        self.held = true;
        self.level = match (self.level, raised) {
            (Some(level), Some(raised)) => Some(level.min(raised)),
            _ => None,
        };
    }
}

fn heartbeat_source() -> String {
    source_name(SOURCE_HEARTBEAT).into()
}

pub fn source_addr(record: &PeerRecord) -> Option<SocketAddr> {
    Some(SocketAddr::new(
        ip_addr(record.src_family, &record.src_addr)?,
        record.src_port,
    ))
}

/// An address as the kernel records it: a family and 16 bytes (IPv4 in the last four).
pub fn ip_addr(family: u16, bytes: &[u8; 16]) -> Option<IpAddr> {
    match family {
        FAMILY_IPV4 => Some(IpAddr::from([bytes[12], bytes[13], bytes[14], bytes[15]])),
        FAMILY_IPV6 => Some(IpAddr::V6(Ipv6Addr::from(*bytes))),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::detector::{levels::Levels, model::DetectorParams};

    /// A view written straight (`ListReply`) is byte for byte the view written through a
    /// `serde_json::Value` (sorted keys), with every optional field present and absent.
    #[test]
    fn views_serialize_in_the_order_a_value_prints_them() {
        let full = PeerView {
            addr: Some("10.0.0.1:4784".into()),
            auth_failures: 1,
            bfd_detect_mult: Some(3),
            bfd_diag: Some(1),
            bfd_state: Some("up".into()),
            bfd_tx_ms: Some(300.5),
            budget_unmet: true,
            discriminator: Some(7),
            duplicates: 2,
            heartbeats: 10,
            held: true,
            id: 9,
            incarnation: 4,
            last_seq: 11,
            level: Some(3.0),
            lost: 5,
            mean_ms: Some(100.25),
            out_of_order: 6,
            outages: 7,
            phi: f64::INFINITY,
            qos: Some(QosReport {
                mistake_mean_ms: Some(1.5),
                mistake_recurrence_ms: None,
                mistake_total_ms: 2.5,
                mistakes: 1,
                query_accuracy: 0.99,
                s_transitions: 2,
            }),
            restarts: 8,
            samples: 12,
            silence_ms: 1.5e-3,
            source: "bfd".into(),
            std_ms: None,
            window: Some(WindowDetail {
                burst_gaps: 1,
                burst_heartbeats: 2,
                intervals_us: vec![100_000, 99_999],
                left_out: 3,
                loss_gaps: 4,
                loss_heartbeats: 5,
                loss_lost: 6,
                missing: 7,
                outage_run: 8,
                sum_sq_us: 9,
                sum_us: 10,
            }),
        };
        let sparse = PeerView {
            bfd_detect_mult: None,
            bfd_diag: None,
            bfd_state: None,
            bfd_tx_ms: None,
            budget_unmet: false,
            discriminator: None,
            held: false,
            qos: None,
            window: None,
            ..full.clone()
        };
        for view in [full, sparse] {
            let value = serde_json::to_value(&view).unwrap().to_string();
            assert_eq!(serde_json::to_string(&view).unwrap(), value);
        }
    }

    #[test]
    fn ipv4_source_is_mapped() {
        let mut r = PeerRecord::admitted(1, 0);
        r.src_family = FAMILY_IPV4;
        r.src_addr[12..].copy_from_slice(&[10, 0, 0, 2]);
        r.src_port = 5000;
        assert_eq!(source_addr(&r).unwrap().to_string(), "10.0.0.2:5000");
    }

    #[test]
    fn infinite_phi_is_written_as_a_number() {
        let params = DetectorParams {
            model: crate::detector::model::Model::Fixed,
            timeout_ms: 10.0,
            ..DetectorParams::DEFAULT
        };
        let detector = DetectorConfig::new(params, Levels::default());
        let view = PeerView::new(
            &PeerRecord::admitted(1, 0),
            &[],
            1_000_000_000,
            &detector,
            None,
        );
        assert!(view.phi.is_infinite());
        assert_eq!(view.level, Some(8.0));
        let json = serde_json::to_value(&view).unwrap();
        assert_eq!(json["phi"], serde_json::json!(f64::MAX));
        assert_eq!(json["mean_ms"], serde_json::Value::Null);
        assert_eq!(json["source"], "heartbeat");
        assert!(json.get("bfd_state").is_none());
    }

    #[test]
    fn a_bfd_session_says_what_it_is() {
        let detector = DetectorConfig::new(DetectorParams::DEFAULT, Levels::default());
        let mut r = PeerRecord::admitted_passive(1, 0, SOURCE_BFD);
        r.heartbeats = 3;
        r.bfd_state = monitor_common::passive::BFD_UP;
        r.bfd_my_discriminator = 42;
        r.bfd_desired_min_tx_us = 100_000;
        r.bfd_detect_mult = 3;
        let json = serde_json::to_value(PeerView::new(&r, &[], 0, &detector, None)).unwrap();
        assert_eq!(json["source"], "bfd");
        assert_eq!(json["bfd_state"], "up");
        assert_eq!(json["discriminator"], 42);
        assert_eq!(json["bfd_tx_ms"], 100.0);
    }
}
