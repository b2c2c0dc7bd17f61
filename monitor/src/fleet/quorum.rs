//! Agreement between observers, as pure logic: the fleet's view is every observer's verdicts
//! and liveness records as read from the bucket; a peer is down when at least K live
//! observers have it at level L or higher. An observer whose liveness record is older than
//! [`LIVENESS_BOUND_MS`] is not counted, nor are its verdicts.

use std::collections::BTreeMap;

use serde::Serialize;

use super::wire::{Key, Liveness, Verdict, WireError};

/// An observer whose liveness record was written longer ago than this is not counted.
pub const LIVENESS_BOUND_MS: f64 = 3000.0;

/// How many live observers must agree.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Quorum {
    /// More than half of the live observers (1 of 1, 2 of 2 or 3, 3 of 4 or 5, ...).
    Majority,
    /// At least this many (at least 1).
    AtLeast(usize),
}

impl Quorum {
    /// Votes needed when `live` observers are live (never less than one).
    pub fn needed(self, live: usize) -> usize {
        match self {
            Quorum::Majority => live / 2 + 1,
            Quorum::AtLeast(k) => k.max(1),
        }
    }
}

impl std::str::FromStr for Quorum {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        if s == "majority" {
            return Ok(Quorum::Majority);
        }
        match s.parse::<usize>() {
            Ok(k) if k >= 1 => Ok(Quorum::AtLeast(k)),
            _ => Err(format!(
                "{s:?}: expected a count of at least 1, or `majority`"
            )),
        }
    }
}

impl std::fmt::Display for Quorum {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Quorum::Majority => write!(f, "majority"),
            Quorum::AtLeast(k) => write!(f, "{k}"),
        }
    }
}

/// When a peer counts as down.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Rule {
    pub quorum: Quorum,
    /// The level each agreeing observer must have reached.
    pub level: f64,
}

/// A peer the fleet holds down.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct FleetSuspect {
    pub id: u64,
    /// The highest level at least K live observers have reached.
    pub level: f64,
    /// The live observers at `Rule::level` or higher, by name.
    pub observers: Vec<String>,
    /// Unix ms at which the K-th of them crossed its level, when they tell.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub crossed_at: Option<f64>,
}

/// One observer's view of one peer.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ObserverVerdict {
    pub observer: String,
    /// Whether the observer is counted (its liveness record is recent).
    pub live: bool,
    /// Null when the observer does not suspect the peer.
    pub level: Option<f64>,
    pub phi: Option<f64>,
    pub since: Option<f64>,
}

/// One observer as the bucket knows it.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ObserverView {
    pub observer: String,
    pub live: bool,
    /// Milliseconds since its liveness record was written (by the NATS server's clock).
    pub age_ms: f64,
    #[serde(flatten)]
    pub liveness: Liveness,
}

#[derive(Debug, Clone)]
struct ObserverRecord {
    written_ms: f64,
    liveness: Liveness,
}

/// What one bucket entry did to the view.
#[derive(Debug, Clone, PartialEq)]
pub enum Change {
    Peer(u64),
    Observer(String),
}

/// Every observer's verdicts and liveness, as read from the bucket.
#[derive(Debug, Default, Clone)]
pub struct FleetView {
    verdicts: BTreeMap<u64, BTreeMap<String, Verdict>>,
    observers: BTreeMap<String, ObserverRecord>,
}

impl FleetView {
    /// Applies one bucket entry: `value` is `None` for a delete or purge; `written_ms` is
    /// the server's Unix ms of the write. A malformed key or value is an error and changes
    /// nothing, except that a malformed value replaces (removes) what the key held: the key's
    /// current value is no longer a verdict.
    pub fn apply(
        &mut self,
        key: &str,
        value: Option<&[u8]>,
        written_ms: f64,
    ) -> Result<Change, WireError> {
        match Key::parse(key)? {
            Key::Verdict { peer, observer } => {
                let parsed = value.map(Verdict::parse).transpose();
                let verdict = match &parsed {
                    Ok(v) => v.clone(),
                    Err(_) => None,
                };
                match verdict {
                    Some(v) => {
                        self.verdicts.entry(peer).or_default().insert(observer, v);
                    }
                    None => {
                        if let Some(per) = self.verdicts.get_mut(&peer) {
                            per.remove(&observer);
                            if per.is_empty() {
                                self.verdicts.remove(&peer);
                            }
                        }
                    }
                }
                parsed.map(|_| Change::Peer(peer))
            }
            Key::Observer(observer) => match value {
                None => {
                    self.observers.remove(&observer);
                    Ok(Change::Observer(observer))
                }
                Some(bytes) => match Liveness::parse(bytes) {
                    Ok(liveness) => {
                        self.observers.insert(
                            observer.clone(),
                            ObserverRecord {
                                written_ms,
                                liveness,
                            },
                        );
                        Ok(Change::Observer(observer))
                    }
                    Err(e) => {
                        self.observers.remove(&observer);
                        Err(e)
                    }
                },
            },
        }
    }

