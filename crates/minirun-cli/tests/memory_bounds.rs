//! Hostile metadata cannot exhaust memory: the program runs under `ulimit -v` at the bounds
//! `docs/formats/artifact.md` and `docs/formats/evidence.md` state, against the worst input
//! each bound allows, and must end with its refusal (or its result), never an allocation abort.

use std::fs;
use std::io::Write;
use std::path::Path;
use std::process::{Command, Output};

/// `minirun ARGS` with its address space limited to `kib` KiB.
fn minirun_within(kib: u64, args: &[&str]) -> Output {
    Command::new("sh")
        .arg("-c")
        .arg(format!("ulimit -v {kib} && exec \"$0\" \"$@\""))
        .arg(env!("CARGO_BIN_EXE_minirun"))
        .args(args)
        .env_remove("HF_ENDPOINT")
        .env_remove("HF_TOKEN")
        .output()
        .unwrap()
}

/// `minirun pack` of `dir/ck` into `dir/out` with its address space limited to `kib` KiB.
fn pack_within(kib: u64, dir: &Path) -> Output {
    let (source, out) = (dir.join("ck"), dir.join("out"));
    minirun_within(
        kib,
        &[
            "pack",
            "--source",
            source.to_str().unwrap(),
            "--out",
            out.to_str().unwrap(),
        ],
    )
}

fn stderr(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

/// A one-shard checkpoint whose header is `header` (the data is `data_len` zero bytes).
fn checkpoint(dir: &Path, header: &[u8], data_len: usize) {
    fs::create_dir_all(dir).unwrap();
    fs::write(dir.join("config.json"), r#"{"model_type":"deepseek_v3"}"#).unwrap();
    let mut shard = fs::File::create(dir.join("model.safetensors")).unwrap();
    shard
        .write_all(&(header.len() as u64).to_le_bytes())
        .unwrap();
    shard.write_all(header).unwrap();
    shard.write_all(&vec![0; data_len]).unwrap();
}

const HEADER_LIMIT: usize = 100_000_000;

/// One tensor whose shape lists as many dimensions as the largest header holds: parsed, each
/// `1,` became 8 bytes (3.2 GB of peak RSS for this file before the rank bound).
#[test]
fn a_shape_of_fifty_million_dimensions_is_refused_within_400_mb() {
    let dir = tempfile::tempdir().unwrap();
    let dims = (HEADER_LIMIT - 100) / 2;
    let mut header = String::with_capacity(HEADER_LIMIT);
    header.push_str(r#"{"a":{"dtype":"F32","shape":["#);
    header.push_str(&"1,".repeat(dims - 1));
    header.push_str(r#"1],"data_offsets":[0,4]}}"#);
    checkpoint(&dir.path().join("ck"), header.as_bytes(), 4);
    let out = pack_within(400 << 10, dir.path());
    assert_eq!(out.status.code(), Some(1), "{}", stderr(&out));
    assert!(
        stderr(&out).contains("more than 8 dimensions"),
        "{}",
        stderr(&out)
    );
}

/// The most tensors a shard may name, with names as long as the largest header lets them be:
/// the most `pack` keeps per header byte (about 860 MB of peak RSS for the 100 MB header).
#[test]
fn the_most_named_shard_packs_within_1200_mb() {
    let dir = tempfile::tempdir().unwrap();
    let count = 1 << 16;
    let name_len = HEADER_LIMIT / count - 70;
    let entries: Vec<String> = (0..count)
        .map(|i| {
            format!(
                r#""{i:x>name_len$}":{{"dtype":"U8","shape":[1],"data_offsets":[{i},{}]}}"#,
                i + 1
            )
        })
        .collect();
    let header = format!("{{{}}}", entries.join(","));
    assert!(header.len() <= HEADER_LIMIT && header.len() > HEADER_LIMIT * 9 / 10);
    checkpoint(&dir.path().join("ck"), header.as_bytes(), count);
    let out = pack_within(1200 << 10, dir.path());
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
}

/// A Hub that pages its tree forever, each page the largest answer allowed of the longest
/// paths allowed, each pointing to a new page by the longest link allowed.
fn endless_tree_server() -> String {
    let server = tiny_http::Server::http("127.0.0.1:0").unwrap();
    let base = format!("http://{}", server.server_addr().to_ip().unwrap());
    let origin = base.clone();
    std::thread::spawn(move || {
        let entries_per_page = (64 << 20) / 4200;
        for (page, request) in server.incoming_requests().enumerate() {
            let path = request
                .url()
                .split('?')
                .next()
                .unwrap_or_default()
                .to_string();
            let entries: Vec<String> = (0..entries_per_page)
                .map(|i| {
                    let name = format!("{page}-{i}");
                    format!(r#"{{"type":"directory","path":"{name:d>4096}"}}"#)
                })
                .collect();
            let link = format!(
                "<{origin}{path}?cursor={page}&pad={}>; rel=\"next\"",
                "p".repeat(7 << 10)
            );
            let response = tiny_http::Response::from_string(format!("[{}]", entries.join(",")))
                .with_header(tiny_http::Header::from_bytes("Link", link).unwrap());
            let _ = request.respond(response);
        }
    });
    base
}

/// Before the path bound, every page's 64 MiB of paths was kept three times over, page after
/// page, up to a million entries: gigabytes.
#[test]
fn an_endless_tree_of_long_paths_is_refused_within_600_mb() {
    let endpoint = endless_tree_server();
    let dir = tempfile::tempdir().unwrap();
    let out = minirun_within(
        600 << 10,
        &[
            "download",
            "--repo",
            "owner/model-minirun",
            "--revision",
            &"a".repeat(40),
            "--out",
            dir.path().join("a").to_str().unwrap(),
            "--endpoint",
            &endpoint,
        ],
    );
    assert_eq!(out.status.code(), Some(1), "{}", stderr(&out));
    assert!(
        stderr(&out).contains("paths add up to more than"),
        "{}",
        stderr(&out)
    );
}
