//! The decode thread of `minirun serve`: it owns the opened artifact and its model, takes
//! requests from the HTTP handlers, runs the prompts of requests that arrive together as the
//! rows of shared passes, and decodes every admitted request together, one batched step for all
//! of them ([`Batch`]), so that a weight (a streamed layer, an expert) is read once per pass
//! however many requests are being answered. Each request gets exactly the
//! tokens `minirun run` gives it alone; its text goes back piece by piece as it becomes final.

use std::collections::{HashMap, VecDeque};
use std::sync::mpsc::Receiver;

use http_serve::{ApiError, Finish, TextStream};
use minirun_runtime::batch::{Batch, Event, Request};
use minirun_runtime::generate::StopReason;
use minirun_runtime::model::Model;
use minirun_runtime::session::{IncrementalText, Session};
use minirun_runtime::step::StepStats;
use tokio::sync::mpsc::UnboundedSender;

use crate::serve_requests::{Ask, Prompt};

/// A request on its way to the decode thread, with where its pieces go.
pub struct Job {
    pub ask: Ask,
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

/// Runs until `jobs` closes and every request taken has ended.
pub fn run(session: &Session, model: &Model, jobs: &Receiver<Job>, limits: Limits) -> Summary {
    let stop = session.stop_ids();
    let mut batch = Batch::new(model);
    let mut waiting: VecDeque<Job> = VecDeque::new();
    let mut live: HashMap<u64, Live> = HashMap::new();
    let mut summary = Summary::default();
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
        let mut arriving = Vec::new();
        while batch.len() + arriving.len() < limits.max_concurrent
            && let Some(job) = waiting.pop_front()
        {
            let id = summary.requests;
            summary.requests += 1;
            let Some(request) = admission(session, &job, &stop, limits) else {
                continue;
            };
            live.insert(
                id,
                Live {
                    reply: job.reply,
                    shown: IncrementalText::new(&session.text),
                    text: TextStream::new(job.ask.stops),
                },
            );
            arriving.push((id, request));
        }
        if !arriving.is_empty() {
            // Requests that arrived together share their prompts' passes.
            let mut stats = StepStats::default();
            let mut heard = |id, event| hear(session, &mut live, &mut summary, id, event);
            for (id, error) in batch.admit_all(arriving, &mut stats, &mut heard) {
                if let Some(gone) = live.remove(&id) {
                    let _ = gone.reply.send(Piece::Failed(error.to_string()));
                }
            }
        }
        if batch.is_empty() {
            if !open && waiting.is_empty() {
                return summary;
            }
            continue;
        }
        summary.steps += 1;
        summary.step_rows += batch.len() as u64;
        let mut stats = StepStats::default();
        let mut heard = |id, event| hear(session, &mut live, &mut summary, id, event);
        if let Err(failed) = batch.step(&mut stats, &mut heard) {
            for id in failed.ids {
                if let Some(gone) = live.remove(&id) {
                    let _ = gone.reply.send(Piece::Failed(failed.error.to_string()));
                }
            }
        }
    }
}

/// The request's prompt as ids within the context, with `Started` sent; `None` when it was
/// refused (or nobody waits for it any more).
fn admission(session: &Session, job: &Job, stop: &[u32], limits: Limits) -> Option<Request> {
    if job.reply.is_closed() {
        return None;
    }
    let refuse = |error: ApiError| {
        let _ = job.reply.send(Piece::Refused(error));
        None
    };
    let ids = match &job.ask.prompt {
        Prompt::Text(text) => session.prompt_ids(text, false),
        Prompt::Chat(messages) => session.text.conversation_ids(messages).map_err(Into::into),
    };
    let ids = match ids {
        Ok(ids) => ids,
        Err(e) => {
            return refuse(ApiError::invalid(
                "prompt",
                "invalid_prompt",
                format!("the prompt cannot be tokenized: {e}"),
            ));
        }
    };
    let room = limits.context.saturating_sub(ids.len());
    let max_tokens = job.ask.max_tokens.unwrap_or(room);
    if room == 0 || max_tokens > room {
        return refuse(ApiError::invalid(
            "max_tokens",
            "context_length_exceeded",
            format!(
                "the prompt has {} tokens and {} more were asked for; this server's context is {} tokens a request (--context)",
                ids.len(),
                job.ask
                    .max_tokens
                    .map_or("at least one".to_string(), |m| m.to_string()),
                limits.context
            ),
        ));
    }
    job.reply
        .send(Piece::Started {
            prompt_tokens: ids.len(),
        })
        .ok()?;
    Some(Request {
        prompt: ids,
        max_tokens,
        sampling: job.ask.sampling,
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
fn hear(
    session: &Session,
    live: &mut HashMap<u64, Live>,
    summary: &mut Summary,
    id: u64,
    event: Event,
) -> bool {
    let Some(sequence) = live.get_mut(&id) else {
        return false;
    };
    let outcome = match event {
        Event::Token(token) => {
            summary.generated_tokens += 1;
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
            let full = session
                .text
                .decode(sequence.shown.ids())
                .unwrap_or_default();
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