    /// Whether `observer` counts at `now_ms`.
    pub fn is_live(&self, observer: &str, now_ms: f64) -> bool {
        self.observers
            .get(observer)
            .is_some_and(|r| now_ms - r.written_ms <= LIVENESS_BOUND_MS)
    }

    /// Observers counted at `now_ms`.
    pub fn live_count(&self, now_ms: f64) -> usize {
        self.observers
            .keys()
            .filter(|o| self.is_live(o, now_ms))
            .count()
    }

    /// Ids of every peer some observer has a verdict on.
    pub fn peers(&self) -> impl Iterator<Item = u64> + '_ {
        self.verdicts.keys().copied()
    }

    /// Whether the fleet holds `id` down under `rule`, given `live` observers counted now.
    pub fn judge(&self, id: u64, now_ms: f64, rule: Rule, live: usize) -> Option<FleetSuspect> {
        let per = self.verdicts.get(&id)?;
        let needed = rule.quorum.needed(live);
        let counted: Vec<(&String, &Verdict)> = per
            .iter()
            .filter(|(o, v)| v.level >= rule.level && self.is_live(o, now_ms))
            .collect();
        if counted.len() < needed {
            return None;
        }
        let mut levels: Vec<f64> = counted.iter().map(|(_, v)| v.level).collect();
        levels.sort_by(|a, b| b.total_cmp(a));
        let mut crossed: Vec<f64> = counted.iter().filter_map(|(_, v)| v.crossed_at).collect();
        crossed.sort_by(f64::total_cmp);
        Some(FleetSuspect {
            id,
            level: levels[needed - 1],
            observers: counted.iter().map(|(o, _)| (*o).clone()).collect(),
            crossed_at: (crossed.len() >= needed).then(|| crossed[needed - 1]),
        })
    }

    /// Every peer the fleet holds down under `rule` at `now_ms`, by id.
    pub fn suspects(&self, now_ms: f64, rule: Rule) -> Vec<FleetSuspect> {
        let live = self.live_count(now_ms);
        self.peers()
            .filter_map(|id| self.judge(id, now_ms, rule, live))
            .collect()
    }

    /// Every known observer's view of `id`, by observer name (observers with no verdict on it
    /// appear with null levels); observers known only from a verdict are listed as not live.
    pub fn peer(&self, id: u64, now_ms: f64) -> Vec<ObserverVerdict> {
        let empty = BTreeMap::new();
        let per = self.verdicts.get(&id).unwrap_or(&empty);
        let mut names: Vec<&String> = self.observers.keys().chain(per.keys()).collect();
        names.sort();
        names.dedup();
        names
            .into_iter()
            .map(|o| {
                let v = per.get(o);
                ObserverVerdict {
                    observer: o.clone(),
                    live: self.is_live(o, now_ms),
                    level: v.map(|v| v.level),
                    phi: v.map(|v| v.phi),
                    since: v.map(|v| v.since),
                }
            })
            .collect()
    }

    /// Every observer with a liveness record, by name.
    pub fn observers(&self, now_ms: f64) -> Vec<ObserverView> {
        self.observers
            .iter()
            .map(|(o, r)| ObserverView {
                observer: o.clone(),
                live: self.is_live(o, now_ms),
                age_ms: (now_ms - r.written_ms).max(0.0),
                liveness: r.liveness.clone(),
            })
            .collect()
    }
}

/// A change of the fleet's judgement, as `monitor fleet watch` reports it.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(tag = "event", rename_all = "lowercase")]
pub enum FleetChange {
    /// At least K live observers have the peer at the level.
    Down {
        #[serde(flatten)]
        suspect: FleetSuspect,
        at: u64,
    },
    /// Fewer do now.
    Up { id: u64, at: u64 },
}

/// The peers held down, kept between updates so that only changes are reported.
#[derive(Debug, Default)]
pub struct Convictions {
    down: BTreeMap<u64, FleetSuspect>,
}

