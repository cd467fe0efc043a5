//! What the largest header a reader accepts costs to parse. Alone in its test binary, so that
//! the process's peak resident set (`VmHWM`) measures this parse and nothing else.

use dmexp::layout::{FORMAT_VERSION, MAX_HEADER_LEN, Prefix};

/// The bound `docs/formats/dmexp.md` states for parsing a header of `MAX_HEADER_LEN` bytes.
const PARSE_BOUND: u64 = 320 << 20;

fn peak_rss() -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap();
    let line = status.lines().find(|l| l.starts_with("VmHWM:")).unwrap();
    let kib: u64 = line.split_whitespace().nth(1).unwrap().parse().unwrap();
    kib << 10
}

/// A valid export whose header is as close to the limit as it gets with the shortest
/// tensor entries there are: the most TOML tables per header byte.
fn densest_export() -> (Vec<u8>, usize) {
    let entry = |i: usize| format!("[[tensors]]\nname=\"{i}\"\ndims=[1]\noverflowed=0\n");
    let fixed = |n: usize| {
        format!(
            "format = 1\ndtype = \"f32\"\nsource = \"x\"\nstep = 0\nnum_params = {n}\nnum_tensors = {n}\nflushed = 0\nmax_abs = 0.0\nmin_nonzero_abs = 0.0\n\n[config]\n\n"
        )
    };
    let budget = MAX_HEADER_LEN as usize - fixed(10_000_000).len();
    let (mut count, mut used) = (0, 0);
    while used + entry(count).len() <= budget {
        used += entry(count).len();
        count += 1;
    }
    let mut header = fixed(count);
    for i in 0..count {
        header.push_str(&entry(i));
    }
    let payload = vec![0u8; 4 * count];
    let prefix = Prefix {
        version: FORMAT_VERSION,
        header_len: header.len() as u32,
        payload_len: payload.len() as u64,
        payload_crc32: crc32fast::hash(&payload),
    };
    let mut bytes = prefix.to_bytes().to_vec();
    bytes.extend_from_slice(header.as_bytes());
    bytes.extend_from_slice(&payload);
    (bytes, count)
}

#[test]
fn the_largest_header_parses_within_the_stated_bound() {
    let (bytes, count) = densest_export();
    assert!(count > 80_000, "{count} tensors");
    let before = peak_rss();
    let view = dmexp::view(&bytes).expect("the densest header is valid");
    assert_eq!(view.header.num_tensors(), count);
    let grew = peak_rss().saturating_sub(before);
    eprintln!(
        "a {MAX_HEADER_LEN}-byte header of {count} tensors: peak RSS grew {} MiB",
        grew >> 20
    );
    assert!(
        grew <= PARSE_BOUND,
        "parsing a {MAX_HEADER_LEN}-byte header of {count} tensors took {} MiB",
        grew >> 20
    );
}
