//! `dormouse serve`: an OpenAI-compatible HTTP server for one `.dmexp` model.

use std::convert::Infallible;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use anyhow::{Context, Result, anyhow};
use axum::Json;
use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::{DefaultBodyLimit, State};
use axum::http::{Method, Uri};
use axum::response::sse::{Event, Sse};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use candle_core::Device;
use dormouse::serving::load_export;
use serde_json::{Value, json};
use tokio::sync::mpsc::{self, UnboundedReceiver, unbounded_channel};
use tokio_stream::wrappers::ReceiverStream;

use http_serve::api_error::{method_not_allowed, no_route, rejected_body};
use http_serve::lifecycle::{request_seed, unix_now};
use http_serve::page::{About, ChatMode};
use http_serve::{Access, ApiError, Finish, ListenArgs};

use crate::completions::{Job, MAX_BODY_BYTES, MAX_TOKENS_LIMIT, parse_request};
use crate::serve_engine::{self, Piece, Queued};

#[derive(clap::Args)]
#[command(
    about = "Serve a dormouse .dmexp export over an OpenAI-compatible HTTP API",
    after_help = "Routes: GET / (a page to talk to the model), GET /health, GET /v1/models, POST /v1/completions (stream: true for SSE), GET /api/about.
One token is one byte. See docs/serve.md.

Example:
  dormouse serve --export checkpoints/latest.bf16.dmexp --port 8000
  curl -s localhost:8000/v1/completions -H 'content-type: application/json' \\
       -d '{\"prompt\": \"once\", \"max_tokens\": 32, \"temperature\": 0}'"
)]
pub struct Args {
    /// The .dmexp file to serve.
    #[arg(long)]
    export: PathBuf,
    #[command(flatten)]
    listen: ListenArgs,
    /// Completions decoded together, one batched step for all of them (each gets the bytes
    /// `generate` gives it alone); more wait their turn.
    #[arg(long, default_value_t = 64)]
    max_concurrent: usize,
}

struct AppState {
    jobs: std::sync::mpsc::Sender<Queued>,
    model_id: String,
    created: u64,
    requests: AtomicU64,
    about: About,
}

pub fn main(args: Args) -> ExitCode {
    match serve(args) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("serve: {}", error_line::one_line(&e));
            ExitCode::from(1)
        }
    }
}

fn serve(args: Args) -> Result<()> {
    let access = args.listen.access()?;
    let served = load_export(&args.export, &Device::Cpu)?;
    let model_id = args
        .export
        .file_stem()
        .map_or_else(|| "dormouse".into(), |s| s.to_string_lossy().into_owned());
    let banner = format!(
        "{model_id} ({} params, {})",
        served.header.num_params,
        served.header.dtype.name()
    );
    let (jobs, taken) = std::sync::mpsc::channel::<Queued>();
    let max_concurrent = args.max_concurrent.max(1);
    let about = about(&model_id, &banner, &served.header, max_concurrent);
    let model = served.model;
    let engine = std::thread::Builder::new()
        .name("decode".into())
        .spawn(move || serve_engine::run(&model, &taken, max_concurrent))
        .context("cannot start the decode thread")?;
    let state = Arc::new(AppState {
        jobs,
        model_id,
        created: unix_now(),
        requests: AtomicU64::new(0),
        about,
    });
    let runtime = tokio::runtime::Runtime::new().context("cannot start the async runtime")?;
    let listened = runtime.block_on(listen(&args, access, state, &banner));
    // Dropping the runtime drops every handler still waiting (their connections were cut off
    // after the grace), and with them the last senders: the decode thread then ends.
    drop(runtime);
    listened?;
    let summary = engine
        .join()
        .map_err(|_| anyhow!("the decode thread panicked"))?;
    eprintln!(
        "serve: {} requests, {} bytes generated in {} batched steps (mean batch {:.2})",
        summary.requests,
        summary.generated_bytes,
        summary.steps,
        summary.step_rows as f64 / summary.steps.max(1) as f64
    );
    Ok(())
}

/// What the page shows: a byte-level model has no chat template, so the page sends each turn
/// as a prompt; a dormouse export is checked (CRC, header) but no publisher vouches for it.
fn about(model_id: &str, banner: &str, header: &dmexp::Header, max_concurrent: usize) -> About {
    About {
        program: "dormouse",
        model: model_id.to_string(),
        mode: ChatMode::Completion,
        verified: false,
        provenance: "the export's payload checksum and header were checked when it was loaded; no publisher's statement covers it, so it is not verified against one".to_string(),
        details: vec![
            banner.to_string(),
            format!("exported from {} at step {}", header.source, header.step),
            "one token is one byte".to_string(),
        ],
        dial: false,
        instruments: false,
        max_tokens: MAX_TOKENS_LIMIT as usize,
        context: None,
        max_concurrent,
    }
}

async fn about_page(State(state): State<Arc<AppState>>) -> Json<About> {
    Json(state.about.clone())
}

