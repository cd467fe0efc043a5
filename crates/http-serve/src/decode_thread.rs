//! The decode thread every generating server runs: it takes the requests the HTTP handlers
//! queue, keeps at most `max_concurrent` of them decoding together and the rest waiting in
//! arrival order, admits those that arrive together in one call (so that their prompts can
//! share passes), and steps the batch until it is empty and the queue has closed. What a
//! request is, how its prompt runs and what its client hears are the program's
//! ([`DecodeBatch`]); when requests join, wait and end is this loop's alone.

use std::collections::VecDeque;
use std::sync::mpsc::Receiver;

/// A program's batch of sequences, as the decode thread drives it.
pub trait DecodeBatch {
    /// A request as the HTTP handlers queue it (with where its answer goes).
    type Job;

    /// Sequences decoding now.
    fn len(&self) -> usize;

    fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Runs the prompts of `arriving` (numbered in arrival order, from 0 over the thread's
    /// life) and joins the admitted ones to the batch. A job refused, or whose client has gone,
    /// is answered or dropped here and does not join.
    fn admit(&mut self, arriving: Vec<(u64, Self::Job)>);

    /// One batched step of every sequence decoding (a sequence that ends leaves the batch).
    fn step(&mut self);

    /// Hears how many requests wait for room in the batch, each time the loop has admitted
    /// what fits (for a server's instruments).
    fn waiting(&mut self, _count: usize) {}
}

/// What the loop did, for a server's summary at shutdown.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Counts {
    /// Requests taken from the queue (refused ones included).
    pub requests: u64,
    pub steps: u64,
    /// Sequences summed over the steps (divided by `steps`: the mean batch).
    pub step_rows: u64,
}

/// Runs until `jobs` closes and every request taken has left the batch. Blocks on the queue
/// only while nothing is decoding or waiting.
pub fn run<B: DecodeBatch>(
    batch: &mut B,
    jobs: &Receiver<B::Job>,
    max_concurrent: usize,
) -> Counts {
    let mut waiting: VecDeque<B::Job> = VecDeque::new();
    let mut counts = Counts::default();
    let mut open = true;
    loop {
        if open && batch.is_empty() && waiting.is_empty() {
            match jobs.recv() {
                Ok(job) => waiting.push_back(job),
                Err(_) => open = false,
            }
        }
        while let Ok(job) = jobs.try_recv() {
            waiting.push_back(job);
        }
        let room = max_concurrent.max(1).saturating_sub(batch.len());
        let arriving: Vec<(u64, B::Job)> = waiting
            .drain(..room.min(waiting.len()))
            .map(|job| {
                counts.requests += 1;
                (counts.requests - 1, job)
            })
            .collect();
        if !arriving.is_empty() {
            batch.admit(arriving);
        }
        batch.waiting(waiting.len());
        if batch.is_empty() {
            if !open && waiting.is_empty() {
                return counts;
            }
            continue;
        }
        counts.steps += 1;
        counts.step_rows += batch.len() as u64;
        batch.step();
    }
}

#[cfg(test)]
mod tests {
    use std::sync::mpsc;

    use super::*;

    /// Sequences that each decode `steps` times; a job of 0 steps is refused at admission.
    #[derive(Default)]
    struct Countdown {
        active: Vec<(u64, u32)>,
        admitted: Vec<Vec<u64>>,
        widest: usize,
    }

    impl DecodeBatch for Countdown {
        type Job = u32;

        fn len(&self) -> usize {
            self.active.len()
        }

        fn admit(&mut self, arriving: Vec<(u64, u32)>) {
            self.admitted
                .push(arriving.iter().map(|(id, _)| *id).collect());
            self.active
                .extend(arriving.into_iter().filter(|(_, steps)| *steps > 0));
            self.widest = self.widest.max(self.active.len());
        }

        fn step(&mut self) {
            for (_, left) in &mut self.active {
                *left -= 1;
            }
            self.active.retain(|(_, left)| *left > 0);
        }
    }

    #[test]
    fn requests_queued_together_join_together_up_to_the_limit_and_all_end() {
        let (send, jobs) = mpsc::channel();
        for steps in [3, 0, 2, 5, 1] {
            send.send(steps).unwrap();
        }
        drop(send);
        let mut batch = Countdown::default();
        let counts = run(&mut batch, &jobs, 3);
        assert_eq!(
            batch.admitted[0],
            [0, 1, 2],
            "the first three, in arrival order"
        );
        assert!(batch.widest <= 3);
        assert!(batch.active.is_empty());
        assert_eq!(counts.requests, 5);
        // Steps: the sequences' lengths decoded with at most three at once.
        assert_eq!(counts.step_rows, 3 + 2 + 5 + 1);
        assert!(counts.steps >= 5 && counts.steps < 11, "{counts:?}");
    }

    #[test]
    fn a_closed_empty_queue_ends_at_once() {
        let (send, jobs) = mpsc::channel::<u32>();
        drop(send);
        assert_eq!(run(&mut Countdown::default(), &jobs, 4), Counts::default());
    }
}
