//! The instruments of `minirun serve` (`GET /api/instruments`): what the decode thread did,
//! second by second over the last minutes. The decode thread records each pass; a handler reads
//! a snapshot. Rates are derived from whole counts here, so the page shows figures, not guesses.

use std::collections::VecDeque;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use serde::Serialize;

/// Seconds of history kept (and charted by the page).
pub const HISTORY_SECONDS: usize = 300;
/// Seconds the `recent` rates are taken over.
const RECENT_SECONDS: u64 = 5;

/// One pass of the decode thread (a batched step or the prompts admitted together).
#[derive(Debug, Clone, Copy, Default)]
pub struct Pass {
    /// Tokens the pass produced (one a sequence for a step).
    pub tokens: u64,
    /// Bytes read from storage: routed experts missed by the cache and streamed layers.
    pub read_bytes: u64,
    pub cache_hits: u64,
    pub cache_misses: u64,
    /// Wall time the pass took, and the part of it spent waiting for reads.
    pub wall: Duration,
    pub io_wait: Duration,
    /// Sequences decoding after the pass.
    pub batch: usize,
    /// Routed experts held by the cache and the slots after the pass.
    pub expert_bytes: u64,
}

/// One second's counts.
#[derive(Debug, Clone, Copy, Default, Serialize)]
pub struct Second {
    /// Seconds since the server started.
    pub t: u64,
    pub tokens: u64,
    pub read_bytes: u64,
    pub io_ms: f64,
    pub busy_ms: f64,
    pub batch_max: usize,
    #[serde(skip)]
    hits: u64,
    #[serde(skip)]
    misses: u64,
}

#[derive(Debug, Default, Clone, Copy, Serialize)]
pub struct Totals {
    pub tokens: u64,
    pub steps: u64,
    pub requests: u64,
    pub read_bytes: u64,
}

/// What the plan says, for the readings to be set against.
#[derive(Debug, Clone, Copy)]
pub struct Planned {
    pub budget: u64,
    /// Weights resident whatever runs (as stored), routed experts aside.
    pub resident_bytes: u64,
    /// Bytes a token reads with no cache hits.
    pub read_per_token: u64,
}

#[derive(Debug, Default)]
struct Readings {
    seconds: VecDeque<Second>,
    totals: Totals,
    batch: usize,
    waiting: usize,
    expert_bytes: u64,
}

/// The decode thread's record, shared with the handlers.
#[derive(Debug)]
pub struct Meter {
    start: Instant,
    planned: Planned,
    readings: Mutex<Readings>,
}

/// `GET /api/instruments`.
#[derive(Debug, Serialize)]
pub struct Snapshot {
    pub uptime_s: f64,
    pub budget: u64,
    pub resident_bytes: u64,
    pub planned_read_per_token: u64,
    pub batch: usize,
    pub waiting: usize,
    pub totals: Totals,
    pub recent: Recent,
    pub history: Vec<Second>,
}

/// Rates over the last few seconds; a per-token figure is `None` when no token was made then.
#[derive(Debug, Serialize)]
pub struct Recent {
    pub window_s: f64,
    pub tokens_per_s: f64,
    pub read_bytes_per_token: Option<f64>,
    pub io_wait_ms_per_token: Option<f64>,
    pub compute_ms_per_token: Option<f64>,
    pub cache_hit_rate: Option<f64>,
}

impl Meter {
    pub fn new(planned: Planned) -> Meter {
        Meter::started_at(planned, Instant::now())
    }

    fn started_at(planned: Planned, start: Instant) -> Meter {
        Meter {
            start,
            planned,
            readings: Mutex::new(Readings::default()),
        }
    }

    /// Records a pass that ended `at`.
    pub fn record(&self, pass: Pass, at: Instant) {
        let t = at.saturating_duration_since(self.start).as_secs();
        let mut r = self.lock();
        let second = r.second(t);
        second.tokens += pass.tokens;
        second.read_bytes += pass.read_bytes;
        second.io_ms += pass.io_wait.as_secs_f64() * 1e3;
        second.busy_ms += pass.wall.as_secs_f64() * 1e3;
        second.batch_max = second.batch_max.max(pass.batch);
        second.hits += pass.cache_hits;
        second.misses += pass.cache_misses;
        r.totals.tokens += pass.tokens;
        r.totals.read_bytes += pass.read_bytes;
        r.batch = pass.batch;
        r.expert_bytes = pass.expert_bytes;
    }

    /// Counts a batched step (beside [`Meter::record`], which also hears prompt passes).
    pub fn count_step(&self) {
        self.lock().totals.steps += 1;
    }

    /// Counts requests taken by the decode thread.
    pub fn count_requests(&self, n: u64) {
        self.lock().totals.requests += n;
    }

    pub fn set_waiting(&self, waiting: usize) {
        self.lock().waiting = waiting;
    }

