//! `minirun serve`: an OpenAI-compatible HTTP server for one artifact, under a memory budget,
//! decoding concurrent requests as one batch (see `serve_engine`).

mod engine;
mod memory;
mod meter;
mod prompt;
mod requests;

use std::convert::Infallible;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc;

use anyhow::{Context, Result, anyhow};
use axum::Json;
use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::{DefaultBodyLimit, State};
use axum::http::{Method, Uri};
use axum::response::sse::{Event, Sse};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use http_serve::api_error::{method_not_allowed, no_route, rejected_body};
use http_serve::lifecycle::{request_seed, unix_now};
use http_serve::page::{About, ChatMode};
use http_serve::{Access, ApiError, Finish, ListenArgs};
use minirun_runtime::{PlannedRun, RunRequest, Session, Trust};
use minirun_stream::budget::{Budget, available_memory};
use minirun_text::Text;
use serde_json::{Value, json};
use tokio::sync::mpsc::{UnboundedReceiver, unbounded_channel};
use tokio_stream::wrappers::ReceiverStream;

use engine::{Job, Piece};
use memory::Dial;
use meter::{Meter, Planned};
use requests::{Ask, MAX_BODY_BYTES};

const ROUTES: &str = "GET / (the page), GET /health, GET /v1/models, POST /v1/completions, POST /v1/chat/completions, GET /api/about, GET /api/memory, GET /api/instruments";

#[derive(clap::Args)]
pub struct ServeArgs {
    /// The artifact directory (written by `minirun pack` or `minirun download`).
    artifact: PathBuf,
    #[command(flatten)]
    listen: ListenArgs,
    /// Memory the server may use, as `minirun run --budget` takes it (2GiB, floor, balanced,
    /// generous). The plan counts the caches of --max-concurrent requests of --context tokens.
    /// Default: generous, refused if that is more than the memory available.
    #[arg(long, value_name = "BYTES|PRESET")]
    budget: Option<Budget>,
    /// Requests decoded together; more wait their turn.
    #[arg(long, default_value_t = 16, value_parser = clap::value_parser!(u16).range(1..=256))]
    max_concurrent: u16,
    /// Tokens (prompt and completion) one request may have; a request asking for more is
    /// refused with context_length_exceeded. Default: 4096, or the model's
    /// max_position_embeddings when smaller.
    #[arg(long, value_name = "TOKENS", value_parser = clap::value_parser!(u32).range(1..))]
    context: Option<u32>,
    #[command(flatten)]
    reads: crate::run::expert_reads::ExpertReads,
    /// Serve without verification evidence (the startup lines and /v1/models say so).
    #[arg(long)]
    unverified: bool,
    #[command(flatten)]
    pub threads: crate::threads::Threads,
}

struct AppState {
    jobs: mpsc::Sender<Job>,
    /// The artifact's tokenizer: prompts are tokenized by their handlers, off the decode thread.
    text: Arc<Text>,
    /// Tokens a request may hold, prompt and completion.
    context: usize,
    model_id: String,
    verified: bool,
    created: u64,
    requests: AtomicU64,
    about: About,
    dial: Dial,
    meter: Arc<Meter>,
}

/// What the decode thread reports once the model is built.
struct Ready {
    lines: Vec<String>,
    text: Arc<Text>,
    context: usize,
    provenance: String,
    dial: Dial,
    meter: Arc<Meter>,
}

pub fn serve(args: &ServeArgs) -> Result<ExitCode> {
    let access = args.listen.access()?;
    let model_id = args
        .artifact
        .file_name()
        .map(|s| s.to_string_lossy().into_owned())
        .ok_or_else(|| anyhow!("{} names no directory", crate::shown(&args.artifact)))?;
    let (jobs, taken) = mpsc::channel::<Job>();
    let (ready_tx, ready_rx) = mpsc::channel::<Result<Ready>>();
    let engine = spawn_engine(args, taken, ready_tx)?;
    let ready = match ready_rx.recv() {
        Ok(ready) => ready?,
        Err(_) => {
            return Err(anyhow!(
                "the decode thread ended before the model was built"
            ));
        }
    };
    let mark = if args.unverified { "[UNVERIFIED] " } else { "" };
    for line in &ready.lines {
        eprintln!("{mark}{line}");
    }
    let about = About {
        program: "minirun",
        model: model_id.clone(),
        mode: ChatMode::Chat,
        verified: !args.unverified,
        provenance: ready.provenance,
        details: by_name(ready.lines, &args.artifact, &model_id),
        dial: true,
        instruments: true,
        max_tokens: ready.context,
        context: Some(ready.context),
        max_concurrent: usize::from(args.max_concurrent),
    };
    let state = Arc::new(AppState {
        jobs,
        text: ready.text,
        context: ready.context,
        model_id,
        verified: !args.unverified,
        created: unix_now(),
        requests: AtomicU64::new(0),
        about,
        dial: ready.dial,
        meter: ready.meter,
    });
    let runtime = tokio::runtime::Runtime::new().context("cannot start the async runtime")?;
    let listened = runtime.block_on(listen(args, access, state));
    // Dropping the runtime drops every handler still waiting (their connections were cut off
    // after the grace), and with them the last senders: the decode thread then ends.
    drop(runtime);
    listened?;
    match engine.join() {
        Ok(summary) => eprintln!(
            "serve: {} requests, {} tokens generated in {} batched steps (mean batch {:.2})",
            summary.requests,
            summary.generated_tokens,
            summary.steps,
            summary.step_rows as f64 / summary.steps.max(1) as f64
        ),
        Err(_) => return Err(anyhow!("the decode thread panicked")),
    }
    Ok(ExitCode::SUCCESS)
}

