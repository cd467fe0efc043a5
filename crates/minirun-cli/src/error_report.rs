//! An error and its causes as one line, each said once. Many of the workspace's errors carry
//! their cause's text in their own message (so that they read whole when shown alone) and also
//! return it as their `source()`; printing the chain as it is (`{:#}`) then repeats a path or
//! an OS error two or three times.

/// `err`'s chain joined with ": ", leaving out a cause whose text the line already holds.
pub fn one_line(err: &anyhow::Error) -> String {
    let mut line = String::new();
    for cause in err.chain() {
        let text = cause.to_string();
        if text.is_empty() || line.contains(&text) {
            continue;
        }
        if !line.is_empty() {
            line.push_str(": ");
        }
        line.push_str(&text);
    }
    line
}

#[cfg(test)]
mod tests {
    use anyhow::Context;

    use super::one_line;

    #[derive(Debug, thiserror::Error)]
    #[error("{path}: {source}")]
    struct Unreadable {
        path: String,
        #[source]
        source: std::io::Error,
    }

    #[test]
    fn a_cause_already_in_the_message_is_said_once_and_others_are_kept() {
        let io = std::io::Error::new(std::io::ErrorKind::NotFound, "No such file or directory");
        let err = Err::<(), _>(Unreadable {
            path: "model/config.json".into(),
            source: io,
        })
        .context("cannot pack model into out")
        .unwrap_err();
        assert_eq!(
            format!("{err:#}"),
            "cannot pack model into out: model/config.json: No such file or directory: No such file or directory"
        );
        assert_eq!(
            one_line(&err),
            "cannot pack model into out: model/config.json: No such file or directory"
        );
    }
}
