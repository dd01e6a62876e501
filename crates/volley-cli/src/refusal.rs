//! One clear line for a refusal that retrying will not fix: the cause, and the flag that fixes
//! it. The CLI exits at once on such a refusal instead of retrying as if the network had failed.

use volley::Error;

/// `what` (a registry, a server) refused because of the token the connection presented.
fn token(what: &str, e: &Error, flag: &str, env: &str) -> String {
    format!("{what}: {e}; present its token with {flag} (or {env})")
}

/// The registry refused a registration for its credential.
fn credential(what: &str, e: &Error) -> String {
    format!(
        "{what}: {e}; present the registry's registration credential with --registration-credential \
         (or VOLLEY_REGISTRATION_CREDENTIAL)"
    )
}

/// Any other permanent refusal (a request the peer cannot accept, a bad address).
fn other(what: &str, e: &Error) -> String {
    format!("{what}: {e}; retrying will not help")
}

/// The line for a permanent failure while connecting to `what` (a token refused, a bad address).
pub fn connecting(what: &str, e: &Error, flag: &str, env: &str) -> String {
    match e {
        Error::Unauthenticated(_) => token(what, e, flag, env),
        _ => other(what, e),
    }
}

/// The line for a permanent failure while registering with `what`.
pub fn registering(what: &str, e: &Error) -> String {
    match e {
        Error::Unauthenticated(_) => credential(what, e),
        _ => other(what, e),
    }
}