impl Convictions {
    /// Re-judges `ids` (after their verdicts changed).
    pub fn update_peers(
        &mut self,
        view: &FleetView,
        ids: impl IntoIterator<Item = u64>,
        now_ms: f64,
        rule: Rule,
    ) -> Vec<FleetChange> {
        let live = view.live_count(now_ms);
        let mut changes = Vec::new();
        for id in ids {
            self.judge_one(view, id, now_ms, rule, live, &mut changes);
        }
        changes
    }

    /// Re-judges every peer (after observers came or went, or as time passes).
    pub fn update_all(&mut self, view: &FleetView, now_ms: f64, rule: Rule) -> Vec<FleetChange> {
        let mut ids: Vec<u64> = view.peers().collect();
        ids.extend(self.down.keys().copied());
        ids.sort_unstable();
        ids.dedup();
        self.update_peers(view, ids, now_ms, rule)
    }

    fn judge_one(
        &mut self,
        view: &FleetView,
        id: u64,
        now_ms: f64,
        rule: Rule,
        live: usize,
        changes: &mut Vec<FleetChange>,
    ) {
        let at = now_ms as u64;
        match (
            view.judge(id, now_ms, rule, live),
            self.down.contains_key(&id),
        ) {
            (Some(suspect), false) => {
                self.down.insert(id, suspect.clone());
                changes.push(FleetChange::Down { suspect, at });
            }
            (Some(suspect), true) => {
                self.down.insert(id, suspect);
            }
            (None, true) => {
                self.down.remove(&id);
                changes.push(FleetChange::Up { id, at });
            }
            (None, false) => {}
        }
    }