async fn listen(args: &Args, access: Access, state: Arc<AppState>, banner: &str) -> Result<()> {
    let app = http_serve::page::routes()
        .route("/api/about", get(about_page))
        .route("/health", get(health))
        .route("/v1/models", get(models))
        .route("/v1/completions", post(completions))
        .fallback(not_found)
        .method_not_allowed_fallback(method_not_allowed)
        .layer(DefaultBodyLimit::max(MAX_BODY_BYTES))
        .with_state(state);
    let listener = http_serve::bind(&args.listen.host, args.listen.port).await?;
    let bound = listener.local_addr()?;
    eprintln!("serving {banner} on http://{bound}/v1 (Ctrl-C to stop)");
    let limits = args.listen.limits(MAX_BODY_BYTES);
    http_serve::serve_until_signal(listener, app, (limits, access), "serve").await;
    Ok(())
}

fn error_response(error: &ApiError) -> Response {
    error.clone().into_response()
}

async fn health() -> Json<Value> {
    Json(json!({ "status": "ok" }))
}

async fn models(State(state): State<Arc<AppState>>) -> Json<Value> {
    Json(json!({
        "object": "list",
        "data": [{ "id": state.model_id, "object": "model", "created": state.created, "owned_by": "dormouse" }],
    }))
}

async fn not_found(method: Method, uri: Uri) -> Response {
    no_route(
        &method,
        &uri,
        "GET / (the page), GET /health, GET /v1/models, POST /v1/completions, GET /api/about",
    )
}

async fn completions(
    State(state): State<Arc<AppState>>,
    body: Result<Bytes, BytesRejection>,
) -> Response {
    let body = match body {
        Ok(body) => body,
        Err(rejection) => return rejected_body(rejection, MAX_BODY_BYTES),
    };
    let number = state.requests.fetch_add(1, Ordering::Relaxed);
    let seed = request_seed(number);
    let job = match parse_request(&body, &state.model_id, seed) {
        Ok(job) => job,
        Err(e) => return error_response(&e),
    };
    let id = format!("cmpl-{}-{number}", state.created);
    match job.stream {
        true => stream_completion(state, job, id).await,
        false => whole_completion(state, job, id).await,
    }
}

fn usage(prompt: usize, completion: usize) -> Value {
    json!({ "prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion })
}

fn server_error(message: String) -> Response {
    ApiError::server("generation_failed", message).into_response()
}

/// Hands `job` to the decode thread; its pieces come back on the receiver. Dropping the
/// receiver (the client went away) ends the sequence.
fn queue(state: &AppState, job: Job) -> Option<UnboundedReceiver<Piece>> {
    let (reply, pieces) = unbounded_channel();
    state.jobs.send(Queued { job, reply }).ok()?;
    Some(pieces)
}

async fn whole_completion(state: Arc<AppState>, job: Job, id: String) -> Response {
    let prompt_len = job.prompt.len();
    let Some(mut pieces) = queue(&state, job) else {
        return server_error("the server is shutting down".into());
    };
    let mut text = String::new();
    while let Some(piece) = pieces.recv().await {
        match piece {
            Piece::Text(t) => text.push_str(&t),
            Piece::Failed(e) => return server_error(e),
            Piece::Done { finish, bytes } => {
                return Json(json!({
                    "id": id,
                    "object": "text_completion",
                    "created": unix_now(),
                    "model": state.model_id,
                    "choices": [{ "text": text, "index": 0, "logprobs": null, "finish_reason": finish.as_str() }],
                    "usage": usage(prompt_len, bytes),
                }))
                .into_response();
            }
        }
    }
    server_error("the generation ended without a result".into())
}

fn chunk(state: &AppState, id: &str, text: &str, finish: Option<Finish>) -> Event {
    Event::default().data(
        json!({
            "id": id,
            "object": "text_completion",
            "created": unix_now(),
            "model": state.model_id,
            "choices": [{ "text": text, "index": 0, "logprobs": null, "finish_reason": finish.map(Finish::as_str) }],
        })
        .to_string(),
    )
}

/// One SSE event per piece, the finish reason in the last chunk, then `[DONE]`. A client that
/// goes away closes the event stream; the forwarding task then ends, and with it the decode
/// thread's channel, which ends the sequence.
async fn stream_completion(state: Arc<AppState>, job: Job, id: String) -> Response {
    let Some(mut pieces) = queue(&state, job) else {
        return server_error("the server is shutting down".into());
    };
    let (events, receiver) = mpsc::channel::<std::result::Result<Event, Infallible>>(64);
    tokio::spawn(async move {
        while let Some(piece) = pieces.recv().await {
            let event = match piece {
                Piece::Text(t) => chunk(&state, &id, &t, None),
                Piece::Done { finish, .. } => {
                    let _ = events.send(Ok(chunk(&state, &id, "", Some(finish)))).await;
                    let _ = events.send(Ok(Event::default().data("[DONE]"))).await;
                    return;
                }
                Piece::Failed(e) => {
                    let error = ApiError::server("generation_failed", e);
                    let _ = events
                        .send(Ok(Event::default().data(error.to_json().to_string())))
                        .await;
                    return;
                }
            };
            if events.send(Ok(event)).await.is_err() {
                return;
            }
        }
    });
    Sse::new(ReceiverStream::new(receiver)).into_response()
}
