//! Routed experts read ahead on a guess of what a layer's router will choose. A layer's router
//! runs only once the rows reach it, and the reads of what it chose start only then; a guess,
//! the layer's own router applied to the row's state before the layer's attention, lets those
//! reads start while the attention computes. The guessed experts are read on threads of the
//! step's scope into the same kind of buffers as any read. When the router has chosen, no
//! further tile of an expert it did not choose is read; the chosen experts the guess read are
//! computed from as if read just then (the same stored bytes, so the same bits), those it read
//! whole at once, those it is still reading as they arrive; the rest of the choice is read as
//! usual, and the guess's reads of unchosen experts in flight finish and are dropped. A wrong guess
//! costs its reads, never a result; a layer whose guesses are wrong too often is guessed only
//! now and then ([`GuessRecord`]), so that its wasted reads do not slow the reads it needs.

use std::collections::HashMap;
use std::sync::{Arc, mpsc};
use std::thread::Scope;

use crate::artifact::Artifact;
use crate::experts::{ExpertParts, LoadedExpert, ReadControl, ReadExpert, TileReads};

/// How often one layer's guesses named the experts its router then chose, lately: a layer is
/// guessed while at least two in three of its guessed experts were chosen (and for its first
/// [`GuessRecord::WARM_UP`] guessed experts); below that, one step in
/// [`GuessRecord::PROBE_EVERY`] still guesses it, so that a layer whose guesses got better is
/// guessed again. Older steps count less: past [`GuessRecord::WINDOW`] guessed experts both
/// counts halve.
#[derive(Debug, Default, Clone, Copy, PartialEq)]
pub struct GuessRecord {
    /// Halved exactly (in binary fractions), so the rate holds as the counts age.
    guessed: f32,
    right: f32,
    passed: u32,
}

impl GuessRecord {
    pub const WARM_UP: f32 = 16.0;
    pub const PROBE_EVERY: u32 = 8;
    pub const WINDOW: f32 = 64.0;

    /// Whether to guess the layer this step (asked once a step where it could be guessed).
    pub fn worth_guessing(&mut self) -> bool {
        if self.guessed < Self::WARM_UP || 3.0 * self.right >= 2.0 * self.guessed {
            return true;
        }
        self.passed += 1;
        if self.passed < Self::PROBE_EVERY {
            return false;
        }
        self.passed = 0;
        true
    }

    /// `guessed` experts were guessed and `right` of them chosen.
    pub fn settled(&mut self, guessed: usize, right: usize) {
        self.guessed += guessed as f32;
        self.right += right.min(guessed) as f32;
        while self.guessed > Self::WINDOW {
            self.guessed /= 2.0;
            self.right /= 2.0;
        }
    }
}

/// The reads of one layer's guessed experts, in flight on their own threads.
pub struct Guess {
    pub layer: usize,
    /// The guessed experts, in the order they are read (the router's order of the guess).
    experts: Vec<usize>,
    control: Arc<ReadControl>,
    receiver: mpsc::Receiver<ReadExpert>,
}

/// What a guess hands its layer once the router chose: the chosen experts it read whole, and
/// the chosen ones it is still reading, which arrive on its channel.
#[derive(Default)]
pub struct Settled {
    pub ready: HashMap<usize, Arc<LoadedExpert>>,
    /// Chosen experts still being read.
    pub arriving: Vec<usize>,
    /// The guessed experts by slot, and where their reads arrive (`None` once every reader
    /// ended).
    experts: Vec<usize>,
    receiver: Option<mpsc::Receiver<ReadExpert>>,
    /// Experts the guess named, and how many of them were chosen.
    pub guessed: usize,
    pub right: usize,
}

impl Settled {
    /// The next chosen expert the guess read, waiting for it: `(expert, None)` where its
    /// read failed (it is read again, and that read reports the failure); `None` once nothing
    /// more can arrive, every expert still in `arriving` then to be read again. Guessed experts
    /// nobody chose that arrive meanwhile are dropped.
    pub fn next_arrival(&mut self) -> Option<(usize, Option<Arc<LoadedExpert>>)> {
        while !self.arriving.is_empty() {
            let Ok((slot, read)) = self.receiver.as_ref()?.recv() else {
                self.receiver = None;
                return None;
            };
            let Some(&e) = self.experts.get(slot) else {
                continue;
            };
            if let Some(at) = self.arriving.iter().position(|&a| a == e) {
                self.arriving.swap_remove(at);
                return Some((e, read.ok().map(|(expert, _)| expert)));
            }
        }
        None
    }
}