    pub fn down(&self) -> impl Iterator<Item = &FleetSuspect> {
        self.down.values()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn verdict(level: f64, crossed_at: f64) -> Vec<u8> {
        serde_json::to_vec(&Verdict {
            level,
            phi: level + 0.1,
            since: 0.0,
            crossed_at: Some(crossed_at),
            at: 0,
        })
        .unwrap()
    }

    fn alive(view: &mut FleetView, observer: &str, written_ms: f64) {
        let bytes = serde_json::to_vec(&Liveness::default()).unwrap();
        view.apply(&Key::observer(observer), Some(&bytes), written_ms)
            .unwrap();
    }

    const AT8: Rule = Rule {
        quorum: Quorum::AtLeast(2),
        level: 8.0,
    };

    #[test]
    fn quorum_counts() {
        assert_eq!(Quorum::Majority.needed(0), 1);
        assert_eq!(Quorum::Majority.needed(1), 1);
        assert_eq!(Quorum::Majority.needed(2), 2);
        assert_eq!(Quorum::Majority.needed(3), 2);
        assert_eq!(Quorum::Majority.needed(4), 3);
        assert_eq!(Quorum::AtLeast(0).needed(5), 1);
        assert_eq!("majority".parse(), Ok(Quorum::Majority));
        assert_eq!("2".parse(), Ok(Quorum::AtLeast(2)));
        assert!("0".parse::<Quorum>().is_err());
        assert!("two".parse::<Quorum>().is_err());
    }

    #[test]
    fn a_lone_suspicion_does_not_convict_at_two_and_does_at_one() {
        let mut view = FleetView::default();
        for o in ["obs-a", "obs-b", "obs-c"] {
            alive(&mut view, o, 1000.0);
        }
        view.apply("71.obs-a", Some(&verdict(8.0, 900.0)), 950.0)
            .unwrap();
        assert_eq!(view.suspects(1500.0, AT8), vec![]);
        let one = Rule {
            quorum: Quorum::AtLeast(1),
            ..AT8
        };
        assert_eq!(
            view.suspects(1500.0, one),
            vec![FleetSuspect {
                id: 71,
                level: 8.0,
                observers: vec!["obs-a".into()],
                crossed_at: Some(900.0),
            }]
        );
        // A second observer, lower level: not at 8, but at 3 the quorum holds.
        view.apply("71.obs-b", Some(&verdict(3.0, 920.0)), 950.0)
            .unwrap();
        assert_eq!(view.suspects(1500.0, AT8), vec![]);
        let at3 = Rule { level: 3.0, ..AT8 };
        let s = view.suspects(1500.0, at3);
        assert_eq!(s.len(), 1);
        assert_eq!(s[0].level, 3.0, "the second-highest level is where 2 agree");
        assert_eq!(s[0].observers, vec!["obs-a", "obs-b"]);
        assert_eq!(s[0].crossed_at, Some(920.0));
    }

    #[test]
    fn stale_observers_stop_counting_after_the_bound() {
        let mut view = FleetView::default();
        alive(&mut view, "obs-a", 1000.0);
        alive(&mut view, "obs-b", 1000.0);
        alive(&mut view, "obs-c", 2000.0);
        for o in ["obs-a", "obs-b", "obs-c"] {
            view.apply(&Key::verdict(5, o), Some(&verdict(8.0, 0.0)), 0.0)
                .unwrap();
        }
        let three = Rule {
            quorum: Quorum::AtLeast(3),
            ..AT8
        };
        assert_eq!(view.suspects(1000.0 + LIVENESS_BOUND_MS, three).len(), 1);
        // a and b go stale just past the bound: their verdicts stop counting.
        assert_eq!(view.suspects(1000.1 + LIVENESS_BOUND_MS, three), vec![]);
        assert_eq!(view.live_count(1000.1 + LIVENESS_BOUND_MS), 1);
        // The majority of the one live observer is one.
        let majority = Rule {
            quorum: Quorum::Majority,
            ..AT8
        };
        let s = view.suspects(1000.1 + LIVENESS_BOUND_MS, majority);
        assert_eq!(s[0].observers, vec!["obs-c"]);
        // An observer with verdicts but no liveness record is never counted.
        view.apply("6.obs-z", Some(&verdict(8.0, 0.0)), 0.0)
            .unwrap();
        let one = Rule {
            quorum: Quorum::AtLeast(1),
            ..AT8
        };
        assert!(view.suspects(2500.0, one).iter().all(|s| s.id != 6));
        let p = view.peer(6, 2500.0);
        assert!(p.iter().any(|v| v.observer == "obs-z" && !v.live));
    }

    #[test]
    fn deletes_and_bad_values() {
        let mut view = FleetView::default();
        alive(&mut view, "a", 0.0);
        view.apply("9.a", Some(&verdict(8.0, 0.0)), 0.0).unwrap();
        assert_eq!(view.peers().collect::<Vec<_>>(), vec![9]);
        view.apply("9.a", None, 0.0).unwrap();
        assert_eq!(view.peers().count(), 0);
        view.apply("9.a", Some(&verdict(8.0, 0.0)), 0.0).unwrap();
        // Garbage replaces the verdict: it is an error, and the key holds no verdict now.
        assert!(view.apply("9.a", Some(b"{garbage"), 0.0).is_err());
        assert_eq!(view.peers().count(), 0);
        assert!(view.apply("nine.a", Some(&verdict(8.0, 0.0)), 0.0).is_err());
        assert!(view.apply("observers.a", Some(b"[1,2]"), 0.0).is_err());
        assert_eq!(view.live_count(0.0), 0);
    }

    #[test]
    fn convictions_report_changes_only() {
        let mut view = FleetView::default();
        alive(&mut view, "a", 0.0);
        alive(&mut view, "b", 0.0);
        let mut c = Convictions::default();
        view.apply("1.a", Some(&verdict(8.0, 0.0)), 0.0).unwrap();
        assert_eq!(c.update_peers(&view, [1], 10.0, AT8), vec![]);
        view.apply("1.b", Some(&verdict(8.0, 5.0)), 0.0).unwrap();
        let changes = c.update_peers(&view, [1], 10.0, AT8);
        assert!(matches!(&changes[..], [FleetChange::Down { suspect, at: 10 }] if suspect.id == 1));
        assert_eq!(c.update_all(&view, 20.0, AT8), vec![]);
        // Liveness runs out for both: up again, without any bucket change.
        assert_eq!(
            c.update_all(&view, 1.0 + LIVENESS_BOUND_MS, AT8),
            vec![FleetChange::Up {
                id: 1,
                at: 1 + LIVENESS_BOUND_MS as u64
            }]
        );
        assert_eq!(c.down().count(), 0);
        let json = serde_json::to_value(FleetChange::Down {
            suspect: FleetSuspect {
                id: 71,
                level: 8.0,
                observers: vec!["obs-b".into(), "obs-c".into()],
                crossed_at: None,
            },
            at: 5,
        })
        .unwrap();
        assert_eq!(
            json,
            serde_json::json!({"event":"down","id":71,"level":8.0,"observers":["obs-b","obs-c"],"at":5})
        );
    }
}
