//! Which peers get a slot: those listed in a peers file (`peers_file`), and (unless disabled)
//! those the kernel reports as unknown, while slots remain: from the interface's own networks
//! by default (`--admit-from`), at most `--admit-per-source` of them from one source address,
//! at most `--admit-rate` a second. Refusals are counted by reason and logged at most once a
//! second, naming the source that caused most of them. Here the agent gives slots and takes
//! them back (`forget`, `--expire-after`); whether a first packet is admitted is `decision`'s.

mod decision;
mod policy;
mod refusals;

use std::time::Instant;

use monitor_common::{
    maps::UnknownPeerReport,
    passive::{SOURCE_BFD, SOURCE_HEARTBEAT, bfd_state_name, source_name},
};

pub use self::{
    decision::Admission,
    policy::{AdmissionPolicy, AdmitFrom, AdmitFromValue, DEFAULT_PER_SOURCE, parse_per_source},
    refusals::{AdmissionCounters, REFUSAL_LOG_INTERVAL, Refusal, Verdict},
};
use super::{Agent, wall_ms};
use crate::{
    kernel::clock::monotonic_ns,
    kernel::registry::{AdmitError, ForgetError},
    serving::event::Event,
    serving::peer_view::ip_addr,
};

impl Agent {
    pub fn admit(&self, id: u64) -> Result<u32, AdmitError> {
        self.admit_as(id, SOURCE_HEARTBEAT)
    }

    /// Admits a peer of `source`: a heartbeat peer, or a BFD session or UDP flow the kernel
    /// reported (`monitor_common::passive`).
    fn admit_as(&self, id: u64, source: u8) -> Result<u32, AdmitError> {
        let slot = self.registry.write().expect("registry lock").admit_as(
            &self.table,
            id,
            monotonic_ns(),
            source,
        )?;
        self.publish(Event::Admit {
            id,
            at: wall_ms() as u64,
        });
        Ok(slot)
    }

    pub fn forget(&self, id: u64) -> Result<(), ForgetError> {
        self.forget_because(id, "request")
    }

    pub(super) fn forget_because(&self, id: u64, reason: &str) -> Result<(), ForgetError> {
        // Admission first, then the registry, as `on_unknown_peer` takes them: its source's
        // share is given back in the same step as the slot.
        let mut admission = self.admission.lock().expect("admission lock");
        let mut registry = self.registry.write().expect("registry lock");
        let slot = registry.forget(&self.table, id)?;
        admission.forgotten(id);
        self.trackers.lock().clear(slot);
        drop(registry);
        drop(admission);
        self.publish(Event::Forget {
            id,
            reason: reason.into(),
            at: wall_ms() as u64,
        });
        Ok(())
    }

    pub(super) fn on_unknown_peer(&self, report: &UnknownPeerReport) {
        let id = report.peer_id;
        // Reports race with admission: the kernel may report a peer again before it sees the
        // new index entry. Those cost no token.
        if self
            .registry
            .read()
            .expect("registry lock")
            .slot_of(id)
            .is_some()
        {
            return;
        }
        let source = ip_addr(report.src_family, &report.src_addr);
        let mut admission = self.admission.lock().expect("admission lock");
        let passive = report.source != SOURCE_HEARTBEAT;
        let now = Instant::now();
        if let Verdict::Refuse(reason) = admission.decide(source, passive, now) {
            log::debug!(
                "not admitting peer {id} from {}: {}",
                address_for_log(source),
                reason.name()
            );
            if let Some(line) = admission.refusal_line(now) {
                log::warn!("{line}");
            }
            return;
        }
        let refused = |admission: &mut Admission, reason: Refusal| {
            admission.refused(reason, source);
            if let Some(line) = admission.refusal_line(now) {
                log::warn!("{line}");
            }
        };
        match self.admit_as(id, report.source) {
            Ok(slot) => {
                admission.admitted(id, source);
                // Its first deadline counts from this packet and may come before the next
                // scan: the sweeper looks at the slot now. One poke for a storm of them: the
                // sweeper takes every slot armed so when it wakes.
                if self.trackers.lock().due.arm_now(slot) {
                    self.sweep_wake.poke();
                }
                log::debug!(
                    "admitted {} peer {id} (slot {slot}) on its first packet",
                    source_name(report.source)
                );
                if report.source == SOURCE_BFD {
                    log::info!(
                        "watching BFD session {id:#x} from {} (discriminator {}, {})",
                        address_for_log(source),
                        report.discriminator,
                        bfd_state_name(report.bfd_state)
                    );
                }
            }
            Err(AdmitError::Exists(_)) => {}
            Err(e) => {
                log::debug!("not admitting peer {id}: {e}");
                let reason = match e {
                    AdmitError::Full(_) | AdmitError::Exists(_) => Refusal::Full,
                    AdmitError::Index { .. } => Refusal::IndexFull,
                    AdmitError::Reserved(_) => Refusal::Reserved,
                };
                refused(&mut admission, reason);
            }
        }
    }

    /// Replaces the admission policy (SIGHUP); its counters and token bucket carry on.
    pub fn set_admission(&self, policy: AdmissionPolicy) {
        self.admission
            .lock()
            .expect("admission lock")
            .set_policy(policy);
    }

    /// The interface's networks changed (or were read at start): who `--admit-from`'s
    /// default admits.
    pub fn set_connected_networks(&self, networks: Vec<ipnet::IpNet>) {
        self.admission
            .lock()
            .expect("admission lock")
            .set_connected(networks);
    }

    /// The admission policy in force, in one line (the start and SIGHUP log it).
    pub fn admission_policy_line(&self) -> String {
        let admission = self.admission.lock().expect("admission lock");
        admission
            .policy()
            .describe(&self.iface, admission.connected())
    }

    /// Peers admitted on a first packet from `source` and still watched.
    pub fn admitted_from(&self, source: std::net::IpAddr) -> u32 {
        self.admission
            .lock()
            .expect("admission lock")
            .admitted_from(source)
    }

    /// Logs the refusals of the last second, if any are untold (the sweep calls it, so the
    /// tail of a burst is told although no refusal follows it). Never waits for the lock.
    pub(super) fn tell_refusals(&self) {
        if let Ok(mut admission) = self.admission.try_lock()
            && let Some(line) = admission.refusal_line(Instant::now())
        {
            log::warn!("{line}");
        }
    }
}

/// An address for a log line: a report may carry none.
fn address_for_log(addr: Option<std::net::IpAddr>) -> String {
    addr.map_or_else(|| "an unknown address".into(), |a| a.to_string())
}
