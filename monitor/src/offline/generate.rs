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
        ] {
            let a = generate(kind, 500, 7);
            assert_eq!(a, generate(kind, 500, 7));
            let times = parse_trace(&a).unwrap();
            assert!(times.len() >= 300, "{kind:?}: {}", times.len());
        }
    }
}
