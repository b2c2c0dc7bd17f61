//! What a metrics scrape (`--metrics-addr`, `serving::metrics`) reads of the agent.

use std::sync::atomic::Ordering;

use super::Agent;
use crate::{
    kernel::clock::monotonic_ns,
    serving::metrics::{self, AgentMetrics, PeerSeries, Scrape, SelectedPeer},
};

impl Agent {
    /// What a metrics scrape reads: levels and phi of every peer from the sweep's trackers
    /// (no kernel read per peer), the selected peers, and `stats`.
    fn scrape_now(&self, series: &PeerSeries) -> Scrape {
        let now = monotonic_ns();
        let detector = self.detector();
        let levels = detector.levels.as_slice().to_vec();
        let mut peers_at = vec![0u64; levels.len() + 1];
        let mut phi_le = vec![0u64; metrics::PHI_BUCKETS.len()];
        // (phi, id, silence s, crossed) of the asked-for ids, found in the one pass, and of
        // every tracked peer only when the top K are asked for.
        let wanted: std::collections::HashSet<u64> = series.ids.iter().copied().collect();
        let mut found: std::collections::HashMap<u64, (f64, u64, f64, u8)> =
            std::collections::HashMap::with_capacity(wanted.len());
        let mut all: Vec<(f64, u64, f64, u8)> = Vec::new();
        let mut budget_unmet = 0u64;
        {
            let trackers = self.trackers.lock();
            for (t, watch) in trackers.peers.iter().zip(&trackers.watches) {
                let Some(t) = t else { continue };
                let crossed = t.crossed();
                budget_unmet += t.estimate().budget_unmet() as u64;
                peers_at[(crossed as usize).min(levels.len())] += 1;
                // The estimate of the last refresh (at most a window of heartbeats old, see
                // `PeerTracker::refloor`) against the last arrival: the scrape reads no slot.
                let last = t.last_arrival_ns(watch, now);
                let phi = detector.phi(t.estimate(), last, now);
                for (n, &le) in phi_le.iter_mut().zip(&metrics::PHI_BUCKETS) {
                    if phi <= le {
                        *n += 1;
                    }
                }
                let peer = || {
                    let silence = now.saturating_sub(last) as f64 / 1e9;
                    (phi, t.peer_id, silence, crossed)
                };
                if wanted.contains(&t.peer_id) {
                    found.insert(t.peer_id, peer());
                }
                if series.top > 0 {
                    all.push(peer());
                }
            }
        }
        let level_of = |crossed: u8| {
            if crossed == 0 {
                0.0
            } else {
                levels[(crossed as usize - 1).min(levels.len() - 1)]
            }
        };
        let mut selected_ids: std::collections::HashSet<u64> = std::collections::HashSet::new();
        let mut selected: Vec<SelectedPeer> = Vec::new();
        let select = |p: &(f64, u64, f64, u8)| SelectedPeer {
            id: p.1,
            phi: p.0,
            silence_s: p.2,
            level: level_of(p.3),
        };
        for id in &series.ids {
            if let Some(p) = found.get(id)
                && selected_ids.insert(p.1)
            {
                selected.push(select(p));
            }
        }
        if series.top > 0 && !all.is_empty() {
            let k = series.top.min(all.len());
            all.select_nth_unstable_by(k - 1, |a, b| b.0.total_cmp(&a.0));
            let top = &mut all[..k];
            top.sort_unstable_by(|a, b| b.0.total_cmp(&a.0).then(a.1.cmp(&b.1)));
            for p in top.iter() {
                if selected_ids.insert(p.1) {
                    selected.push(select(p));
                }
            }
        }
        Scrape {
            stats: self
                .stats()
                .map_err(|e| log::warn!("metrics scrape: {e}"))
                .ok(),
            levels,
            peers_at,
            phi_le,
            selected,
            socket_clients: self.clients.load(Ordering::Relaxed) as u64,
            budget_unmet,
        }
    }
}

impl metrics::Source for Agent {
    fn scrape(&self, series: &PeerSeries) -> Scrape {
        self.scrape_now(series)
    }

    fn metrics(&self) -> &AgentMetrics {
        &self.metrics
    }
}
