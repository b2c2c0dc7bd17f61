//! The XDP program's own log lines (aya-log, `monitor run --kernel-log warn|debug`), read from
//! its ring buffer and handed to the agent's logger under the target `kernel`, so they appear
//! beside the agent's lines whatever RUST_LOG filters for the agent itself.

use std::os::fd::BorrowedFd;

use aya::Ebpf;
use aya_log::EbpfLogger;
use log::{Log, Metadata, Record};
use tokio::io::{Interest, unix::AsyncFd};

/// Re-logs each kernel record with target `kernel`.
pub struct Forward;

impl Log for Forward {
    fn enabled(&self, _: &Metadata) -> bool {
        // The kernel only writes the levels it was loaded with; the agent's logger filters.
        true
    }

    fn log(&self, record: &Record) {
        log::logger().log(
            &Record::builder()
                .args(*record.args())
                .level(record.level())
                .target("kernel")
                .build(),
        );
    }

    fn flush(&self) {}
}

pub type KernelLogger = EbpfLogger<Forward>;

#[derive(Debug, thiserror::Error)]
pub enum KernelLogError {
    #[error("reading the XDP program's log ring: {0}")]
    Logger(#[from] aya_log::Error),
    #[error("identifying the adopted program: {0}")]
    Program(#[from] std::io::Error),
}

/// The log ring of a program just loaded.
pub fn of_loaded(ebpf: &mut Ebpf) -> Result<KernelLogger, KernelLogError> {
    Ok(EbpfLogger::init_with_logger(ebpf, Forward)?)
}

/// The log ring of an adopted (pinned) program, found through the program's own maps.
pub fn of_adopted(program_fd: BorrowedFd<'_>) -> Result<KernelLogger, KernelLogError> {
    let id = crate::kernel::program::run_stats(program_fd)?.id;
    Ok(EbpfLogger::init_from_id_with_logger(id, Forward)?)
}

/// Forwards every record as it arrives, forever (until reading fails).
pub async fn forward(logger: KernelLogger) -> std::io::Result<()> {
    // SAFETY: the logger owns its ring's fd and keeps it open, unchanged, for as long as the
    // AsyncFd owns the logger.
    let mut fd = unsafe { AsyncFd::register_with_interest(logger, Interest::READABLE) }
        .map_err(std::io::Error::from)?;
    loop {
        let mut guard = fd.readable_mut().await?;
        guard.get_inner_mut().flush();
        guard.clear_ready();
    }
}
