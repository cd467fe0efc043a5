//! The end of a server's life: SIGTERM or Ctrl-C, said on stderr so the person who pressed it
//! knows requests in flight are being finished rather than dropped.

/// Completes on SIGTERM or Ctrl-C, saying so on stderr (`program: shutting down ...`).
pub async fn shutdown_signal(program: &'static str) {
    let interrupt = tokio::signal::ctrl_c();
    #[cfg(unix)]
    let terminate = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut s) => {
                s.recv().await;
            }
            Err(_) => std::future::pending::<()>().await,
        }
    };
    #[cfg(not(unix))]
    let terminate = std::future::pending::<()>();
    tokio::select! {
        _ = interrupt => {},
        () = terminate => {},
    }
    eprintln!("{program}: shutting down (finishing requests in flight)");
}
