//! The status page: one HTML file with its script and styles inline, compiled into the binary
//! (no CDN, no other request than `/vars.json`, which it polls once a second).

pub(super) const HTML: &str = include_str!("status.html");
