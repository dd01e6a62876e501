//! Whether output may carry escape codes. Colour and cursor movement are for a person at a
//! terminal: written to a file or a pipe they are noise in the text. Colour is also off when
//! `NO_COLOR` is set to anything but the empty string (https://no-color.org).

use std::ffi::OsStr;
use std::io::IsTerminal;

/// Whether coloured output is wanted, given whether it goes to a terminal and `NO_COLOR`.
pub fn colour(is_terminal: bool, no_color: Option<&OsStr>) -> bool {
    is_terminal && no_color.is_none_or(OsStr::is_empty)
}

/// Whether the log lines on stderr may be coloured.
pub fn stderr_colour() -> bool {
    colour(std::io::stderr().is_terminal(), std::env::var_os("NO_COLOR").as_deref())
}

/// Whether stdout is a terminal (where `volley top` may clear the screen).
pub fn stdout_is_terminal() -> bool {
    std::io::stdout().is_terminal()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn colour_only_on_a_terminal_and_without_no_color() {
        assert!(colour(true, None));
        assert!(colour(true, Some(OsStr::new(""))), "an empty NO_COLOR does not count");
        assert!(!colour(true, Some(OsStr::new("1"))));
        assert!(!colour(false, None));
        assert!(!colour(false, Some(OsStr::new("1"))));
    }
}
