//! `--budget`: how much memory a run may use, as bytes (`2GiB`, `500MB`, `1.5GB`, `1000000`) or
//! a preset the planner resolves (`floor`, `balanced`, `generous`).

use std::fmt;
use std::str::FromStr;

/// A memory budget as the user gave it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Budget {
    Bytes(u64),
    /// The smallest budget the run can work in: the plan's floor.
    Floor,
    /// Halfway between the floor and everything resident.
    Balanced,
    /// Everything resident (the floor if that is more).
    Generous,
}

/// Why a budget string was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "--budget {0:?} is not a size: give bytes with an optional unit (2GiB, 500MB, 1.5GB, 1000000) or a preset (floor, balanced, generous)"
)]
pub struct BudgetError(pub String);

const UNITS: [(&str, u64); 9] = [
    ("kib", 1 << 10),
    ("mib", 1 << 20),
    ("gib", 1 << 30),
    ("tib", 1 << 40),
    ("kb", 1_000),
    ("mb", 1_000_000),
    ("gb", 1_000_000_000),
    ("tb", 1_000_000_000_000),
    ("b", 1),
];

impl FromStr for Budget {
    type Err = BudgetError;

    fn from_str(text: &str) -> Result<Budget, BudgetError> {
        let refuse = || BudgetError(text.to_string());
        let lower = text.trim().to_ascii_lowercase();
        match lower.as_str() {
            "floor" => return Ok(Budget::Floor),
            "balanced" => return Ok(Budget::Balanced),
            "generous" => return Ok(Budget::Generous),
            _ => {}
        }
        let (number, scale) = UNITS
            .iter()
            .find_map(|(unit, scale)| Some((lower.strip_suffix(unit)?, *scale)))
            .unwrap_or((lower.as_str(), 1));
        let number = number.trim();
        if number.is_empty() || !number.bytes().all(|b| b.is_ascii_digit() || b == b'.') {
            return Err(refuse());
        }
        let bytes = match number.parse::<u64>() {
            Ok(n) => n.checked_mul(scale).ok_or_else(refuse)?,
            Err(_) => {
                let n: f64 = number.parse().map_err(|_| refuse())?;
                let bytes = (n * scale as f64).floor();
                if !(bytes.is_finite() && bytes >= 0.0 && bytes < u64::MAX as f64) {
                    return Err(refuse());
                }
                bytes as u64
            }
        };
        if bytes == 0 {
            return Err(refuse());
        }
        Ok(Budget::Bytes(bytes))
    }
}

impl fmt::Display for Budget {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Budget::Bytes(b) => write!(f, "{}", human(*b)),
            Budget::Floor => f.write_str("floor"),
            Budget::Balanced => f.write_str("balanced"),
            Budget::Generous => f.write_str("generous"),
        }
    }
}

/// Bytes for a person: exact below 1 KiB, else binary units with two decimals.
pub fn human(bytes: u64) -> String {
    const STEPS: [&str; 5] = ["KiB", "MiB", "GiB", "TiB", "PiB"];
    if bytes < 1024 {
        return format!("{bytes} B");
    }
    let mut value = bytes as f64 / 1024.0;
    let mut unit = 0;
    while value >= 1024.0 && unit + 1 < STEPS.len() {
        value /= 1024.0;
        unit += 1;
    }
    format!("{value:.2} {}", STEPS[unit])
}

/// The process's peak resident set (`VmHWM`: mapped file pages count), in bytes, where the
/// system says.
pub fn peak_rss() -> Option<u64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find(|l| l.starts_with("VmHWM:"))?;
    let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    kib.checked_mul(1024)
}

/// Turns transparent huge pages off for this process (and what it starts), so that its
/// resident memory is the pages it touched. The allocator asks the kernel for 2 MiB pages over
/// its arenas; a 4.25 MiB expert buffer then holds three of them, 6 MiB resident: at DeepSeek
/// V4 Flash's geometry a run at `--budget balanced` was 252 MiB past its budget with them and 85
/// MiB without (peak RSS of `minirun run --budget balanced --json` on the artifact
/// `bench/stream_real_geometry.sh` makes, mimalloc's THP option at 1 and 0), at the same speed. Where the kernel refuses,
/// the run goes on with the kernel's default.
pub fn count_only_used_pages() -> std::io::Result<()> {
    rustix::thread::disable_transparent_huge_pages(true).map_err(std::io::Error::from)
}

/// Whether transparent huge pages are off for this process.
pub fn only_used_pages_counted() -> bool {
    rustix::thread::transparent_huge_pages_are_disabled().unwrap_or(false)
}

/// Memory kept free of a cache's prepared buffers, beyond them: the process's stacks, the
/// allocator's slack and the system's own needs.
const PREPARE_HEADROOM: u64 = 1 << 30;

/// How much of an expert cache's buffers a model may make at load: what the system says is
/// available now (its resident weights in), less headroom. A budget larger than the machine's
/// memory would otherwise be made whole at load; the cache then fills the rest as it reads.
pub fn preparable_memory() -> u64 {
    available_memory().map_or(u64::MAX, |a| a.saturating_sub(PREPARE_HEADROOM))
}

/// The memory the system says a new allocation can have without swapping (`MemAvailable` of
/// `/proc/meminfo`), in bytes; `None` where the system does not say.
pub fn available_memory() -> Option<u64> {
    let info = std::fs::read_to_string("/proc/meminfo").ok()?;
    let line = info.lines().find(|l| l.starts_with("MemAvailable:"))?;
    let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    kib.checked_mul(1024)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_process_can_turn_transparent_huge_pages_off() {
        count_only_used_pages().unwrap();
        assert!(only_used_pages_counted());
    }

    #[test]
    fn sizes_and_presets_parse_and_nonsense_is_refused() {
        let ok = |t: &str| t.parse::<Budget>().unwrap();
        assert_eq!(ok("2GiB"), Budget::Bytes(2 << 30));
        assert_eq!(ok("500MB"), Budget::Bytes(500_000_000));
        assert_eq!(ok("1.5GB"), Budget::Bytes(1_500_000_000));
        assert_eq!(ok("1000000"), Budget::Bytes(1_000_000));
        assert_eq!(ok(" 64 mib "), Budget::Bytes(64 << 20));
        assert_eq!(ok("floor"), Budget::Floor);
        assert_eq!(ok("Balanced"), Budget::Balanced);
        assert_eq!(ok("generous"), Budget::Generous);
        for bad in [
            "",
            "GiB",
            "-1GB",
            "1e9",
            "2 GiBs",
            "0",
            "99999999999TiB",
            "1.2.3MB",
        ] {
            assert!(bad.parse::<Budget>().is_err(), "{bad:?}");
        }
        assert_eq!(human(512), "512 B");
        assert_eq!(human(3 << 29), "1.50 GiB");
    }
}
