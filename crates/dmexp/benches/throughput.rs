//! `cargo bench -p dmexp`: bf16 encode and decode of ~256 MB of f32 weights, side by side
//! with a plain memcpy of the same 256 MB measured in the same run.
//!
//! Throughput is counted in f32 bytes (the model in memory) for every row, so the ratios
//! compare like with like:
//! - memcpy: copy the 256 MB into a buffer that already exists (the goals' reference);
//! - memcpy to fresh memory: the same copy into a new allocation, which pays the kernel's
//!   first-touch page faults that any new tensor pays;
//! - decode into existing buffers: validate + CRC-32 of the 128 MB payload + widen + check
//!   the statistics, into tensors a loader has already allocated ([`dmexp::view`]);
//! - decode to new tensors: [`dmexp::decode`], which allocates every tensor;
//! - write payload to tmpfs: `write` of the 128 MB bf16 payload to a new file in /dev/shm,
//!   the floor under any encoder that writes a file;
//! - encode: [`dmexp::encode_to_path`] to tmpfs: check pass, narrow + CRC-32 + atomic write.
//!
//! Goals: decode >= 30% of memcpy, encode >= 20%. After criterion's own report a
//! summary table prints the best-of-N throughput of each row and its ratio to memcpy.

use std::hint::black_box;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use criterion::{Criterion, Throughput};
use dmexp::{Dtype, ExportMeta, TensorRef};

const TENSORS: usize = 64;
const VALUES_PER_TENSOR: usize = 1 << 20; // 64 x 1M x 4 B = 256 MiB of f32
const F32_BYTES: u64 = (TENSORS * VALUES_PER_TENSOR * 4) as u64;

struct Workload {
    names: Vec<String>,
    dims: Vec<[u64; 2]>,
    values: Vec<Vec<f32>>,
    meta: ExportMeta,
    encoded_bf16: Vec<u8>,
    out_path: PathBuf,
}

impl Workload {
    fn new() -> Workload {
        // Weight-like values: a fixed LCG mapped to roughly N(0, 0.02)-sized magnitudes.
        let mut state = 0x9E37_79B9_7F4A_7C15u64;
        let mut next = move || {
            state = state
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            ((state >> 40) as f32 / (1u64 << 24) as f32 - 0.5) * 0.08
        };
        let values: Vec<Vec<f32>> = (0..TENSORS)
            .map(|_| (0..VALUES_PER_TENSOR).map(|_| next()).collect())
            .collect();
        let names = (0..TENSORS)
            .map(|i| format!("blocks.{i}.mlp.weight"))
            .collect();
        let dims = vec![[1024, 1024]; TENSORS];
        let meta = ExportMeta {
            source: "bench.bin@step0".into(),
            step: 0,
            config: toml::Table::new(),
        };
        let shm = PathBuf::from("/dev/shm");
        let dir = if shm.is_dir() {
            shm
        } else {
            std::env::temp_dir()
        };
        let mut w = Workload {
            names,
            dims,
            values,
            meta,
            encoded_bf16: Vec::new(),
            out_path: dir.join(format!("dmexp-bench-{}.dmexp", std::process::id())),
        };
        w.encoded_bf16 = dmexp::encode(&w.meta, &w.refs(), Dtype::Bf16)
            .expect("encode")
            .to_bytes();
        w
    }

    fn refs(&self) -> Vec<TensorRef<'_>> {
        self.names
            .iter()
            .zip(&self.dims)
            .zip(&self.values)
            .map(|((name, dims), values)| TensorRef { name, dims, values })
            .collect()
    }
}

fn memcpy(src: &[u8], dst: &mut [u8]) {
    dst.copy_from_slice(src);
    black_box(dst);
}

fn decode(w: &Workload) {
    black_box(dmexp::decode(black_box(&w.encoded_bf16)).expect("decode"));
}

fn decode_into(w: &Workload, buffers: &mut [Vec<f32>]) {
    let view = dmexp::view(black_box(&w.encoded_bf16)).expect("view");
    let mut outputs: Vec<&mut [f32]> = buffers.iter_mut().map(Vec::as_mut_slice).collect();
    view.widen_all_into(&mut outputs).expect("widen");
    black_box(buffers);
}