/// Opens the artifact and builds its model on the decode thread (the model borrows the
/// session, so both live there), reports `Ready`, then decodes until the jobs close; the
/// decoding runs on a worker of the pool (`threads::on_pool`).
fn spawn_engine(
    args: &ServeArgs,
    taken: mpsc::Receiver<Job>,
    ready: mpsc::Sender<Result<Ready>>,
) -> Result<std::thread::JoinHandle<engine::Summary>> {
    let path = args.artifact.clone();
    let trust = match args.unverified {
        true => Trust::Unverified,
        false => Trust::Verified(minirun_store::SealKey::existing_for_user()?),
    };
    let (budget, reads) = (args.budget, args.reads);
    // What clients see names the artifact, never where it lies on this machine.
    let shown_artifact = crate::shown(Path::new(args.artifact.file_name().unwrap_or_default()));
    let (max_concurrent, context) = (usize::from(args.max_concurrent), args.context);
    std::thread::Builder::new()
        .name("decode".into())
        .spawn(move || {
            crate::threads::on_pool(move || {
                let mut session = match Session::open(&path, trust) {
                    Ok(s) => s,
                    Err(e) => {
                        let _ = ready.send(Err(e.into()));
                        return engine::Summary::default();
                    }
                };
                let max_positions = session.architecture.max_positions();
                let context = context.map_or(max_positions.min(4096), |c| c as usize);
                let planned = plan_serving(
                    &mut session,
                    reads.request(budget, context.saturating_mul(max_concurrent)),
                    (context, max_concurrent, max_positions),
                );
                let built = planned.and_then(|(run, lines)| {
                    let model = session.run_model(&run)?;
                    Ok((model, run.plan, run.weights, lines))
                });
                let (model, meter) = match built {
                    Ok((model, plan, weights, lines)) => {
                        let tokens = context.saturating_mul(max_concurrent);
                        let dial = memory::dial(
                            &session,
                            &weights,
                            &plan,
                            tokens,
                            &shown_artifact,
                            available_memory(),
                        );
                        let meter = Arc::new(Meter::new(Planned {
                            budget: plan.budget,
                            resident_bytes: plan.resident_bytes + plan.held_bytes,
                            read_per_token: plan.read_per_token(),
                        }));
                        let _ = ready.send(Ok(Ready {
                            lines,
                            text: session.text.clone(),
                            context,
                            provenance: session.artifact.provenance.clone(),
                            dial,
                            meter: meter.clone(),
                        }));
                        (model, meter)
                    }
                    Err(e) => {
                        let _ = ready.send(Err(e));
                        return engine::Summary::default();
                    }
                };
                let limits = engine::Limits {
                    max_concurrent,
                    context,
                };
                engine::run(&session, &model, &taken, limits, &meter)
            })
        })
        .context("cannot start the decode thread")
}

/// The run `request` asks for, refused when a request's context is more than the model's
/// positions, and the lines that say what it is.
fn plan_serving(
    session: &mut Session,
    request: RunRequest,
    (context, max_concurrent, max_positions): (usize, usize, usize),
) -> Result<(PlannedRun, Vec<String>)> {
    if context > max_positions {
        return Err(anyhow!(
            "--context {context} is more than the model's max_position_embeddings {max_positions}"
        ));
    }
    let run = session.plan_request(&request)?;
    let mut lines = session.header();
    lines.extend(run.plan.describe());
    lines.push(format!(
        "up to {max_concurrent} requests of at most {context} tokens decode together; each step reads every weight once for all of them"
    ));
    Ok((run, lines))
}

