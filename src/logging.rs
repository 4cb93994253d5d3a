//! The daemon's logging, which never blocks a request or the flusher and never takes the
//! daemon down: lines go through a bounded queue to a writer thread (tracing-appender's
//! lossy non-blocking writer), which drops them when the log cannot keep up (a full disk, a
//! pipe nobody reads) and counts them; a failed write (a closed pipe) is swallowed, not
//! reported by a panic. `SHARDFS_LOG` sets the filter.

use std::io::{self, Write};
use std::sync::OnceLock;

use tracing_appender::non_blocking::{ErrorCounter, NonBlockingBuilder, WorkerGuard};

static DROPPED: OnceLock<ErrorCounter> = OnceLock::new();

/// Lines that can wait for the writer before new ones are dropped.
const QUEUE_LINES: usize = 64 * 1024;

/// Starts logging to stderr (the log file, for a background daemon). Keep the guard while
/// the process runs: dropping it writes out what is queued.
pub fn init() -> WorkerGuard {
    let filter = tracing_subscriber::EnvFilter::try_from_env("SHARDFS_LOG")
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info,fuser=error"));
    // The writer thread must not take the daemon's signals (SIGTERM's default would end
    // the process there): it starts with every signal blocked, as the daemon's own
    // threads do.
    let (writer, guard) = with_signals_blocked(|| {
        NonBlockingBuilder::default()
            .lossy(true)
            .buffered_lines_limit(QUEUE_LINES)
            .thread_name("shardfs-log")
            .finish(Quiet(io::stderr()))
    });
    let _ = DROPPED.set(writer.error_counter());
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(writer)
        .with_ansi(false)
        .try_init();
    guard
}

fn with_signals_blocked<T>(f: impl FnOnce() -> T) -> T {
    // SAFETY: sigfillset fills the set it is given; pthread_sigmask swaps this thread's
    // mask and is restored below.
    unsafe {
        let mut all: libc::sigset_t = std::mem::zeroed();
        let mut old: libc::sigset_t = std::mem::zeroed();
        libc::sigfillset(&mut all);
        libc::pthread_sigmask(libc::SIG_BLOCK, &all, &mut old);
        let out = f();
        libc::pthread_sigmask(libc::SIG_SETMASK, &old, std::ptr::null_mut());
        out
    }
}

/// Log lines dropped so far because the log could not keep up.
pub fn dropped() -> u64 {
    DROPPED.get().map_or(0, |c| c.dropped_lines() as u64)
}

/// A writer whose failures are nobody's: a log that cannot be written must not fail (or
/// panic) whoever logs.
struct Quiet<W>(W);

impl<W: Write> Write for Quiet<W> {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        let _ = self.0.write_all(buf);
        Ok(buf.len())
    }

    fn flush(&mut self) -> io::Result<()> {
        let _ = self.0.flush();
        Ok(())
    }
}
