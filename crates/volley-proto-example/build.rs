//! Generates the Rust types of proto/shop.proto with prost-build, and the file's descriptor
//! set (what reflection hands to tools). prost needs `protoc`; it comes from the
//! `protoc-bin-vendored` crate, so a fresh machine needs nothing but crates.io. A `PROTOC` set
//! in the environment wins.

fn main() {
    if std::env::var_os("PROTOC").is_none() {
        let protoc = protoc_bin_vendored::protoc_bin_path()
            .expect("protoc-bin-vendored has no protoc for this platform; set PROTOC");
        // SAFETY: build scripts are single-threaded; nothing else reads the environment now.
        unsafe { std::env::set_var("PROTOC", protoc) };
    }
    println!("cargo::rerun-if-changed=proto/shop.proto");
    println!("cargo::rerun-if-changed=build.rs");
    let out = std::path::PathBuf::from(std::env::var_os("OUT_DIR").expect("cargo sets OUT_DIR"));
    prost_build::Config::new()
        .file_descriptor_set_path(out.join("shop.descriptor.bin"))
        .enable_type_names()
        .compile_protos(&["proto/shop.proto"], &["proto"])
        .expect("compiling proto/shop.proto");
}
