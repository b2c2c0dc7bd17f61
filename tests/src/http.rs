//! Plain HTTP/1.0 GETs made from inside a network namespace (a thread that joins it with
//! setns), so tests reach servers bound to a namespace's loopback: the agent's metrics
//! endpoint, a Prometheus server started there; and anything else a test must do from inside
//! one (`in_netns`).

use std::{
    io::{Read, Write},
    net::TcpStream,
    time::Duration,
};

/// Status code and body of `GET path` from `host:port` inside namespace `ns`, with extra
/// request `headers`; an error if it cannot connect or the reply is not HTTP.
pub fn get_in(
    ns: &str,
    addr: &str,
    path: &str,
    headers: &[(&str, &str)],
) -> Result<(u16, String), String> {
    let (ns, addr, path) = (ns.to_string(), addr.to_string(), path.to_string());
    let headers: Vec<(String, String)> = headers
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    std::thread::spawn(move || {
        enter(&ns)?;
        let mut stream = TcpStream::connect(&addr).map_err(|e| format!("connect {addr}: {e}"))?;
        stream
            .set_read_timeout(Some(Duration::from_secs(10)))
            .map_err(|e| e.to_string())?;
        let mut request = format!("GET {path} HTTP/1.0\r\nHost: {addr}\r\n");
        for (k, v) in &headers {
            request.push_str(&format!("{k}: {v}\r\n"));
        }
        request.push_str("\r\n");
        stream
            .write_all(request.as_bytes())
            .map_err(|e| e.to_string())?;
        let mut reply = Vec::new();
        stream
            .read_to_end(&mut reply)
            .map_err(|e| format!("reading from {addr}: {e}"))?;
        let reply = String::from_utf8_lossy(&reply).into_owned();
        let (head, body) = reply
            .split_once("\r\n\r\n")
            .ok_or_else(|| format!("not an HTTP reply: {reply:?}"))?;
        let status = head
            .split_whitespace()
            .nth(1)
            .and_then(|s| s.parse().ok())
            .ok_or_else(|| format!("no status in {head:?}"))?;
        Ok((status, body.to_string()))
    })
    .join()
    .map_err(|_| "the request thread panicked".to_string())?
}

/// Runs `f` on a thread of its own inside namespace `ns`.
pub fn in_netns<T: Send + 'static>(
    ns: &str,
    f: impl FnOnce() -> T + Send + 'static,
) -> Result<T, String> {
    let ns = ns.to_string();
    std::thread::spawn(move || {
        enter(&ns)?;
        Ok(f())
    })
    .join()
    .map_err(|_| "the thread in the namespace panicked".to_string())?
}

/// Moves the calling thread into namespace `ns` (only this thread: setns is per thread).
fn enter(ns: &str) -> Result<(), String> {
    use std::os::fd::AsRawFd;
    let file = std::fs::File::open(format!("/var/run/netns/{ns}"))
        .map_err(|e| format!("opening namespace {ns}: {e}"))?;
    // SAFETY: a valid fd of a network namespace; CLONE_NEWNET joins only the network one.
    if unsafe { libc::setns(file.as_raw_fd(), libc::CLONE_NEWNET) } != 0 {
        return Err(format!("setns {ns}: {}", std::io::Error::last_os_error()));
    }
    Ok(())
}
