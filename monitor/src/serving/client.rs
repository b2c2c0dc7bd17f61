//! A small blocking client for the agent's socket (used by `monitor query` and the tests).

use std::{
    io::{self, BufRead, BufReader, Write},
    os::unix::net::UnixStream,
    path::Path,
    time::Duration,
};

use serde_json::Value;

pub struct Client {
    reader: BufReader<UnixStream>,
    writer: UnixStream,
}

/// What went wrong, each cause said once: the message includes the underlying error, so
/// `source()` is empty and a chain printer (`{:#}` of anyhow) does not repeat it.
#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    #[error("connecting to the agent at {path}: {error}{}", connect_hint(.error))]
    Connect { path: String, error: io::Error },
    #[error("talking to the agent: {0}")]
    Io(io::Error),
    #[error("the agent closed the connection")]
    Closed,
    #[error("the agent sent a line that is not JSON: {0}")]
    BadReply(serde_json::Error),
}

impl From<io::Error> for ClientError {
    fn from(error: io::Error) -> Self {
        ClientError::Io(error)
    }
}

/// What to check when the socket cannot be reached.
fn connect_hint(error: &io::Error) -> &'static str {
    match error.kind() {
        io::ErrorKind::NotFound | io::ErrorKind::ConnectionRefused => {
            " (is `monitor run` running?)"
        }
        io::ErrorKind::PermissionDenied => {
            " (the socket serves root, the agent's user and its --socket-group)"
        }
        _ => "",
    }
}

impl Client {
    pub fn connect(path: &Path) -> Result<Self, ClientError> {
        let stream = UnixStream::connect(path).map_err(|error| ClientError::Connect {
            path: path.display().to_string(),
            error,
        })?;
        stream.set_read_timeout(Some(Duration::from_secs(10)))?;
        Ok(Self {
            reader: BufReader::new(stream.try_clone()?),
            writer: stream,
        })
    }

    /// Sends one raw line and returns the raw reply line (without the newline).
    pub fn request_line(&mut self, line: &str) -> Result<String, ClientError> {
        self.writer.write_all(line.as_bytes())?;
        self.writer.write_all(b"\n")?;
        self.read_line()
    }

    /// Reads one line (an event on a subscribed connection).
    pub fn read_line(&mut self) -> Result<String, ClientError> {
        let mut line = String::new();
        if self.reader.read_line(&mut line)? == 0 {
            return Err(ClientError::Closed);
        }
        Ok(line.trim_end().to_string())
    }

    /// Waits at most `timeout` for each reply or event (None: forever).
    pub fn set_read_timeout(&mut self, timeout: Option<Duration>) -> Result<(), ClientError> {
        self.writer.set_read_timeout(timeout)?;
        Ok(())
    }

    /// Sends a request and parses the reply as JSON (whether ok or not).
    pub fn request(&mut self, request: &Value) -> Result<Value, ClientError> {
        let line = self.request_line(&request.to_string())?;
        serde_json::from_str(&line).map_err(ClientError::BadReply)
    }
}
