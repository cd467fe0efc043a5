//! The HTTP layer dormouse and minirun serve through: a listener loop with the limits a
//! server facing untrusted clients needs ([`server`]), the requests it answers at all ([`access`]), OpenAI-shaped errors ([`api_error`]),
//! generated text released around stop sequences ([`text_stream`]), the decode thread's
//! admission and stepping loop ([`decode_thread`]), and the pieces every
//! generating server needs: its listening flags and request seeds ([`lifecycle`]), and shutting
//! down on a signal ([`signal`]), and the page served at `/` ([`page`]). What is served (models, requests, sampling) stays with each program.

pub mod access;
pub mod api_error;
pub mod decode_thread;
pub mod lifecycle;
pub mod page;
pub mod requests;
pub mod server;
pub mod signal;
pub mod text_stream;

pub use access::Access;
pub use api_error::ApiError;
pub use lifecycle::ListenArgs;
pub use server::{BindError, Limits, bind, serve, serve_until_signal};
pub use text_stream::{Finish, TextStream};
