//! Generates the tonic (gRPC) echo service from Rust definitions with `tonic_build::manual`:
//! the messages are hand-written `prost::Message` types (src/tonic_echo.rs), so there is no
//! .proto file and no protoc at build time. The generated client and server are exactly what
//! tonic generates from a .proto (same `tonic::client::Grpc` / `tonic::server::Grpc` code).

fn main() {
    let method = |name: &str, route: &str| {
        tonic_build::manual::Method::builder()
            .name(name)
            .route_name(route)
            .input_type("crate::tonic_echo::EchoMsg")
            .output_type("crate::tonic_echo::EchoMsg")
            .codec_path("tonic_prost::ProstCodec")
    };
    let service = tonic_build::manual::Service::builder()
        .name("Echo")
        .package("volley.bench")
        // rpc Echo(EchoMsg) returns (EchoMsg)
        .method(method("echo", "Echo").build())
        // rpc EchoStream(stream EchoMsg) returns (stream EchoMsg): gRPC's own way to send many
        // small messages, measured against Volley's batch API alongside concurrent unary calls.
        .method(method("echo_stream", "EchoStream").client_streaming().server_streaming().build())
        // rpc Items(ItemsReq) returns (stream EchoMsg): server streaming, `count` items of
        // `size` bytes, against Volley's server streams.
        .method(
            tonic_build::manual::Method::builder()
                .name("items")
                .route_name("Items")
                .input_type("crate::tonic_echo::ItemsReq")
                .output_type("crate::tonic_echo::EchoMsg")
                .codec_path("tonic_prost::ProstCodec")
                .server_streaming()
                .build(),
        )
        .build();
    tonic_build::manual::Builder::new().compile(&[service]);
    println!("cargo::rerun-if-changed=build.rs");
}
