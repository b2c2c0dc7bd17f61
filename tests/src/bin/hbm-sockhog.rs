//! Holds connections to an agent's socket, as a careless or hostile local user would, for the
//! socket-abuse tests (tests/tests/socket_abuse.rs); run it under the uid to attack as.
//!
//! `hbm-sockhog SOCKET IDLE SUBSCRIBERS`: opens IDLE connections that never send anything,
//! then SUBSCRIBERS connections that subscribe and never read an event, and reports on
//! standard output, one line each:
//! - `subscribers subscribed=N refused=N refusal=LINE` once every subscriber has its answer
//!   (accept is in order, so every idle connection before them has been dealt with too);
//! - `idle open=N refused=N closed=N refusal=LINE`: of the idle connections, those still open
//!   with nothing to read, those answered with an error line, those closed without one.
//!
//! Then holds every connection, reading nothing, until its standard input closes.

use std::{
    io::{BufRead, BufReader, Read, Write},
    os::unix::net::UnixStream,
    time::Duration,
};

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let [_, socket, idle, subscribers] = args.as_slice() else {
        eprintln!("usage: hbm-sockhog SOCKET IDLE SUBSCRIBERS");
        std::process::exit(2);
    };
    let idle: usize = idle.parse().expect("IDLE: a number");
    let subscribers: usize = subscribers.parse().expect("SUBSCRIBERS: a number");
    raise_fd_limit();

    let connect = || UnixStream::connect(socket).expect("connect to the agent's socket");
    let idle: Vec<UnixStream> = (0..idle).map(|_| connect()).collect();
    let mut subscribed = Vec::new();
    let (mut refused, mut refusal) = (0, String::new());
    for _ in 0..subscribers {
        let mut stream = connect();
        // A refused connection may be closed before the request is written (EPIPE); its
        // answer is still there to read.
        let _ = stream.write_all(b"{\"op\":\"subscribe\"}\n");
        stream
            .set_read_timeout(Some(Duration::from_secs(30)))
            .unwrap();
        let mut line = String::new();
        let _ = BufReader::new(&stream).read_line(&mut line);
        if line.contains("\"subscribed\":true") {
            subscribed.push(stream);
        } else {
            refused += 1;
            refusal = line.trim_end().to_string();
        }
    }
    println!(
        "subscribers subscribed={} refused={refused} refusal={refusal}",
        subscribed.len()
    );

    let (mut open, mut idle_refused, mut closed, mut idle_refusal) = (0, 0, 0, String::new());
    for mut stream in &idle {
        stream.set_nonblocking(true).unwrap();
        let mut buf = [0u8; 512];
        match stream.read(&mut buf) {
            Ok(0) => closed += 1,
            Ok(n) => {
                idle_refused += 1;
                idle_refusal = String::from_utf8_lossy(&buf[..n]).trim_end().to_string();
            }
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => open += 1,
            Err(_) => closed += 1,
        }
    }
    println!("idle open={open} refused={idle_refused} closed={closed} refusal={idle_refusal}");

    // Hold everything until told to go.
    let mut rest = Vec::new();
    let _ = std::io::stdin().read_to_end(&mut rest);
    drop((idle, subscribed));
}

/// As many descriptors as the hard limit allows: a thousand connections need more than the
/// usual 1024.
fn raise_fd_limit() {
    let mut limit = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: plain syscalls on a local struct.
    unsafe {
        if libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit) == 0 {
            limit.rlim_cur = limit.rlim_max;
            libc::setrlimit(libc::RLIMIT_NOFILE, &limit);
        }
    }
}