impl Guess {
    /// Starts reading `experts` (indices into `parts`, most likely first) of `layer` on
    /// `readers` threads of `scope`.
    pub fn start<'s, 'a: 's>(
        scope: &'s Scope<'s, '_>,
        artifact: &'a Artifact,
        layer: usize,
        experts: Vec<usize>,
        parts: &[ExpertParts],
        readers: usize,
    ) -> Guess {
        let experts: Vec<usize> = experts.into_iter().filter(|&e| e < parts.len()).collect();
        let owned = experts.iter().map(|&e| parts[e].clone()).collect();
        let reads = Arc::new(TileReads::new(artifact, owned));
        let control = reads.control();
        let (sender, receiver) = mpsc::channel();
        for _ in 0..readers.clamp(1, reads.jobs().max(1)) {
            let (reads, sender) = (Arc::clone(&reads), sender.clone());
            scope.spawn(move || reads.run(&sender));
        }
        Guess {
            layer,
            experts,
            control,
            receiver,
        }
    }

    /// Ends the guess once the router chose `chosen`, without waiting: no reader takes
    /// another tile of an expert it did not choose, the reads of the chosen go on, and the
    /// chosen read whole by now are handed over. The control (see [`ReadControl`]) is for the
    /// bytes the guess read, once its readers are done.
    pub fn settle(self, chosen: &[usize]) -> (Settled, Arc<ReadControl>) {
        for (slot, e) in self.experts.iter().enumerate() {
            if !chosen.contains(e) {
                self.control.skip(slot);
            }
        }
        let mut ready = HashMap::new();
        for (slot, read) in self.receiver.try_iter() {
            if let (Some(&e), Ok((expert, _))) = (self.experts.get(slot), read)
                && chosen.contains(&e)
            {
                ready.insert(e, expert);
            }
        }
        let arriving = self
            .experts
            .iter()
            .copied()
            .filter(|e| chosen.contains(e) && !ready.contains_key(e))
            .collect();
        let settled = Settled {
            ready,
            arriving,
            guessed: self.experts.len(),
            right: self.experts.iter().filter(|e| chosen.contains(e)).count(),
            experts: self.experts,
            receiver: Some(self.receiver),
        };
        (settled, self.control)
    }
}

#[cfg(test)]
mod tests {
    use super::GuessRecord;

    /// Guesses `steps` times, each of `guessed` experts with `right` chosen; how many steps
    /// were guessed.
    fn guessed_steps(
        record: &mut GuessRecord,
        steps: usize,
        guessed: usize,
        right: usize,
    ) -> usize {
        (0..steps)
            .filter(|_| {
                let worth = record.worth_guessing();
                if worth {
                    record.settled(guessed, right);
                }
                worth
            })
            .count()
    }

    #[test]
    fn a_layer_guessed_right_two_in_three_times_is_always_guessed() {
        let mut record = GuessRecord::default();
        assert_eq!(guessed_steps(&mut record, 100, 6, 4), 100);
    }

    #[test]
    fn a_layer_guessed_wrong_too_often_is_guessed_one_step_in_eight_after_its_warm_up() {
        let mut record = GuessRecord::default();
        // Three steps of six guessed experts (18) pass the warm-up of 16.
        assert_eq!(guessed_steps(&mut record, 3, 6, 3), 3);
        assert_eq!(guessed_steps(&mut record, 8 * 10, 6, 3), 10);
    }

    #[test]
    fn the_warm_up_ends_at_sixteen_guessed_experts() {
        let mut record = GuessRecord::default();
        record.settled(15, 0);
        assert!(record.worth_guessing(), "still warming up");
        record.settled(1, 0);
        assert!(!record.worth_guessing(), "16 guessed, none right");
    }

    #[test]
    fn a_layer_whose_guesses_got_better_is_guessed_again() {
        let mut record = GuessRecord::default();
        // Long enough that, were old steps never to count less, a hundred right probes would
        // not lift the rate back.
        guessed_steps(&mut record, 400, 6, 1);
        // Right probes pull the rate back above two in three: then every step is guessed.
        let (mut steps, mut in_a_row) = (0, 0);
        while in_a_row < 16 {
            steps += 1;
            assert!(steps < 1000, "never guessed every step again");
            in_a_row = match guessed_steps(&mut record, 1, 6, 6) {
                1 => in_a_row + 1,
                _ => 0,
            };
        }
        assert!(
            steps > 16 + GuessRecord::PROBE_EVERY as usize,
            "{steps} steps: no probing first"
        );
        assert!(
            steps < 200,
            "{steps} steps: the old steps still weigh as much as the new"
        );
    }
}
