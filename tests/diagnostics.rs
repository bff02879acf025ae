//! Compile errors that say what to do: a deadline reader that cannot read
//! the request names the feature to enable. Builds a small crate against
//! this one with `cargo check` (offline, on this repository's lock file,
//! without the `http` feature) and reads the error.

#![cfg(all(not(loom), not(miri), feature = "tower"))]

use std::path::Path;
use std::process::Command;

const MANIFEST: &str = r#"
[package]
name = "diagnostics-probe"
version = "0.0.0"
edition = "2024"
publish = false

[workspace]

[dependencies]
watertight = { path = "WATERTIGHT", default-features = false, features = ["tower"] }
http = "1"
tower-layer = "0.3"
tower-service = "0.3"
"#;

const MAIN: &str = r#"
use std::convert::Infallible;
use std::future::{Ready, ready};
use std::task::{Context, Poll};
use tower_layer::Layer;
use tower_service::Service;
use watertight::Bulkhead;
use watertight::tower::{BulkheadLayer, GrpcTimeout};

struct Inner;

impl Service<http::Request<()>> for Inner {
    type Response = ();
    type Error = Infallible;
    type Future = Ready<Result<(), Infallible>>;
    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        Poll::Ready(Ok(()))
    }
    fn call(&mut self, _: http::Request<()>) -> Self::Future {
        ready(Ok(()))
    }
}

// What a router's `route_layer` asks of the layered service.
fn route<S: Service<http::Request<()>>>(_: S) {}

fn main() {
    let bh = Bulkhead::builder().max_concurrent_calls(1).build().unwrap();
    route(BulkheadLayer::new(bh).deadline_from(GrpcTimeout).layer(Inner));
}
"#;

/// Without the `http` feature, `GrpcTimeout` cannot read an
/// `http::Request`: the error says which reader and which request, and
/// names the feature.
#[test]
fn a_deadline_reader_without_its_feature_names_the_feature() {
    let root = env!("CARGO_MANIFEST_DIR");
    let probe = Path::new(env!("CARGO_TARGET_TMPDIR")).join("diagnostics-probe");
    std::fs::create_dir_all(probe.join("src")).unwrap();
    std::fs::write(
        probe.join("Cargo.toml"),
        MANIFEST.replace("WATERTIGHT", &root.replace('\\', "/")),
    )
    .unwrap();
    std::fs::write(probe.join("src/main.rs"), MAIN).unwrap();
    // The repository's lock: the same versions, so nothing to fetch.
    std::fs::copy(Path::new(root).join("Cargo.lock"), probe.join("Cargo.lock")).unwrap();
    let out = Command::new(env!("CARGO"))
        .args(["check", "--offline", "--quiet", "--color", "never"])
        .current_dir(&probe)
        .env("CARGO_TARGET_DIR", probe.join("target"))
        .env_remove("RUSTFLAGS")
        .output()
        .expect("run cargo check on the probe");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "the probe compiled:\n{stderr}");
    for said in [
        "`GrpcTimeout` cannot read a deadline from a `http::Request<()>`",
        "need the `http` feature of watertight",
    ] {
        assert!(stderr.contains(said), "no {said:?} in:\n{stderr}");
    }
}
