//! Closed pipes: `observer ... | head` and `observer ... 2>&1 | head`.
//!
//! A reader that goes away ends a command quietly with exit status 0,
//! whichever of stdout and stderr it was reading. SIGPIPE stays ignored
//! (Rust's default), so a write to a closed pipe fails with EPIPE:
//!
//! - on stdout, the command stops: the error travels up like any other and
//!   `main` maps it with [`is_broken_pipe`] to exit status 0, printing
//!   nothing;
//! - on stderr (the log and error messages), the write is dropped
//!   ([`Stderr`], [`eprintln`]): `eprintln!` would panic (exit 101), and
//!   there is nowhere left to say anything anyway.

use std::{
    fmt,
    io::{self, Write},
};

/// True when `error` comes from writing to a closed pipe (EPIPE), also
/// when an I/O error wraps another (`io::Error::other(serde_json::Error)`
/// of a JSON line written to a closed stdout).
pub fn is_broken_pipe(error: &anyhow::Error) -> bool {
    error.chain().any(is_broken_pipe_cause)
}

fn is_broken_pipe_cause(cause: &(dyn std::error::Error + 'static)) -> bool {
    if let Some(e) = cause.downcast_ref::<io::Error>() {
        // `source()` of an `io::Error` skips the error it wraps: look inside.
        return e.kind() == io::ErrorKind::BrokenPipe
            || e.get_ref().is_some_and(|inner| is_broken_pipe_cause(inner));
    }
    if let Some(e) = cause.downcast_ref::<serde_json::Error>() {
        return e.io_error_kind() == Some(io::ErrorKind::BrokenPipe);
    }
    false
}

/// Stderr for the log (`tracing_subscriber`'s writer) and error messages:
/// a failed write is dropped instead of reported. Where would it be
/// reported? tracing-subscriber would `eprintln!` it, which panics on a
/// closed stderr.
#[derive(Debug, Clone, Copy, Default)]
pub struct Stderr;

/// [`Stderr`], as a `tracing_subscriber` writer: `.with_writer(pipe::stderr)`.
pub fn stderr() -> Stderr {
    Stderr
}

impl Write for Stderr {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        // Reported as written: a closed stderr must not fail the write
        // (or `write_all` would retry or report it).
        Ok(io::stderr().write(buf).unwrap_or(buf.len()))
    }

    fn write_all(&mut self, buf: &[u8]) -> io::Result<()> {
        // One locked write per message, so that lines of the log and of
        // the error messages do not interleave.
        let _ = io::stderr().lock().write_all(buf);
        Ok(())
    }

    fn flush(&mut self) -> io::Result<()> {
        let _ = io::stderr().flush();
        Ok(())
    }
}

/// `eprintln!` that never panics: writes `message` and a newline to
/// stderr, dropping it when stderr is closed.
pub fn eprintln(message: fmt::Arguments<'_>) {
    // Formatted first: one write, so lines do not interleave.
    let _ = Stderr.write_all(format!("{message}\n").as_bytes());
}

#[cfg(test)]
mod tests {
    use super::*;
    use anyhow::Context as _;

    fn epipe() -> io::Error {
        io::Error::from_raw_os_error(libc::EPIPE)
    }

    #[test]
    fn broken_pipe_is_found_through_context_and_wrapping() {
        let plain = anyhow::Error::from(epipe());
        assert!(is_broken_pipe(&plain));
        let with_context = Err::<(), _>(epipe()).context("writing output").unwrap_err();
        assert!(is_broken_pipe(&with_context));
        // report::write_line wraps serde_json's error in io::Error::other.
        let json = serde_json::to_writer(
            &mut WriterOf(io::ErrorKind::BrokenPipe),
            &serde_json::json!({"a": 1}),
        )
        .unwrap_err();
        let wrapped = Err::<(), _>(io::Error::other(json))
            .context("writing output")
            .unwrap_err();
        assert!(is_broken_pipe(&wrapped));
    }

    #[test]
    fn other_errors_are_not_broken_pipes() {
        assert!(!is_broken_pipe(&anyhow::anyhow!("broken pipe")));
        let denied = Err::<(), _>(io::Error::from(io::ErrorKind::PermissionDenied))
            .context("writing output")
            .unwrap_err();
        assert!(!is_broken_pipe(&denied));
        let json = serde_json::to_writer(
            &mut WriterOf(io::ErrorKind::StorageFull),
            &serde_json::json!({"a": 1}),
        )
        .unwrap_err();
        assert!(!is_broken_pipe(&io::Error::other(json).into()));
    }

    /// A writer whose every write fails with `kind`.
    struct WriterOf(io::ErrorKind);

    impl Write for WriterOf {
        fn write(&mut self, _: &[u8]) -> io::Result<usize> {
            Err(self.0.into())
        }

        fn flush(&mut self) -> io::Result<()> {
            Ok(())
        }
    }
}
