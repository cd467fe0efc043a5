//! The decode thread of `minirun serve`: it owns the opened artifact and its model, takes
//! requests from the HTTP handlers, runs the prompts of requests that arrive together as the
//! rows of shared passes, and decodes every admitted request together, one batched step for all
//! of them ([`Batch`]), so that a weight (a streamed layer, an expert) is read once per pass
//! however many requests are being answered. Each request gets exactly the
//! tokens `minirun run` gives it alone; its text goes back piece by piece as it becomes final.

use std::collections::HashMap;
use std::sync::mpsc::Receiver;
use std::time::Instant;

use http_serve::decode_thread::{self, DecodeBatch};
use http_serve::{ApiError, Finish, TextStream};
use minirun_runtime::Decoder;
use minirun_runtime::Model;
use minirun_runtime::StopReason;
use minirun_runtime::{Batch, Event, Request};
use minirun_runtime::{IncrementalText, Session};
use minirun_stream::step::StepStats;
use tokio::sync::mpsc::UnboundedSender;

use crate::serve::meter::{Meter, Pass};
use crate::serve::requests::{Ask, Prompt};

/// A request on its way to the decode thread: its prompt already as ids (tokenized by the
/// handler, `serve_prompt`), with where its pieces go.
pub struct Job {
    pub ask: Ask,
    pub prompt_ids: Vec<u32>,
    pub reply: UnboundedSender<Piece>,
}

/// What the decode thread says about a request, in this order: `Started` or `Refused`; then
/// `Text` pieces; then `Done` (or `Failed`).
#[derive(Debug)]
pub enum Piece {
    Started {
        prompt_tokens: usize,
    },
    Refused(ApiError),
    Text(String),
    Done {
        finish: Finish,
        completion_tokens: usize,
    },
    Failed(String),
}

/// How many requests decode at once and how long each may get.
#[derive(Debug, Clone, Copy)]
pub struct Limits {
    pub max_concurrent: usize,
    /// Prompt and completion tokens of one request, at most.
    pub context: usize,
}

/// What the decode thread did, for the summary at shutdown.
#[derive(Debug, Default)]
pub struct Summary {
    pub requests: u64,
    pub generated_tokens: u64,
    pub steps: u64,
    /// Sequences summed over the steps (divided by `steps`: the mean batch).
    pub step_rows: u64,
}

/// A request being answered.
struct Live<'t> {
    reply: UnboundedSender<Piece>,
    /// The generated ids, and the text handed out so far.
    shown: IncrementalText<'t>,
    text: TextStream,
}

/// The batch and the requests it answers, as the decode thread drives them.
struct Requests<'s, 'm> {
    session: &'s Session,
    model: &'m Model<'m>,
    batch: Batch<'m, Model<'m>>,
    meter: &'m Meter,
    live: HashMap<u64, Live<'s>>,
    stop: Vec<u32>,
    context: usize,
    generated_tokens: u64,
}

/// Runs until `jobs` closes and every request taken has ended; at most
/// `limits.max_concurrent` decode at once, the others wait in arrival order
/// (`http_serve::decode_thread`).
pub fn run(
    session: &Session,
    model: &Model,
    jobs: &Receiver<Job>,
    limits: Limits,
    meter: &Meter,
) -> Summary {
    let mut requests = Requests {
        session,
        model,
        batch: Batch::new(model),
        meter,
        live: HashMap::new(),
        stop: session.stop_ids(),
        context: limits.context,
        generated_tokens: 0,
    };
    let counts = decode_thread::run(&mut requests, jobs, limits.max_concurrent);
    Summary {
        requests: counts.requests,
        generated_tokens: requests.generated_tokens,
        steps: counts.steps,
        step_rows: counts.step_rows,
    }
}

impl DecodeBatch for Requests<'_, '_> {
    type Job = Job;

    fn len(&self) -> usize {
        self.batch.len()
    }

    /// Admits each request whose prompt fits the context (refusing what does not) and runs the
    /// prompts of those admitted as the rows of shared passes.
    fn admit(&mut self, arriving: Vec<(u64, Job)>) {
        let session = self.session;
        self.meter.count_requests(arriving.len() as u64);
        let mut admitted = Vec::new();
        for (id, job) in arriving {
            let Job {
                ask,
                prompt_ids,
                reply,
            } = job;
            let Some(request) = admission(prompt_ids, &ask, &reply, &self.stop, self.context)
            else {
                continue;
            };
            let live = Live {
                reply,
                shown: match ask.prompt {
                    Prompt::Chat(_) => IncrementalText::reply(&session.text),
                    Prompt::Text(_) => IncrementalText::new(&session.text),
                },
                text: TextStream::new(ask.stops),
            };
            self.live.insert(id, live);
            admitted.push((id, request));
        }
        if admitted.is_empty() {
            return;
        }
        let (started, before) = (Instant::now(), self.generated_tokens);
        let mut stats = StepStats::default();
        let (live, generated) = (&mut self.live, &mut self.generated_tokens);
        let mut heard = |id, event| hear(live, generated, id, event);
        for (id, error) in self.batch.admit_all(admitted, &mut stats, &mut heard) {
            if let Some(gone) = self.live.remove(&id) {
                let _ = gone.reply.send(Piece::Failed(error.to_string()));
            }
        }
        self.record(started, before, &stats);
    }

