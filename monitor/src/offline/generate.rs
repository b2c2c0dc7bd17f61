//! Example traces for replay: generated paths with known shapes, reproducible from a seed.

use super::trace::{Arrival, format_trace};

/// Kinds of example traces `--generate` writes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum TraceKind {
    /// 100 ms heartbeats, 2 ms of Gaussian jitter.
    Lan,
    /// 100 ms heartbeats over a path with 40 ms base delay, exponential extra delay (mean
    /// 15 ms), delay spikes and 0.5% loss.
    Wan,
    /// LAN heartbeats from a sender that stops the world for 0.8-2 s every 20-40 s.
    GcPause,
    /// LAN heartbeats from a sender that restarts once (a 3 s gap, a new incarnation) 100
    /// heartbeats before it crashes.
    Restart,
    /// LAN heartbeats over a path with Gilbert-Elliott loss: a good state losing 0.1%, a bad
    /// state losing 40%; bursts of 10 heartbeats on average, one in every 100 or so.
    Bursty,
    /// 100 ms heartbeats over a path whose jitter switches between 2 ms and 40 ms every 500.
    JitterChange,
    /// 100 ms heartbeats with long-tailed (Pareto, shape 1.5) queueing delays.
    Pareto,
    /// LAN heartbeats from a sender that, halfway, slows to one every 250 ms for good (a new
    /// normal, as after a configuration change or a slower host): not an outage.
    Slowdown,
    /// LAN heartbeats from a sender whose clock stepped back an hour while it was down: it
    /// restarts (a 3 s gap, sequence numbers from 1 again) with an incarnation, its start
    /// time in Unix seconds, an hour below the one before; 100 heartbeats, then the crash.
    ClockStep,
    /// LAN heartbeats over a path that, halfway, starts to lose 20% of them, independently
    /// and for good, in the sender-to-monitor direction only: one-way heartbeats never use the
    /// other direction, so the peer stays alive and reachable (a gossip peer would still hear
    /// the monitor's host); the monitor sees a sudden, steady, independent loss.
    AsymmetricLoss,
    /// 100 ms heartbeats of one of many peers behind one rate-limited link (their heartbeats a
    /// quarter of it), with bursts of cross traffic at twice its rate (1-4 s, 2-8 s apart): a
    /// shared FIFO queue that grows 1.25 s a second in a burst, drains 0.75 s a second after,
    /// holds at most 200 ms, and drops 2% of the heartbeats that come while it is full.
    CongestedLink,
}

/// The sequence-numbered kinds: each heartbeat keeps the number it was sent with, in arrival
/// order, so replay sees loss and reordering as the kernel would.
fn sequenced(
    header: &str,
    count: usize,
    seed: u64,
    mut arrival: impl FnMut(usize) -> Option<(f64, u32)>,
) -> String {
    let arrivals = in_arrival_order(
        (0..count).filter_map(|k| arrival(k).map(|(at_ms, inc)| (at_ms, k as u64 + 1, inc))),
    );
    format_trace(
        &format!(
            "{header}\n{} heartbeats sent, {} arrived, seed {seed}; the sender crashes after the last",
            count,
            arrivals.len()
        ),
        &arrivals,
    )
}

/// Heartbeats given as (arrival ms, sequence, incarnation), in the order they arrive.
fn in_arrival_order(sent: impl IntoIterator<Item = (f64, u64, u32)>) -> Vec<Arrival> {
    let mut arrivals: Vec<Arrival> = sent
        .into_iter()
        .map(|(at_ms, seq, incarnation)| Arrival {
            at_ns: (at_ms.max(0.0) * 1e6).round() as u64,
            seq,
            incarnation,
        })
        .collect();
    arrivals.sort_by_key(|a| a.at_ns);
    arrivals
}

/// The share of heartbeats `AsymmetricLoss` loses from its middle on.
const ASYMMETRIC_LOSS: f64 = 0.20;

/// `CongestedLink`: the queue's cap (ms), how fast it grows in a burst and drains after (ms
/// of delay per ms: (2 + 1/4 - 1) and (1/4 - 1) of the link's rate), and the share of
/// heartbeats dropped while it is full (small frames mostly find room where the cross
/// traffic's full-size ones do not).
const QUEUE_CAP_MS: f64 = 200.0;
const QUEUE_GROWTH: f64 = 1.25;
const QUEUE_DRAIN: f64 = 0.75;
const QUEUE_FULL_LOSS: f64 = 0.02;

/// The queueing delay of a link shared with bursts of cross traffic, read at increasing times.
struct SharedQueue {
    /// Time (ms) the delay was last computed at, and that delay.
    at: f64,
    delay: f64,
    /// The current phase: a burst until `until`, or calm until then.
    burst: bool,
    until: f64,
}

impl SharedQueue {
    fn new(rng: &mut fastrand::Rng) -> Self {
        Self {
            at: 0.0,
            delay: 0.0,
            burst: false,
            until: 2_000.0 + 6_000.0 * rng.f64(),
        }
    }

