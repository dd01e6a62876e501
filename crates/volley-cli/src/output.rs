//! Standard output that ends quietly when its reader goes away.
//!
//! `volley ls --registry … | head -n 1` closes the pipe after one line; the rest of the output
//! has nowhere to go, and writing it fails with a broken pipe. `println!` panics then (Rust
//! ignores SIGPIPE, so the write returns the error); [`outln!`] and [`out!`] take it as the end
//! of the output and exit 0 at once. Any other write error ends the process with a message and
//! status 1.

use std::io::Write;

/// `println!` for the CLI's results: see the module documentation.
macro_rules! outln {
    ($($arg:tt)*) => { $crate::output::write(format_args!("{}\n", format_args!($($arg)*))) };
}

/// `print!` for the CLI's results: see the module documentation.
macro_rules! out {
    ($($arg:tt)*) => { $crate::output::write(format_args!($($arg)*)) };
}

pub(crate) use {out, outln};

/// Writes to stdout and flushes; a closed stdout ends the process.
pub fn write(args: std::fmt::Arguments) {
    let mut stdout = std::io::stdout().lock();
    if let Err(e) = stdout.write_fmt(args).and_then(|()| stdout.flush()) {
        closed(e);
    }
}

fn closed(e: std::io::Error) -> ! {
    if e.kind() == std::io::ErrorKind::BrokenPipe {
        std::process::exit(0);
    }
    eprintln!("volley: writing the output failed: {e}");
    std::process::exit(1);
}
