//! `dormouse serve`: an OpenAI-compatible HTTP server for one `.dmexp` model.

use std::convert::Infallible;
use std::ops::ControlFlow;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use anyhow::Result;
use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::{DefaultBodyLimit, State};
use axum::http::{Method, Uri};
use axum::response::sse::{Event, Sse};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use candle_core::Device;
use dormouse::Dormouse;
use dormouse::sample::{Sampler, generate};
use dormouse::serving::load_export;
use serde_json::{Value, json};
use tokio::sync::{Semaphore, mpsc};
use tokio_stream::wrappers::ReceiverStream;

use http_serve::api_error::{body_refused, method_not_allowed, no_route, rejected_body};
use http_serve::lifecycle::{SetOnDrop, positive_seconds, request_seed, unix_now};
use http_serve::{ApiError, Finish, Limits, TextStream};

use crate::completions::{Job, MAX_BODY_BYTES, parse_request};

#[derive(clap::Args)]
#[command(
    about = "Serve a dormouse .dmexp export over an OpenAI-compatible HTTP API",
    after_help = "Routes: GET /health, GET /v1/models, POST /v1/completions (stream: true for SSE).
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
    /// Port to listen on (0: any free port, printed at start).
    #[arg(long, default_value_t = 8000)]
    port: u16,
    /// Address to listen on.
    #[arg(long, default_value = "127.0.0.1")]
    host: String,
    /// Completions generated at once; more wait their turn.
    #[arg(long, default_value_t = 64)]
    max_concurrent: usize,
    /// Seconds a client has to send its request line and headers; a connection still sending
    /// them after that is closed (a client holding connections open half-sent is cut off).
    #[arg(long, default_value_t = 10.0, value_parser = positive_seconds)]
    header_timeout: f64,
    /// Seconds a client has to send its request body; after that the request gets 408.
    #[arg(long, default_value_t = 30.0, value_parser = positive_seconds)]
    body_timeout: f64,
    /// Seconds requests in flight may take to finish after SIGTERM or Ctrl-C; then the server
    /// exits anyway (status 0; it says how many connections it cut off).
    #[arg(long, default_value_t = 30.0, value_parser = positive_seconds)]
    shutdown_grace: f64,
}

struct AppState {
    model: Arc<Dormouse>,
    model_id: String,
    created: u64,
    requests: AtomicU64,
    running: Arc<Semaphore>,
}

pub fn main(args: Args) -> ExitCode {
    let runtime = match tokio::runtime::Runtime::new() {
        Ok(r) => r,
        Err(e) => {
            eprintln!("serve: cannot start the async runtime: {e}");
            return ExitCode::from(1);
        }
    };
    match runtime.block_on(run(args)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("serve: {e:#}");
            ExitCode::from(1)
        }
    }
}