fn write_payload(w: &Workload) {
    let payload = &w.encoded_bf16[w.encoded_bf16.len() - F32_BYTES as usize / 2..];
    let path = w.out_path.with_extension("raw");
    let mut file = std::fs::File::create(&path).expect("create");
    std::io::Write::write_all(&mut file, payload).expect("write");
    file.sync_all().expect("sync");
}

fn encode(w: &Workload) {
    dmexp::encode_to_path(&w.out_path, &w.meta, &w.refs(), Dtype::Bf16).expect("encode");
}

/// Best of `runs` wall times, in GB/s of f32 bytes.
fn best_gbps(runs: usize, mut f: impl FnMut()) -> f64 {
    let best = (0..runs)
        .map(|_| {
            let start = Instant::now();
            f();
            start.elapsed()
        })
        .min()
        .unwrap_or(Duration::MAX);
    F32_BYTES as f64 / best.as_secs_f64() / 1e9
}

fn main() {
    let w = Workload::new();
    let src: Vec<u8> = w
        .values
        .iter()
        .flatten()
        .flat_map(|v| v.to_le_bytes())
        .collect();
    let mut dst = vec![0u8; src.len()];
    let mut buffers: Vec<Vec<f32>> = w.values.iter().map(|v| vec![0.0; v.len()]).collect();

    let mut criterion = Criterion::default()
        .sample_size(10)
        .measurement_time(Duration::from_secs(4))
        .configure_from_args();
    let mut group = criterion.benchmark_group("dmexp_256MB_f32");
    group.throughput(Throughput::Bytes(F32_BYTES));
    group.bench_function("memcpy", |b| b.iter(|| memcpy(&src, &mut dst)));
    group.bench_function("memcpy_to_fresh_memory", |b| {
        b.iter(|| black_box(src.to_vec()))
    });
    group.bench_function("decode_bf16_into_existing_buffers", |b| {
        b.iter(|| decode_into(&w, &mut buffers))
    });
    group.bench_function("decode_bf16_to_new_tensors", |b| b.iter(|| decode(&w)));
    group.bench_function("write_payload_to_tmpfs", |b| b.iter(|| write_payload(&w)));
    group.bench_function("encode_bf16_to_tmpfs", |b| b.iter(|| encode(&w)));
    group.finish();
    criterion.final_summary();

    let rows: Vec<(&str, f64, &str)> = vec![
        (
            "memcpy (same bytes, existing buffer)",
            best_gbps(7, || memcpy(&src, &mut dst)),
            "",
        ),
        (
            "memcpy to fresh memory",
            best_gbps(7, || drop(black_box(src.to_vec()))),
            "",
        ),
        (
            "decode bf16 into existing buffers",
            best_gbps(7, || decode_into(&w, &mut buffers)),
            ">=30%",
        ),
        (
            "decode bf16 to new tensors",
            best_gbps(7, || decode(&w)),
            "",
        ),
        (
            "write the bf16 payload to tmpfs",
            best_gbps(7, || write_payload(&w)),
            "",
        ),
        (
            "encode bf16 + atomic write to tmpfs",
            best_gbps(7, || encode(&w)),
            ">=20%",
        ),
    ];
    let _ = std::fs::remove_file(&w.out_path);
    let _ = std::fs::remove_file(w.out_path.with_extension("raw"));
    let memcpy_gbps = rows[0].1;
    println!();
    println!(
        "dmexp bf16 throughput: {} MB of f32 weights in {TENSORS} tensors, best of 7, GB/s of f32 bytes",
        F32_BYTES / 1_000_000
    );
    println!(
        "{:<40} {:>8} {:>10} {:>6}",
        "operation", "GB/s", "vs memcpy", "goal"
    );
    for (name, gbps, goal) in rows {
        println!(
            "{name:<40} {gbps:>8.2} {:>9.1}% {goal:>6}",
            100.0 * gbps / memcpy_gbps
        );
    }
}