    /// The readings as of `now`.
    pub fn snapshot(&self, now: Instant) -> Snapshot {
        let uptime = now.saturating_duration_since(self.start);
        let mut r = self.lock();
        // Seconds in which nothing ran are zeros, not gaps.
        r.second(uptime.as_secs());
        let window_s = uptime.as_secs_f64().clamp(1e-3, RECENT_SECONDS as f64);
        let since = uptime.as_secs().saturating_sub(RECENT_SECONDS - 1);
        let recent: Vec<&Second> = r.seconds.iter().filter(|s| s.t >= since).collect();
        let sum = |f: fn(&Second) -> f64| recent.iter().map(|s| f(s)).sum::<f64>();
        let tokens = sum(|s| s.tokens as f64);
        let (hits, misses) = (sum(|s| s.hits as f64), sum(|s| s.misses as f64));
        let (io_ms, busy_ms) = (sum(|s| s.io_ms), sum(|s| s.busy_ms));
        let per_token = |x: f64| (tokens > 0.0).then(|| x / tokens);
        Snapshot {
            uptime_s: uptime.as_secs_f64(),
            budget: self.planned.budget,
            resident_bytes: self.planned.resident_bytes + r.expert_bytes,
            planned_read_per_token: self.planned.read_per_token,
            batch: r.batch,
            waiting: r.waiting,
            totals: r.totals,
            recent: Recent {
                window_s,
                tokens_per_s: tokens / window_s,
                read_bytes_per_token: per_token(sum(|s| s.read_bytes as f64)),
                io_wait_ms_per_token: per_token(io_ms),
                compute_ms_per_token: per_token((busy_ms - io_ms).max(0.0)),
                cache_hit_rate: (hits + misses > 0.0).then(|| hits / (hits + misses)),
            },
            history: r.seconds.iter().copied().collect(),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Readings> {
        // A handler that panicked mid-read leaves counts that are still counts.
        self.readings
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}

impl Readings {
    /// The entry of second `t`, adding the seconds up to it (and dropping the oldest past
    /// [`HISTORY_SECONDS`]). A `t` older than the newest entry (a pass recorded late) counts in
    /// the newest.
    fn second(&mut self, t: u64) -> &mut Second {
        let next = self.seconds.back().map_or(0, |s| s.t + 1);
        // After a long idle spell only the kept window is filled in.
        let first_new = next.max(t.saturating_sub(HISTORY_SECONDS as u64 - 1));
        for t in first_new..=t {
            self.seconds.push_back(Second {
                t,
                ..Second::default()
            });
        }
        while self.seconds.len() > HISTORY_SECONDS {
            self.seconds.pop_front();
        }
        self.seconds
            .back_mut()
            .expect("a second was just added or was already there")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const PLANNED: Planned = Planned {
        budget: 1000,
        resident_bytes: 300,
        read_per_token: 50,
    };

    fn pass(tokens: u64, read_bytes: u64, wall_ms: u64, io_ms: u64) -> Pass {
        Pass {
            tokens,
            read_bytes,
            cache_hits: 1,
            cache_misses: 3,
            wall: Duration::from_millis(wall_ms),
            io_wait: Duration::from_millis(io_ms),
            batch: 2,
            expert_bytes: 40,
        }
    }

    #[test]
    fn recent_rates_come_from_the_last_seconds_counts() {
        let start = Instant::now();
        let meter = Meter::started_at(PLANNED, start);
        // Second 0 falls out of the 5-second window at second 9.
        meter.record(pass(100, 1, 10, 1), start);
        meter.record(pass(4, 400, 20, 5), start + Duration::from_millis(7200));
        meter.record(pass(6, 600, 30, 15), start + Duration::from_millis(8900));
        let s = meter.snapshot(start + Duration::from_millis(9500));
        assert_eq!(s.totals.tokens, 110);
        assert_eq!(s.recent.window_s, 5.0);
        assert_eq!(s.recent.tokens_per_s, 2.0);
        assert_eq!(s.recent.read_bytes_per_token, Some(100.0));
        assert_eq!(s.recent.io_wait_ms_per_token, Some(2.0));
        assert_eq!(s.recent.compute_ms_per_token, Some(3.0));
        assert_eq!(s.recent.cache_hit_rate, Some(0.25));
        assert_eq!(
            s.resident_bytes, 340,
            "the plan's resident bytes and the experts held"
        );
        assert_eq!(s.history.len(), 10, "seconds 0 to 9, idle ones as zeros");
        assert_eq!(s.history[7].tokens, 4);
        assert_eq!(s.history[3].tokens, 0);
    }

    #[test]
    fn an_idle_meter_reports_no_per_token_figures() {
        let start = Instant::now();
        let meter = Meter::started_at(PLANNED, start);
        let s = meter.snapshot(start + Duration::from_secs(2));
        assert_eq!(s.recent.tokens_per_s, 0.0);
        assert_eq!(s.recent.read_bytes_per_token, None);
        assert_eq!(s.recent.cache_hit_rate, None);
    }

    #[test]
    fn history_keeps_the_last_minutes_only() {
        let start = Instant::now();
        let meter = Meter::started_at(PLANNED, start);
        meter.record(pass(1, 0, 1, 0), start);
        let late = start + Duration::from_secs(10_000);
        meter.record(pass(2, 0, 1, 0), late);
        let s = meter.snapshot(late);
        assert_eq!(s.history.len(), HISTORY_SECONDS);
        assert_eq!(s.history.last().map(|x| (x.t, x.tokens)), Some((10_000, 2)));
        assert_eq!(s.history[0].t, 10_000 - HISTORY_SECONDS as u64 + 1);
    }
}
