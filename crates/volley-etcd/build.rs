//! Generates the etcd v3 gRPC client from proto/etcd.proto (a trimmed copy of etcd's
//! `rpc.proto` and `kv.proto`). prost needs `protoc`; it comes from the `protoc-bin-vendored`
//! crate, so a fresh machine needs nothing but crates.io. A `PROTOC` set in the environment
//! wins (distributions that forbid vendored binaries).

fn main() {
    if std::env::var_os("PROTOC").is_none() {
        let protoc = protoc_bin_vendored::protoc_bin_path()
            .expect("protoc-bin-vendored has no protoc for this platform; set PROTOC");
        // SAFETY: build scripts are single-threaded; nothing else reads the environment now.
        unsafe { std::env::set_var("PROTOC", protoc) };
    }
    println!("cargo::rerun-if-changed=proto/etcd.proto");
    println!("cargo::rerun-if-changed=build.rs");
    tonic_prost_build::configure()
        .build_server(false)
        .compile_protos(&["proto/etcd.proto"], &["proto"])
        .expect("compiling proto/etcd.proto");
}
