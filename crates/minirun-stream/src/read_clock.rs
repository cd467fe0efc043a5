//! The wall time storage was busy for a run: time during which at least one read was in flight,
//! however many overlapped. Summing each read's own duration would count two overlapping
//! reads twice; this is the figure "time per token against the I/O it needed" compares with.

use std::sync::Mutex;
use std::time::{Duration, Instant};

#[derive(Debug, Default)]
pub struct ReadClock(Mutex<ClockState>);

#[derive(Debug, Default)]
struct ClockState {
    in_flight: usize,
    /// When `in_flight` last went from 0 to 1.
    since: Option<Instant>,
    /// Busy time of the intervals already closed.
    closed: Duration,
}

/// One read in flight; the read ends when this is dropped.
#[must_use = "the read is timed until this is dropped"]
pub struct ReadTiming<'a>(&'a ReadClock);

impl ReadClock {
    pub fn new() -> ReadClock {
        ReadClock::default()
    }

    /// Marks a read as started.
    pub fn start(&self) -> ReadTiming<'_> {
        if let Ok(mut state) = self.0.lock() {
            if state.in_flight == 0 {
                state.since = Some(Instant::now());
            }
            state.in_flight += 1;
        }
        ReadTiming(self)
    }

    /// Busy time so far, the interval now open included.
    pub fn busy(&self) -> Duration {
        self.0.lock().map_or(Duration::ZERO, |state| {
            state.closed + state.since.map_or(Duration::ZERO, |since| since.elapsed())
        })
    }
}

impl Drop for ReadTiming<'_> {
    fn drop(&mut self) {
        if let Ok(mut state) = self.0.0.lock() {
            state.in_flight = state.in_flight.saturating_sub(1);
            if state.in_flight == 0
                && let Some(since) = state.since.take()
            {
                state.closed += since.elapsed();
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const READ: Duration = Duration::from_millis(40);

    #[test]
    fn overlapping_reads_count_once() {
        let clock = ReadClock::new();
        let wall = Instant::now();
        let all_started = std::sync::Barrier::new(4);
        std::thread::scope(|scope| {
            for _ in 0..4 {
                scope.spawn(|| {
                    let _read = clock.start();
                    all_started.wait();
                    std::thread::sleep(READ);
                });
            }
        });
        let busy = clock.busy();
        assert!(busy >= READ, "{busy:?}");
        assert!(busy <= wall.elapsed(), "{busy:?} > {:?}", wall.elapsed());
        assert!(
            busy < READ * 3,
            "four overlapping reads counted as {busy:?}"
        );
    }

    #[test]
    fn reads_one_after_another_add_up_and_idle_time_does_not() {
        let clock = ReadClock::new();
        for _ in 0..2 {
            let _read = clock.start();
            std::thread::sleep(READ);
        }
        std::thread::sleep(READ * 2);
        let busy = clock.busy();
        assert!(busy >= READ * 2, "{busy:?}");
        assert!(busy < READ * 4, "idle time counted: {busy:?}");
    }

    #[test]
    fn an_open_read_counts_up_to_now() {
        let clock = ReadClock::new();
        let read = clock.start();
        std::thread::sleep(READ);
        assert!(clock.busy() >= READ);
        drop(read);
        let closed = clock.busy();
        std::thread::sleep(READ);
        assert_eq!(clock.busy(), closed);
    }
}
