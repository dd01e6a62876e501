//! Misuse of `#[volley::service]` fails to compile with a message that says what to write,
//! at the offending tokens. Each case in `ui/` is a small program; its `.stderr` file is the
//! expected diagnostic. After a deliberate change of a message, regenerate them with
//! `TRYBUILD=overwrite cargo test -p volley-macros --test compile_fail` and review the diff.

#[test]
fn misuse_of_the_service_attribute_is_reported_clearly() {
    let t = trybuild::TestCases::new();
    t.compile_fail("tests/ui/*.rs");
}