/// The lines for clients, with the artifact's path replaced by its name: where it lies on this
/// machine is the operator's business.
fn by_name(lines: Vec<String>, artifact: &Path, name: &str) -> Vec<String> {
    let given = artifact.display().to_string();
    let canonical = artifact
        .canonicalize()
        .ok()
        .map(|p| p.display().to_string());
    lines
        .into_iter()
        .map(|line| {
            let line = line.replace(&given, name);
            match &canonical {
                Some(path) => line.replace(path, name),
                None => line,
            }
        })
        .collect()
}

async fn listen(args: &ServeArgs, access: Access, state: Arc<AppState>) -> Result<()> {
    let app = http_serve::page::routes()
        .route("/api/about", get(about))
        .route("/api/memory", get(memory))
        .route("/api/instruments", get(instruments))
        .route("/health", get(health))
        .route("/v1/models", get(models))
        .route("/v1/completions", post(completions))
        .route("/v1/chat/completions", post(chat_completions))
        .fallback(not_found)
        .method_not_allowed_fallback(method_not_allowed)
        .layer(DefaultBodyLimit::max(MAX_BODY_BYTES))
        .with_state(state.clone());
    let listener = http_serve::bind(&args.listen.host, args.listen.port).await?;
    let bound = listener.local_addr()?;
    eprintln!(
        "serving {} on http://{bound}/v1, its page on http://{bound}/ (Ctrl-C to stop)",
        state.model_id
    );
    let limits = args.listen.limits(MAX_BODY_BYTES);
    drop(state);
    http_serve::serve_until_signal(listener, app, (limits, access), "serve").await;
    Ok(())
}

async fn about(State(state): State<Arc<AppState>>) -> Json<About> {
    Json(state.about.clone())
}

async fn memory(State(state): State<Arc<AppState>>) -> Json<Dial> {
    Json(state.dial.clone())
}

async fn instruments(State(state): State<Arc<AppState>>) -> Response {
    Json(state.meter.snapshot(std::time::Instant::now())).into_response()
}

async fn health() -> Json<Value> {
    Json(json!({ "status": "ok" }))
}

async fn models(State(state): State<Arc<AppState>>) -> Json<Value> {
    Json(json!({
        "object": "list",
        "data": [{
            "id": state.model_id,
            "object": "model",
            "created": state.created,
            "owned_by": "minirun",
            "verified": state.verified,
        }],
    }))
}

async fn not_found(method: Method, uri: Uri) -> Response {
    no_route(&method, &uri, ROUTES)
}

/// The two kinds of answer: they differ only in their JSON shapes.
#[derive(Debug, Clone, Copy)]
enum Kind {
    Completion,
    Chat,
}

async fn completions(
    State(state): State<Arc<AppState>>,
    body: Result<Bytes, BytesRejection>,
) -> Response {
    answer(state, body, Kind::Completion).await
}

async fn chat_completions(
    State(state): State<Arc<AppState>>,
    body: Result<Bytes, BytesRejection>,
) -> Response {
    answer(state, body, Kind::Chat).await
}

async fn answer(state: Arc<AppState>, body: Result<Bytes, BytesRejection>, kind: Kind) -> Response {
    let body = match body {
        Ok(body) => body,
        Err(rejection) => return rejected_body(rejection, MAX_BODY_BYTES),
    };
    let number = state.requests.fetch_add(1, Ordering::Relaxed);
    let seed = request_seed(number);
    let parsed = match kind {
        Kind::Completion => requests::completion(&body, &state.model_id, seed),
        Kind::Chat => requests::chat(&body, &state.model_id, seed),
    };
    let ask: Ask = match parsed {
        Ok(ask) => ask,
        Err(e) => return e.into_response(),
    };
    let stream = ask.stream;
    let prompt_ids =
        match prompt::prompt_ids(state.text.clone(), ask.prompt.clone(), state.context).await {
            Ok(ids) => ids,
            Err(e) => return e.into_response(),
        };
    let (reply, mut pieces) = unbounded_channel();
    let job = Job {
        ask,
        prompt_ids,
        reply,
    };
    if state.jobs.send(job).is_err() {
        return ApiError::server("shutting_down", "the server is shutting down").into_response();
    }
    let prompt_tokens = match pieces.recv().await {
        Some(Piece::Started { prompt_tokens }) => prompt_tokens,
        Some(Piece::Refused(e)) => return e.into_response(),
        Some(Piece::Failed(e)) => return ApiError::server("generation_failed", e).into_response(),
        _ => {
            return ApiError::server("generation_failed", "the decode thread dropped the request")
                .into_response();
        }
    };
    let answer = Answer {
        id: format!(
            "{}-{}-{number}",
            match kind {
                Kind::Completion => "cmpl",
                Kind::Chat => "chatcmpl",
            },
            state.created
        ),
        model: state.model_id.clone(),
        kind,
    };
    match stream {
        true => answer.streamed(pieces),
        false => answer.whole(pieces, prompt_tokens).await,
    }
}

