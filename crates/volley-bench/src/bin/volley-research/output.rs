//! Results on standard output, ending quietly when the reader goes away: `volley-research
//! codec --json | head -n 3` closes the pipe early, and `println!` would panic on the broken
//! pipe (Rust ignores SIGPIPE, so the write returns an error instead of ending the process).

use std::io::Write;

/// `println!` that exits 0 when stdout's reader has gone, and 1 on any other write error.
macro_rules! outln {
    ($($arg:tt)*) => { $crate::output::line(format_args!($($arg)*)) };
}

pub(crate) use outln;

/// Writes one line and flushes it (the idle benchmark's child reports `ready` through it).
pub fn line(args: std::fmt::Arguments) {
    let mut stdout = std::io::stdout().lock();
    match writeln!(stdout, "{args}").and_then(|()| stdout.flush()) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => std::process::exit(0),
        Err(e) => {
            eprintln!("volley-research: writing the output failed: {e}");
            std::process::exit(1);
        }
    }
}
