//! Passive sources, the agent's side (`monitor run --bfd`, `--udp-port`): which are on, and
//! what a BFD session's reported state says beyond its silence.

use monitor_common::{
    config::XDP_FLAG_BFD,
    maps::PeerRecord,
    passive::{
        BFD_ADMIN_DOWN, BFD_DOWN, BFD_INIT, BFD_MULTIHOP_PORT, BFD_SINGLE_HOP_PORT, BFD_UP,
        MAX_FLOW_PORTS,
    },
};

/// Which passive sources the kernel records besides heartbeats.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct PassiveSources {
    pub bfd: bool,
    /// `--udp-port`, 0 = unused.
    pub flow_ports: [u16; MAX_FLOW_PORTS],
}

impl PassiveSources {
    /// Checks the ports: at most [`MAX_FLOW_PORTS`], no repeats, none that another source
    /// already claims (the heartbeat port, the BFD ports with `--bfd`), and never 0.
    pub fn new(bfd: bool, ports: &[u16], heartbeat_port: u16) -> Result<Self, String> {
        if ports.len() > MAX_FLOW_PORTS {
            return Err(format!(
                "at most {MAX_FLOW_PORTS} ports, got {}",
                ports.len()
            ));
        }
        let mut flow_ports = [0; MAX_FLOW_PORTS];
        for (i, &port) in ports.iter().enumerate() {
            if port == 0 {
                return Err("port 0 is not a port datagrams are sent to".into());
            }
            if ports[..i].contains(&port) {
                return Err(format!("port {port} is listed twice"));
            }
            if port == heartbeat_port {
                return Err(format!(
                    "port {port} is the heartbeat port (--port): its datagrams are heartbeats"
                ));
            }
            if bfd && (port == BFD_SINGLE_HOP_PORT || port == BFD_MULTIHOP_PORT) {
                return Err(format!(
                    "port {port} is a BFD port, watched by --bfd as sessions"
                ));
            }
            flow_ports[i] = port;
        }
        Ok(Self { bfd, flow_ports })
    }

    pub fn xdp_flags(&self) -> u32 {
        if self.bfd { XDP_FLAG_BFD } else { 0 }
    }
}

/// What the sweep last saw of one BFD session, to raise `bfd_down` once per fall.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BfdSeen {
    pub slot: u32,
    pub id: u64,
    /// The slot's last-heard word when last looked at: a state change comes with a packet, so
    /// a session whose word has not moved needs no look (a sweep then costs one load).
    pub word: u64,
    state: u8,
    transitions: u32,
}

/// A session that said it went down: the state it reports and why.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BfdFall {
    pub state: u8,
    pub diag: u8,
}

impl BfdSeen {
    pub fn new(slot: u32, id: u64, record: &PeerRecord) -> Self {
        Self {
            slot,
            id,
            word: u64::MAX,
            state: record.bfd_state,
            transitions: record.bfd_transitions,
        }
    }

    /// Looks at the session's record again. A session that reported Up or Init when last
    /// seen and reports Down or AdminDown now fell; so did one that is down now after more
    /// than one change since (it went up and down between two looks). A session that has
    /// never been up (Down is where every session starts) did not.
    pub fn look(&mut self, record: &PeerRecord) -> Option<BfdFall> {
        let was_up = self.state == BFD_UP || self.state == BFD_INIT;
        let changes = record.bfd_transitions.wrapping_sub(self.transitions);
        let down = record.heartbeats != 0
            && (record.bfd_state == BFD_DOWN || record.bfd_state == BFD_ADMIN_DOWN);
        self.state = record.bfd_state;
        self.transitions = record.bfd_transitions;
        (down && changes > 0 && (was_up || changes > 1)).then_some(BfdFall {
            state: record.bfd_state,
            diag: record.bfd_diag,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use monitor_common::passive::SOURCE_BFD;

    #[test]
    fn ports_are_checked() {
        let p = PassiveSources::new(true, &[53, 123], 18498).unwrap();
        assert_eq!(
            (p.flow_ports, p.xdp_flags()),
            ([53, 123, 0, 0], XDP_FLAG_BFD)
        );
        assert!(PassiveSources::new(false, &[1, 2, 3, 4, 5], 18498).is_err());
        assert!(PassiveSources::new(false, &[53, 53], 18498).is_err());
        assert!(PassiveSources::new(false, &[18498], 18498).is_err());
        assert!(PassiveSources::new(true, &[3784], 18498).is_err());
        assert!(PassiveSources::new(false, &[3784], 18498).is_ok());
        assert!(PassiveSources::new(false, &[0], 18498).is_err());
    }

    fn record(state: u8, transitions: u32, diag: u8) -> PeerRecord {
        let mut r = PeerRecord::admitted_passive(1, 0, SOURCE_BFD);
        r.heartbeats = 1 + transitions as u64;
        r.bfd_state = state;
        r.bfd_transitions = transitions;
        r.bfd_diag = diag;
        r
    }

    #[test]
    fn a_session_falls_once_when_it_goes_down_after_being_up() {
        let mut seen = BfdSeen::new(0, 1, &PeerRecord::admitted_passive(1, 0, SOURCE_BFD));
        // A session starts Down and comes up through Init: no fall.
        assert_eq!(seen.look(&record(BFD_DOWN, 0, 0)), None);
        assert_eq!(seen.look(&record(BFD_INIT, 1, 0)), None);
        assert_eq!(seen.look(&record(BFD_UP, 2, 0)), None);
        // Down with "control detection time expired": one fall, not one per look.
        let fall = seen.look(&record(BFD_DOWN, 3, 1));
        assert_eq!(
            fall,
            Some(BfdFall {
                state: BFD_DOWN,
                diag: 1
            })
        );
        assert_eq!(seen.look(&record(BFD_DOWN, 3, 1)), None);
        // Up and AdminDown between two looks.
        assert_eq!(seen.look(&record(BFD_UP, 4, 0)), None);
        let fall = seen.look(&record(BFD_ADMIN_DOWN, 5, 7));
        assert_eq!(
            fall,
            Some(BfdFall {
                state: BFD_ADMIN_DOWN,
                diag: 7
            })
        );
        // Down, Init, Down again between two looks: it came up and fell.
        assert!(seen.look(&record(BFD_DOWN, 7, 1)).is_some());
    }
}