/// One request's answer being put together.
struct Answer {
    id: String,
    model: String,
    kind: Kind,
}

impl Answer {
    async fn whole(self, mut pieces: UnboundedReceiver<Piece>, prompt_tokens: usize) -> Response {
        let mut text = String::new();
        while let Some(piece) = pieces.recv().await {
            match piece {
                Piece::Text(t) => text.push_str(&t),
                Piece::Failed(e) => {
                    return ApiError::server("generation_failed", e).into_response();
                }
                Piece::Done {
                    finish,
                    completion_tokens,
                } => {
                    let usage = json!({
                        "prompt_tokens": prompt_tokens,
                        "completion_tokens": completion_tokens,
                        "total_tokens": prompt_tokens + completion_tokens,
                    });
                    return Json(self.whole_json(&text, finish, usage)).into_response();
                }
                Piece::Started { .. } | Piece::Refused(_) => {}
            }
        }
        ApiError::server("generation_failed", "the generation ended without a result")
            .into_response()
    }

    fn whole_json(&self, text: &str, finish: Finish, usage: Value) -> Value {
        let choice = match self.kind {
            Kind::Completion => json!({
                "text": text, "index": 0, "logprobs": null, "finish_reason": finish.as_str(),
            }),
            Kind::Chat => json!({
                "index": 0,
                "message": { "role": "assistant", "content": text },
                "logprobs": null,
                "finish_reason": finish.as_str(),
            }),
        };
        json!({
            "id": self.id,
            "object": match self.kind {
                Kind::Completion => "text_completion",
                Kind::Chat => "chat.completion",
            },
            "created": unix_now(),
            "model": self.model,
            "choices": [choice],
            "usage": usage,
        })
    }

    /// One SSE event per piece, the finish reason in the last chunk, then `[DONE]`. A client
    /// that goes away closes the event stream; the forwarding task then ends, and with it the
    /// decode thread's channel, which ends the sequence.
    fn streamed(self, mut pieces: UnboundedReceiver<Piece>) -> Response {
        let (events, receiver) = tokio::sync::mpsc::channel::<Result<Event, Infallible>>(64);
        tokio::spawn(async move {
            if let Kind::Chat = self.kind {
                let first = self.chunk_json(Some(""), true, None);
                if events.send(Ok(data(&first))).await.is_err() {
                    return;
                }
            }
            while let Some(piece) = pieces.recv().await {
                let event = match piece {
                    Piece::Text(t) => data(&self.chunk_json(Some(&t), false, None)),
                    Piece::Done { finish, .. } => {
                        let last = data(&self.chunk_json(None, false, Some(finish)));
                        let _ = events.send(Ok(last)).await;
                        let _ = events.send(Ok(Event::default().data("[DONE]"))).await;
                        return;
                    }
                    Piece::Failed(e) => {
                        let error = ApiError::server("generation_failed", e).to_json();
                        let _ = events.send(Ok(data(&error))).await;
                        return;
                    }
                    Piece::Started { .. } | Piece::Refused(_) => continue,
                };
                if events.send(Ok(event)).await.is_err() {
                    return;
                }
            }
        });
        Sse::new(ReceiverStream::new(receiver)).into_response()
    }

    fn chunk_json(&self, text: Option<&str>, first: bool, finish: Option<Finish>) -> Value {
        let finish = finish.map(Finish::as_str);
        let choice = match self.kind {
            Kind::Completion => json!({
                "text": text.unwrap_or(""), "index": 0, "logprobs": null, "finish_reason": finish,
            }),
            Kind::Chat => {
                let delta = match (first, text) {
                    (true, _) => json!({ "role": "assistant", "content": "" }),
                    (false, Some(t)) => json!({ "content": t }),
                    (false, None) => json!({}),
                };
                json!({ "index": 0, "delta": delta, "logprobs": null, "finish_reason": finish })
            }
        };
        json!({
            "id": self.id,
            "object": match self.kind {
                Kind::Completion => "text_completion",
                Kind::Chat => "chat.completion.chunk",
            },
            "created": unix_now(),
            "model": self.model,
            "choices": [choice],
        })
    }
}

fn data(value: &Value) -> Event {
    Event::default().data(value.to_string())
}
