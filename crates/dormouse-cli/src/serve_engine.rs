//! The decode thread of `dormouse serve`: it owns the model, takes completions from the HTTP
//! handlers and decodes every admitted one together, one batched step for all of them
//! ([`Batch`]), so a weight is read once per step however many requests are being answered.
//! Each request gets exactly the bytes `dormouse generate` gives it alone; its text goes back
//! piece by piece as it becomes final.

use std::collections::HashMap;
use std::sync::mpsc::Receiver;

use dormouse::Dormouse;
use dormouse::batch::{Batch, Event, Request};
use http_serve::decode_thread::{self, DecodeBatch};
use http_serve::{Finish, TextStream};
use tokio::sync::mpsc::UnboundedSender;

use crate::completions::Job;

/// A completion on its way to the decode thread, with where its pieces go.
pub struct Queued {
    pub job: Job,
    pub reply: UnboundedSender<Piece>,
}

/// What the decode thread says about a completion: `Text` pieces, then `Done` (or `Failed`).
#[derive(Debug)]
pub enum Piece {
    Text(String),
    Done { finish: Finish, bytes: usize },
    Failed(String),
}

/// What the decode thread did, for the summary at shutdown.
#[derive(Debug, Default)]
pub struct Summary {
    pub requests: u64,
    pub generated_bytes: u64,
    pub steps: u64,
    /// Sequences summed over the steps (divided by `steps`: the mean batch).
    pub step_rows: u64,
}

/// A completion being answered.
struct Live {
    reply: UnboundedSender<Piece>,
    text: TextStream,
}

/// The batch and the completions it answers, as the decode thread drives them.
struct Completions<'m> {
    batch: Batch<'m>,
    live: HashMap<u64, Live>,
    generated_bytes: u64,
}

/// Runs until `jobs` closes and every completion taken has ended; at most `max_concurrent`
/// decode at once, the others wait in arrival order (`http_serve::decode_thread`).
pub fn run(model: &Dormouse, jobs: &Receiver<Queued>, max_concurrent: usize) -> Summary {
    let mut completions = Completions {
        batch: Batch::new(model),
        live: HashMap::new(),
        generated_bytes: 0,
    };
    let counts = decode_thread::run(&mut completions, jobs, max_concurrent);
    Summary {
        requests: counts.requests,
        generated_bytes: completions.generated_bytes,
        steps: counts.steps,
        step_rows: counts.step_rows,
    }
}

impl DecodeBatch for Completions<'_> {
    type Job = Queued;

    fn len(&self) -> usize {
        self.batch.len()
    }

    /// Runs each completion's prompt and joins it to the batch (unless its client has gone).
    fn admit(&mut self, arriving: Vec<(u64, Queued)>) {
        for (id, queued) in arriving {
            if queued.reply.is_closed() {
                continue;
            }
            let Queued { job, reply } = queued;
            let text = TextStream::new(job.stops);
            self.live.insert(id, Live { reply, text });
            let request = Request {
                prompt: job.prompt,
                max_new: job.max_tokens,
                sampling: job.sampling,
            };
            let (live, generated) = (&mut self.live, &mut self.generated_bytes);
            let admitted = self
                .batch
                .admit(id, request, |id, event| hear(live, generated, id, event));
            if let Err(e) = admitted
                && let Some(refused) = self.live.remove(&id)
            {
                let _ = refused.reply.send(Piece::Failed(e.to_string()));
            }
        }
    }

    fn step(&mut self) {
        let (live, generated) = (&mut self.live, &mut self.generated_bytes);
        let stepped = self
            .batch
            .step(|id, event| hear(live, generated, id, event));
        if let Err(failed) = stepped {
            for id in failed.ids {
                if let Some(gone) = self.live.remove(&id) {
                    let _ = gone.reply.send(Piece::Failed(failed.error.to_string()));
                }
            }
        }
    }
}

/// A sequence's byte or end turned into text for its client; false when the sequence is to
/// end here (its client went away, or a stop sequence ended it).
fn hear(live: &mut HashMap<u64, Live>, generated_bytes: &mut u64, id: u64, event: Event) -> bool {
    let Some(sequence) = live.get_mut(&id) else {
        return false;
    };
    let finish = match event {
        Event::Byte(byte) => {
            *generated_bytes += 1;
            let (piece, stopped) = sequence.text.push(byte);
            let sent = piece.is_empty() || sequence.reply.send(Piece::Text(piece)).is_ok();
            if !sent || sequence.reply.is_closed() {
                live.remove(&id);
                return false;
            }
            match stopped {
                Some(finish) => finish,
                None => return true,
            }
        }
        Event::Finished => {
            let rest = sequence.text.finish();
            if !rest.is_empty() {
                let _ = sequence.reply.send(Piece::Text(rest));
            }
            Finish::Length
        }
    };
    if let Some(sequence) = live.remove(&id) {
        let _ = sequence.reply.send(Piece::Done {
            finish,
            bytes: sequence.text.bytes(),
        });
    }
    false
}
