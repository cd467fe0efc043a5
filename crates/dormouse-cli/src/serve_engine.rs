//! The decode thread of `dormouse serve`: it owns the model, takes completions from the HTTP
//! handlers and decodes every admitted one together, one batched step for all of them
//! ([`Batch`]), so a weight is read once per step however many requests are being answered.
//! Each request gets exactly the bytes `dormouse generate` gives it alone; its text goes back
//! piece by piece as it becomes final.

use std::collections::{HashMap, VecDeque};
use std::sync::mpsc::Receiver;

use dormouse::Dormouse;
use dormouse::batch::{Batch, Event, Request};
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

/// Runs until `jobs` closes and every completion taken has ended; at most `max_concurrent`
/// decode at once, the others wait in arrival order.
pub fn run(model: &Dormouse, jobs: &Receiver<Queued>, max_concurrent: usize) -> Summary {
    let mut batch = Batch::new(model);
    let mut waiting: VecDeque<Queued> = VecDeque::new();
    let mut live: HashMap<u64, Live> = HashMap::new();
    let mut summary = Summary::default();
    let mut open = true;
    loop {
        if open && batch.is_empty() && waiting.is_empty() {
            match jobs.recv() {
                Ok(queued) => waiting.push_back(queued),
                Err(_) => open = false,
            }
        }
        while let Ok(queued) = jobs.try_recv() {
            waiting.push_back(queued);
        }
        while batch.len() < max_concurrent.max(1)
            && let Some(queued) = waiting.pop_front()
        {
            admit(&mut batch, &mut live, &mut summary, queued);
        }
        if batch.is_empty() {
            if !open && waiting.is_empty() {
                return summary;
            }
            continue;
        }
        summary.steps += 1;
        summary.step_rows += batch.len() as u64;
        let stepped = batch.step(|id, event| hear(&mut live, &mut summary, id, event));
        if let Err(failed) = stepped {
            for id in failed.ids {
                if let Some(gone) = live.remove(&id) {
                    let _ = gone.reply.send(Piece::Failed(failed.error.to_string()));
                }
            }
        }
    }
}

/// Runs the completion's prompt and joins it to the batch (unless its client has gone).
fn admit(batch: &mut Batch, live: &mut HashMap<u64, Live>, summary: &mut Summary, queued: Queued) {
    if queued.reply.is_closed() {
        return;
    }
    let id = summary.requests;
    summary.requests += 1;
    let Queued { job, reply } = queued;
    live.insert(
        id,
        Live {
            reply,
            text: TextStream::new(job.stops),
        },
    );
    let request = Request {
        prompt: job.prompt,
        max_new: job.max_tokens,
        sampling: job.sampling,
    };
    if let Err(e) = batch.admit(id, request, |id, event| hear(live, summary, id, event))
        && let Some(refused) = live.remove(&id)
    {
        let _ = refused.reply.send(Piece::Failed(e.to_string()));
    }
}

/// A sequence's byte or end turned into text for its client; false when the sequence is to
/// end here (its client went away, or a stop sequence ended it).
fn hear(live: &mut HashMap<u64, Live>, summary: &mut Summary, id: u64, event: Event) -> bool {
    let Some(sequence) = live.get_mut(&id) else {
        return false;
    };
    let finish = match event {
        Event::Byte(byte) => {
            summary.generated_bytes += 1;
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