    fn step(&mut self) {
        let (started, before) = (Instant::now(), self.generated_tokens);
        let mut stats = StepStats::default();
        let (live, generated) = (&mut self.live, &mut self.generated_tokens);
        let mut heard = |id, event| hear(live, generated, id, event);
        if let Err(failed) = self.batch.step(&mut stats, &mut heard) {
            for id in failed.ids {
                if let Some(gone) = self.live.remove(&id) {
                    let _ = gone.reply.send(Piece::Failed(failed.error.to_string()));
                }
            }
        }
        self.meter.count_step();
        self.record(started, before, &stats);
    }

    fn waiting(&mut self, count: usize) {
        self.meter.set_waiting(count);
    }
}

impl Requests<'_, '_> {
    /// Tells the instruments what the pass that began at `started` did.
    fn record(&self, started: Instant, tokens_before: u64, stats: &StepStats) {
        let now = Instant::now();
        let pass = Pass {
            tokens: self.generated_tokens - tokens_before,
            read_bytes: stats.expert_read_bytes + stats.layer_read_bytes + stats.table_read_bytes,
            cache_hits: stats.expert_cache_hits,
            cache_misses: stats.expert_cache_misses,
            wall: now.saturating_duration_since(started),
            io_wait: stats.io_time,
            batch: self.batch.len(),
            expert_bytes: self.model.expert_memory().map_or(0, |(held, _)| held),
        };
        self.meter.record(pass, now);
    }
}

/// The request's prompt within the context, with `Started` sent; `None` when it was refused
/// (or nobody waits for it any more).
fn admission(
    ids: Vec<u32>,
    ask: &Ask,
    reply: &UnboundedSender<Piece>,
    stop: &[u32],
    context: usize,
) -> Option<Request> {
    if reply.is_closed() {
        return None;
    }
    let refuse = |error: ApiError| {
        let _ = reply.send(Piece::Refused(error));
        None
    };
    let room = context.saturating_sub(ids.len());
    let max_tokens = ask.max_tokens.unwrap_or(room);
    if room == 0 || max_tokens > room {
        return refuse(ApiError::invalid(
            "max_tokens",
            "context_length_exceeded",
            format!(
                "the prompt has {} tokens and {} more were asked for; this server's context is {} tokens a request (--context)",
                ids.len(),
                ask.max_tokens
                    .map_or("at least one".to_string(), |m| m.to_string()),
                context
            ),
        ));
    }
    reply
        .send(Piece::Started {
            prompt_tokens: ids.len(),
        })
        .ok()?;
    Some(Request {
        prompt: ids,
        max_tokens,
        sampling: ask.sampling,
        stop: stop.to_vec(),
    })
}

/// What a sequence's event means for its client.
enum Outcome {
    /// It goes on.
    Going,
    /// Its client went away.
    Gone,
    /// It ended, for this reason.
    Done(Finish),
}

/// A sequence's event turned into text for its client; false when the sequence is to end here
/// (its client went away, or a stop sequence ended it).
fn hear(live: &mut HashMap<u64, Live>, generated_tokens: &mut u64, id: u64, event: Event) -> bool {
    let Some(sequence) = live.get_mut(&id) else {
        return false;
    };
    let outcome = match event {
        Event::Token(token) => {
            *generated_tokens += 1;
            let new = sequence.shown.push(token).unwrap_or_default();
            let (piece, stopped) = sequence.text.push_text(&new);
            let sent = piece.is_empty() || sequence.reply.send(Piece::Text(piece)).is_ok();
            match (sent && !sequence.reply.is_closed(), stopped) {
                (false, _) => Outcome::Gone,
                (true, Some(finish)) => Outcome::Done(finish),
                (true, None) => Outcome::Going,
            }
        }
        Event::Finished(reason) => {
            // The full decode may extend what was shown (a character completed by the last
            // token); what a tokenizer rewrote in a tail already sent stays as it was sent.
            let full = sequence.shown.decoded().unwrap_or_default();
            let rest = full
                .strip_prefix(sequence.shown.shown())
                .unwrap_or_default();
            let (mut piece, stopped) = sequence.text.push_text(rest);
            if stopped.is_none() {
                piece.push_str(&sequence.text.finish());
            }
            if !piece.is_empty() {
                let _ = sequence.reply.send(Piece::Text(piece));
            }
            Outcome::Done(stopped.unwrap_or(match reason {
                StopReason::EndOfSequence => Finish::Stop,
                StopReason::MaxTokens | StopReason::ContextFull => Finish::Length,
            }))
        }
    };
    if let Outcome::Going = outcome {
        return true;
    }
    if let (Outcome::Done(finish), Some(sequence)) = (outcome, live.remove(&id)) {
        let _ = sequence.reply.send(Piece::Done {
            finish,
            completion_tokens: sequence.shown.ids().len(),
        });
    }
    false
}