    /// The delay a heartbeat sent at `t` (ms, not before the last call) meets, and whether
    /// the queue is full then.
    fn delay_at(&mut self, t: f64, rng: &mut fastrand::Rng) -> (f64, bool) {
        while self.at < t {
            let step = self.until.min(t) - self.at;
            self.delay = if self.burst {
                (self.delay + QUEUE_GROWTH * step).min(QUEUE_CAP_MS)
            } else {
                (self.delay - QUEUE_DRAIN * step).max(0.0)
            };
            self.at += step;
            if self.at >= self.until {
                self.burst = !self.burst;
                self.until += if self.burst {
                    1_000.0 * rng.u64(1..=4) as f64
                } else {
                    2_000.0 + 6_000.0 * rng.f64()
                };
            }
        }
        (self.delay, self.delay >= QUEUE_CAP_MS)
    }
}

/// Writes an example trace of `count` heartbeats (as text, with a comment header).
pub fn generate(kind: TraceKind, count: usize, seed: u64) -> String {
    let mut rng = fastrand::Rng::with_seed(seed);
    let gaussian = |rng: &mut fastrand::Rng| {
        // Box-Muller.
        let (u1, u2) = (rng.f64().max(f64::MIN_POSITIVE), rng.f64());
        (-2.0 * u1.ln()).sqrt() * (2.0 * std::f64::consts::PI * u2).cos()
    };
    let interval = 100.0;
    match kind {
        TraceKind::AsymmetricLoss => {
            let half = count / 2;
            return sequenced(
                "Asymmetric loss: 100 ms heartbeats, N(0, 2 ms) jitter; from the middle of the \
                 trace on, 20% of them lost, independently, sender to monitor only",
                count,
                seed,
                |k| {
                    let at = interval * (k + 1) as f64 + 2.0 * gaussian(&mut rng);
                    let lost = k >= half && rng.f64() < ASYMMETRIC_LOSS;
                    (!lost).then_some((at, 1))
                },
            );
        }
        TraceKind::CongestedLink => {
            let mut link = SharedQueue::new(&mut rng);
            return sequenced(
                "Congested link: 100 ms heartbeats, N(0, 2 ms) jitter, behind a shared FIFO \
                 queue (heartbeats a quarter of the link; bursts of cross traffic at twice its \
                 rate, 1-4 s long, 2-8 s apart; at most 200 ms; 2% of heartbeats dropped while \
                 full)",
                count,
                seed,
                |k| {
                    let sent = interval * (k + 1) as f64 + 2.0 * gaussian(&mut rng);
                    let (delay, full) = link.delay_at(sent, &mut rng);
                    let dropped = full && rng.f64() < QUEUE_FULL_LOSS;
                    (!dropped).then_some((sent + delay, 1))
                },
            );
        }
        TraceKind::Slowdown => {
            let slow = 250.0;
            let half = count / 2;
            return sequenced(
                "Slowdown: heartbeats every 100 ms with N(0, 2 ms) jitter, then every 250 ms for \
                 good from the middle of the trace",
                count,
                seed,
                |k| {
                    let on_schedule = if k < half {
                        interval * (k + 1) as f64
                    } else {
                        interval * half as f64 + slow * (k + 1 - half) as f64
                    };
                    Some((on_schedule + 2.0 * gaussian(&mut rng), 1))
                },
            );
        }
        TraceKind::ClockStep => {
            // Incarnations as `monitor send` makes them: the sender's start, in Unix seconds.
            let first = 1_780_000_000u32;
            let mut arrivals = Vec::with_capacity(count + 100);
            for k in 0..count {
                let at = interval * (k + 1) as f64 + 2.0 * gaussian(&mut rng);
                arrivals.push((at, k as u64 + 1, first));
            }
            let restart_at = interval * count as f64 + 3000.0;
            // Started (count x 100 ms + 3 s) after the first incarnation, by a clock an hour
            // behind.
            let second = first + (restart_at / 1000.0) as u32 - 3600;
            for k in 0..100 {
                let at = restart_at + interval * k as f64 + 2.0 * gaussian(&mut rng);
                arrivals.push((at, k as u64 + 1, second));
            }
            return format_trace(
                &format!(
                    "Clock step: 100 ms heartbeats, N(0, 2 ms) jitter; {count} heartbeats, a 3 s \
                     restart whose incarnation ({second}) is an hour below the first ({first}), \
                     100 more, then the crash; seed {seed}"
                ),
                &in_arrival_order(arrivals),
            );
        }
        TraceKind::Restart => {
            // Sent at 100 ms; the first incarnation stops after `count`, the second starts 3 s
            // later with sequence numbers from 1 again and sends 100 before the crash.
            let mut arrivals = Vec::with_capacity(count + 100);
            for k in 0..count {
                let at = interval * (k + 1) as f64 + 2.0 * gaussian(&mut rng);
                arrivals.push((at, k as u64 + 1, 1));
            }
            let restart_at = interval * count as f64 + 3000.0;
            for k in 0..100 {
                let at = restart_at + interval * k as f64 + 2.0 * gaussian(&mut rng);
                arrivals.push((at, k as u64 + 1, 2));
            }
            return format_trace(
                &format!(
                    "Restart: 100 ms heartbeats, N(0, 2 ms) jitter; {count} heartbeats, a 3 s restart \
                     (new incarnation), 100 more, then the crash; seed {seed}"
                ),
                &in_arrival_order(arrivals),
            );
        }
        TraceKind::Bursty => {
            let mut bad = false;
            return sequenced(
                "Bursty loss: 100 ms heartbeats, N(0, 2 ms) jitter, Gilbert-Elliott loss \
                 (good: 0.1% loss, to bad 1%; bad: 40% loss, to good 10%)",
                count,
                seed,
                |k| {
                    bad = if bad {
                        rng.f64() >= 0.10
                    } else {
                        rng.f64() < 0.01
                    };
                    let loss = if bad { 0.40 } else { 0.001 };
                    let at = interval * (k + 1) as f64 + 2.0 * gaussian(&mut rng);
                    (rng.f64() >= loss).then_some((at, 1))
                },
            );
        }
        TraceKind::JitterChange => {
            return sequenced(
                "Jitter change: 100 ms heartbeats, 20 ms base delay plus |N(0, s)| with s \
                 switching between 2 ms and 40 ms every 500 heartbeats",
                count,
                seed,
                |k| {
                    let s = if (k / 500) % 2 == 0 { 2.0 } else { 40.0 };
                    let at = interval * (k + 1) as f64 + 20.0 + (s * gaussian(&mut rng)).abs();
                    Some((at, 1))
                },
            );
        }
        TraceKind::Pareto => {
            return sequenced(
                "Pareto: 100 ms heartbeats, 10 ms base delay plus Pareto queueing delay \
                 (scale 5 ms, shape 1.5: mean 15 ms, infinite variance)",
                count,
                seed,
                |k| {
                    let u = 1.0 - rng.f64(); // (0, 1]
                    let delay = 10.0 + 5.0 * u.powf(-1.0 / 1.5) - 5.0;
                    Some((interval * (k + 1) as f64 + delay, 1))
                },
            );
        }
        TraceKind::Lan | TraceKind::Wan | TraceKind::GcPause => {}
    }
    // The first three kinds keep the times-only format and their exact output, so the tables
    // made from them before sequence numbers existed still reproduce.
    let mut times: Vec<f64> = Vec::with_capacity(count);
    let header = match kind {
        TraceKind::Lan => {
            for k in 0..count {
                times.push(interval * (k + 1) as f64 + 2.0 * gaussian(&mut rng));
            }
            "LAN: 100 ms heartbeats, N(0, 2 ms) jitter"
        }
        TraceKind::Wan => {
            for k in 0..count {
                if rng.f64() < 0.005 {
                    continue;
                }
                let mut delay = 40.0 - 15.0 * (1.0 - rng.f64()).ln();
                if rng.f64() < 0.01 {
                    delay += 200.0 + 400.0 * rng.f64();
                }
                times.push(interval * (k + 1) as f64 + delay);
            }
            "WAN: 100 ms heartbeats, 40 ms + Exp(15 ms) delay, 1% spikes of 200-600 ms, 0.5% loss"
        }
        TraceKind::GcPause => {
            let mut t = 0.0;
            let mut next_pause = 20_000.0 + 20_000.0 * rng.f64();
            while times.len() < count {
                t += interval;
                if t >= next_pause {
                    // The sender is frozen: nothing is sent until the pause ends.
                    t += 800.0 + 1200.0 * rng.f64();
                    next_pause = t + 20_000.0 + 20_000.0 * rng.f64();
                }
                times.push(t + 2.0 * gaussian(&mut rng));
            }
            "GC pauses: 100 ms heartbeats, N(0, 2 ms) jitter, a 0.8-2 s stop every 20-40 s"
        }
        _ => unreachable!("returned above"),
    };
    times.sort_by(f64::total_cmp);
    let mut out = format!(
        "# {header}\n# {} heartbeats, seed {seed}; arrival times in ms; the sender crashes after the last\n",
        times.len()
    );
    for t in times {
        out.push_str(&format!("{:.3}\n", t.max(0.0)));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::offline::trace::parse_trace;

    #[test]
    fn generated_traces_parse_and_are_reproducible() {
        for kind in [
            TraceKind::Lan,
            TraceKind::Wan,
            TraceKind::GcPause,
            TraceKind::Restart,
            TraceKind::Bursty,
            TraceKind::JitterChange,
            TraceKind::Pareto,
            TraceKind::Slowdown,
            TraceKind::ClockStep,
            TraceKind::AsymmetricLoss,
            TraceKind::CongestedLink,
        ] {
            let a = generate(kind, 500, 7);
            assert_eq!(a, generate(kind, 500, 7));
            let times = parse_trace(&a).unwrap();
            assert!(times.len() >= 300, "{kind:?}: {}", times.len());
        }
    }
}
