//! Follows the agent's suspicions and prints them, one line each, using the client library
//! (`monitor::serving::client`): the suspect set when it (re)connects or lagged, then every
//! suspicion and recovery as it comes.
//!
//! ```sh
//! cargo run -p monitor --example suspects -- /run/heartbeat-monitor.sock 3
//! ```
//!
//! Arguments: the agent's socket (default /run/heartbeat-monitor.sock) and the threshold of
//! the suspect set (default: the agent's highest level).

use std::{path::PathBuf, process::ExitCode, time::Duration};

use monitor::serving::{
    client::{ResyncReason, Subscriber, Update},
    event::Event,
};

fn main() -> ExitCode {
    let mut args = std::env::args().skip(1);
    let socket = PathBuf::from(
        args.next()
            .unwrap_or_else(|| monitor::DEFAULT_SOCKET.into()),
    );
    let mut subscriber =
        Subscriber::new(&socket).retry(Duration::from_millis(200), Duration::from_secs(5));
    if let Some(threshold) = args.next() {
        match threshold.parse::<f64>() {
            Ok(t) if t > 0.0 => subscriber = subscriber.threshold(t),
            _ => {
                eprintln!("suspects: the threshold must be a positive number, got {threshold}");
                return ExitCode::from(2);
            }
        }
    }
    for update in subscriber {
        match update {
            Ok(Update::Resync {
                reason, suspects, ..
            }) => {
                let why = match reason {
                    ResyncReason::Connected => "connected".to_string(),
                    ResyncReason::Reconnected => "reconnected".to_string(),
                    ResyncReason::Lagged { missed } => format!("lagged, {missed} events missed"),
                };
                println!("{why}: {} suspected", suspects.len());
                for peer in suspects {
                    println!(
                        "suspected {} phi {:.2} level {:?}",
                        peer.id, peer.phi, peer.level
                    );
                }
            }
            Ok(Update::Event(Event::Suspect(s))) => {
                println!("suspect {} level {} phi {:.2}", s.id, s.level, s.phi);
            }
            Ok(Update::Event(Event::Recover(r))) => {
                println!(
                    "recover {} from level {} after {:.0} ms",
                    r.id, r.level, r.silence_ms
                );
            }
            Ok(Update::Disconnected(why)) => eprintln!("not following: {why}"),
            Ok(_) => {}
            Err(e) => {
                eprintln!("suspects: {e}");
                return ExitCode::FAILURE;
            }
        }
    }
    ExitCode::SUCCESS
}