async fn run(args: Args) -> Result<()> {
    let served = load_export(&args.export, &Device::Cpu)?;
    let model_id = args
        .export
        .file_stem()
        .map_or_else(|| "dormouse".into(), |s| s.to_string_lossy().into_owned());
    let state = Arc::new(AppState {
        model: Arc::new(served.model),
        model_id,
        created: unix_now(),
        requests: AtomicU64::new(0),
        running: Arc::new(Semaphore::new(args.max_concurrent.max(1))),
    });
    let app = Router::new()
        .route("/health", get(health))
        .route("/v1/models", get(models))
        .route("/v1/completions", post(completions))
        .fallback(not_found)
        .method_not_allowed_fallback(method_not_allowed)
        .layer(DefaultBodyLimit::max(MAX_BODY_BYTES))
        .with_state(state.clone());
    let listener = http_serve::bind(&args.host, args.port).await?;
    let bound = listener.local_addr()?;
    eprintln!(
        "serving {} ({} params, {}) on http://{bound}/v1 (Ctrl-C to stop)",
        state.model_id,
        served.header.num_params,
        served.header.dtype.name()
    );
    let limits = Limits {
        header_timeout: Duration::from_secs_f64(args.header_timeout),
        body_timeout: Duration::from_secs_f64(args.body_timeout),
        grace: Duration::from_secs_f64(args.shutdown_grace),
        max_body: MAX_BODY_BYTES,
        refuse: body_refused,
    };
    http_serve::serve_until_signal(listener, app, limits, "serve").await;
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
        "GET /health, GET /v1/models, POST /v1/completions",
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

/// One piece of a completion as the generating thread reports it.
enum Piece {
    Text(String),
    Done(Finish, usize),
    Failed(String),
}

/// Generates `job` on a blocking thread, reporting pieces through `send` (which returns
/// false once nobody listens: the generation then stops).
fn run_job(model: &Dormouse, job: &Job, mut send: impl FnMut(Piece) -> bool) {
    let mut text = TextStream::new(job.stops.clone());
    let mut finish = Finish::Length;
    let mut listening = true;
    let result = generate(
        model,
        &job.prompt,
        job.max_tokens,
        &mut Sampler::new(job.sampling),
        |byte| {
            let (piece, stop) = text.push(byte);
            if !piece.is_empty() && !send(Piece::Text(piece)) {
                listening = false;
                return ControlFlow::Break(());
            }
            match stop {
                Some(f) => {
                    finish = f;
                    ControlFlow::Break(())
                }
                None => ControlFlow::Continue(()),
            }
        },
    );
    if !listening {
        return;
    }
    if let Err(e) = result {
        send(Piece::Failed(e.to_string()));
        return;
    }
    if finish == Finish::Length {
        let rest = text.finish();
        if !rest.is_empty() && !send(Piece::Text(rest)) {
            return;
        }
    }
    send(Piece::Done(finish, text.bytes()));
}

fn usage(prompt: usize, completion: usize) -> Value {
    json!({ "prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion })
}

fn server_error(message: String) -> Response {
    ApiError::server("generation_failed", message).into_response()
}

async fn whole_completion(state: Arc<AppState>, job: Job, id: String) -> Response {
    // The permit moves into the generating thread, so it is held for as long as generation
    // runs; the guard tells that thread when the client has gone (axum drops this future).
    let Ok(permit) = state.running.clone().acquire_owned().await else {
        return server_error("the server is shutting down".into());
    };
    let gone = Arc::new(AtomicBool::new(false));
    let _on_disconnect = SetOnDrop(gone.clone());
    let model = state.model.clone();
    let prompt_len = job.prompt.len();
    let outcome = tokio::task::spawn_blocking(move || {
        let _permit = permit;
        let mut pieces = Vec::new();
        run_job(&model, &job, |p| {
            pieces.push(p);
            !gone.load(Ordering::Relaxed)
        });
        pieces
    })
    .await;
    let pieces = match outcome {
        Ok(p) => p,
        Err(e) => return server_error(format!("the generation thread failed: {e}")),
    };
    let mut text = String::new();
    for piece in pieces {
        match piece {
            Piece::Text(t) => text.push_str(&t),
            Piece::Failed(e) => return server_error(e),
            Piece::Done(finish, bytes) => {
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

async fn stream_completion(state: Arc<AppState>, job: Job, id: String) -> Response {
    let (events, receiver) = mpsc::channel::<std::result::Result<Event, Infallible>>(64);
    tokio::spawn(async move {
        let Ok(_permit) = state.running.clone().acquire_owned().await else {
            return;
        };
        let model = state.model.clone();
        let worker_state = state.clone();
        let _ = tokio::task::spawn_blocking(move || {
            run_job(&model, &job, |piece| {
                let event = match piece {
                    Piece::Text(t) => chunk(&worker_state, &id, &t, None),
                    Piece::Done(finish, _) => {
                        let last = chunk(&worker_state, &id, "", Some(finish));
                        return events.blocking_send(Ok(last)).is_ok()
                            && events
                                .blocking_send(Ok(Event::default().data("[DONE]")))
                                .is_ok();
                    }
                    Piece::Failed(e) => {
                        let error = ApiError::server("generation_failed", e);
                        Event::default().data(error.to_json().to_string())
                    }
                };
                events.blocking_send(Ok(event)).is_ok()
            });
        })
        .await;
    });
    Sse::new(ReceiverStream::new(receiver)).into_response()
}
